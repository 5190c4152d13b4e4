"""The Trainer: one training run in its folder: build, restore, step, validate, checkpoint, finish (and, with
train.evaluate_after, the evaluation). Runs without Hydra: Trainer(job, run_dir).run() with a TrainJob."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import time
import uuid
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from tqdm import tqdm

from ..checkpoint import (
    CHECKPOINT,
    atomic_file,
    atomic_write_text,
    drop_previous_checkpoint,
    load_checkpoint,
    non_finite_state,
    read_status,
    save_checkpoint,
    withdraw_checkpoint,
    write_status,
)
from ..config import TrainJob, apply_cpu_threads, autocast_dtype, resolve_device
from ..costs import ESTIMATE_AFTER_STEPS, train_estimate, trainer_plan
from ..data import prepare_data
from ..errors import TrainingDiverged, UserError
from ..eval.evaluation import evaluate_run
from ..labels import CUSTOM_MARK
from ..model import EXECUTION_FIELDS, LMConfig, TransformerLM
from ..optim import build_optimizer, build_scheduler
from ..provenance import device_name, git_commit
from ..stopping import Interrupted, StopRequest, status_after, stop_requests
from ..subjects.native import set_trained_scaling
from ..tasks import build_task
from ..tasks.stream import TaskStream, first_met, kept_path
from .distributed import rng_state, set_rng_state
from .finetune import (
    check_not_own_parent,
    check_parent_model,
    finetune_record,
    finetune_steps,
    parent_of,
    start_from_parent,
    write_record,
)
from .reuse import check_same_processes, check_same_run, diverged_error, resume_wanted
from .streams import LMStream, is_synthetic


def log_records(path: Path) -> list[tuple[str, dict]]:
    """log.jsonl's (line, record) pairs; one line where a line is not a step's record (the file is written whole, so
    only a hand edit damages it)."""
    pairs = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict) or "step" not in record:
            raise UserError(f"{path}, line {number}, is not a step's record; delete that line (or the file: the resumed "
                            f"run keeps its checkpoint's steps either way, and logs the steps it takes)")
        pairs.append((line, record))
    return pairs


class Trainer:
    """One training run in run_dir: build(), restore() when resuming, start(), then train_step() until
    the budget is spent (each step validates and checkpoints when due), finish(). Rank `rank` of
    `world` processes under DDP; rank 0 alone writes."""

    def __init__(self, job: TrainJob, run_dir: Path, rank: int = 0, world: int = 1):
        self.job, self.tc, self.run_dir = job, job.train, Path(run_dir)
        self.rank, self.world, self.is_main = rank, world, rank == 0
        self.step, self.tokens_seen, self.saved_step, self.last_val = 0, 0, None, None
        self.previous_step = None  # the step of checkpoint.previous.pt, once this process has written two checkpoints
        self.log_lines: list[str] = []
        self.wandb = None

    def run(self) -> dict:
        check_not_own_parent(self.tc.init_from, self.run_dir)
        completed = read_status(self.run_dir)["status"] == "completed"
        if completed or resume_wanted(self.tc.resume, self.run_dir):  # neither skip nor resume another config's run
            check_same_run(self.job, self.run_dir)
        if completed and self.tc.resume is not True:
            check_same_processes(self.run_dir, self.world)
            solved = read_status(self.run_dir).get("solved_at_step")
            further = "a larger train.max_steps" + (f" and a higher train.stop_at_accuracy (it reached "
                                                    f"{self.tc.stop_at_accuracy} at step {solved})" if solved else "")
            # a name the settings chose (<experiment>-custom-<digest>) changes with the budget: keep it by hand
            keep = f" and name={self.job.name}" if CUSTOM_MARK in self.job.name else ""
            print(f"{self.run_dir} is already trained (status.json says completed); skipping. Delete it to retrain, "
                  f"or add train.resume=true{keep} (with {further}) to train it further.")
            self.evaluate()
            return {"run_dir": str(self.run_dir), "skipped": True}
        # Ctrl-C or a scheduler's signal ends the step under way; then a checkpoint, status stopped (exit 130) or
        # interrupted (exit 75); a second Ctrl-C stops at once (stopped_at_once)
        with stop_requests(at_once=self.stopped_at_once) as stop:
            try:
                self.train_steps(stop)
            finally:
                # DDP's wrapper holds the process group: let go here, also where an exception's traceback keeps
                # this Trainer, so that train()'s collection frees it before the group is destroyed
                self.train_model = None
        self.finish(stop)
        return {"run_dir": str(self.run_dir), "val_ppl": self.last_val}

    def train_steps(self, stop: StopRequest) -> None:
        """Build, then resume or start (a fine-tune from its parent), and train to the last step."""
        resume = resume_wanted(self.tc.resume, self.run_dir)
        self.build()
        if resume:
            self.restore()
        elif self.tc.init_from:  # a fine-tune: the parent's weights, a fresh optimizer (training/finetune.py)
            start_from_parent(self.model, self.parent, Path(self.tc.init_from))
        self.start()
        while self.step < self.steps and not self.solved():
            if self.stop_agreed(stop):
                self.interrupt(stop)
            self.train_step()

    def build(self) -> None:
        """Data (rank 0 tokenizes and fills the cache first), model, step budget, optimizer, schedule, sampler."""
        job, tc = self.job, self.tc
        self.threads_why = apply_cpu_threads(tc.threads)[1]  # the plan line says it
        self.device = resolve_device(tc.device, "train.device")
        random.seed(job.seed), np.random.seed(job.seed), torch.manual_seed(job.seed)
        if is_synthetic(job):
            self.stream = TaskStream(build_task(job.task_name, job.task), tc, job.seed, self.rank, self.world)
        else:
            if not self.is_main:  # wait for rank 0: it tokenizes and fills the cache, which the others then read
                dist.barrier()
            data = prepare_data(job.data, job.tokenizer)
            if self.is_main and self.world > 1:
                dist.barrier()  # the cache is ready: the others go on
            self.stream = LMStream(data, tc, job.seed, self.rank, self.world)
        model_cfg = dataclasses.replace(job.model, vocab_size=self.stream.vocab_size)
        self.model = TransformerLM(model_cfg).to(self.device)  # the same init on every rank
        torch.manual_seed(job.seed + self.rank)  # dropout differs across ranks
        self.tokens_per_step = tc.batch_size * tc.grad_accum * tc.seq_len * self.world
        if tc.finetune_fraction is None:
            self.steps = int(tc.max_steps) if tc.max_tokens is None else math.ceil(tc.max_tokens / self.tokens_per_step)
        if tc.init_from:
            self.parent = parent_of(Path(tc.init_from))
            check_parent_model(self.model, self.parent, Path(tc.init_from))  # before finetune.json is written
            if tc.finetune_fraction is not None:
                self.steps = finetune_steps(tc.finetune_fraction, int(self.parent["tokens_seen"]), self.tokens_per_step)
            record = finetune_record(Path(tc.init_from), self.parent, tc.seq_len, tc.finetune_fraction or 0.0,
                                     self.steps, self.tokens_per_step, tc.finetune_scaling)
            set_trained_scaling(self.model, record)  # train.finetune_scaling: every step and every load runs it
            if self.is_main:
                write_record(self.run_dir, record)
        self.optimizer = build_optimizer(self.model, tc)
        self.scheduler = build_scheduler(self.optimizer, tc, self.steps)

    def restore(self) -> None:
        """Continue from the checkpoint: weights, optimizer, schedule, sampler and RNGs, and the log up to it."""
        # read to the CPU: load_state_dict copies weights and optimizer state to their devices, and the RNG states
        # must stay CPU tensors (torch.set_rng_state, numpy) whatever device trains
        state = load_checkpoint(self.run_dir / CHECKPOINT, map_location="cpu")
        saved = dataclasses.asdict(LMConfig(**state["model_config"]))  # an older checkpoint's missing fields: defaults
        now = dataclasses.asdict(self.model.cfg)  # its vocab_size is the tokenizer's, as the checkpoint's is
        diff = [f"{k}={saved[k]!r} there, {now[k]!r} now" for k in now if k not in EXECUTION_FIELDS and saved[k] != now[k]]
        if diff:
            raise UserError(f"{self.run_dir}/{CHECKPOINT} was trained with a different model config ({diff[0]}); "
                            f"resume with the run's own config.yaml or start a new run")
        status = read_status(self.run_dir)
        if (entry := non_finite_state(state)) is not None or status.get("diverged"):
            raise diverged_error(self.run_dir, f"{entry} is not finite" if entry else f"status.json: {status.get('reason')}")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.stream.load_state_dict(state["sampler"][self.rank])
        set_rng_state(state["rng"][self.rank], self.device)
        self.step = self.saved_step = state["step"]
        trained = state.get("cpu_threads") or []  # (world,); absent in checkpoints of earlier versions
        if self.device.type == "cpu" and self.rank < len(trained):  # the plan line, printed in start(), says why
            self.threads_why = apply_cpu_threads(self.tc.threads, trained[self.rank])[1]
        self.tokens_seen = state["tokens_seen"]
        log_path = self.run_dir / "log.jsonl"
        if log_path.exists():  # drop the log lines written after the checkpoint
            self.log_lines = [ln for ln, record in log_records(log_path) if record["step"] <= self.step]
        metric = self.stream.metric
        self.last_val = next((r[metric] for r in map(json.loads, reversed(self.log_lines)) if metric in r), None)
        every = self.tc.keep_checkpoints_every
        if self.is_main and every and self.step and self.step % every == 0 and not kept_path(self.run_dir, self.step).is_file():
            self.keep_weights()  # written after checkpoint.pt: a kill or a full disk between the two lost it
        if self.is_main:
            print(f"resuming {self.run_dir} at step {self.step}/{self.steps}")

    def start(self) -> None:
        """The run folder's config.yaml, tokenizer and status, wandb, and the model as training runs it."""
        if self.is_main:
            atomic_write_text(self.run_dir / "config.yaml", OmegaConf.to_yaml(OmegaConf.structured(self.job)))
            self.stream.save_vocab(self.run_dir)
            # every commit that trained this run: a resume under newer code adds one
            status = read_status(self.run_dir) if self.step else {}
            commits = status.get("train_commits", ["unrecorded"]) if self.step else []  # unrecorded: an older run
            self.train_commits = commits + [git_commit()] if commits[-1:] != [git_commit()] else commits
            # each segment's commit, steps and seconds up to its last checkpoint: train_seconds is their sum
            unrecorded = [dict(commit="unrecorded", steps=[0, self.step], seconds=None)] if self.step else []
            self.segments = status.get("train_segments", unrecorded)
            self.wandb = self.start_wandb()
        self.train_model = torch.compile(self.model) if self.tc.compile else self.model
        if self.world > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.train_model = torch.nn.parallel.DistributedDataParallel(self.train_model, device_ids=ids)
        self.eval_dtype = autocast_dtype(self.device, self.tc.precision)  # None: float32
        self.autocast = (torch.autocast(self.device.type, dtype=self.eval_dtype) if self.eval_dtype is not None
                         else contextlib.nullcontext())
        self.bar = tqdm(total=self.steps, initial=self.step, disable=not (self.is_main and self.tc.progress),
                        desc=self.run_dir.name, dynamic_ncols=True)
        self.model.train()
        # what each scheme's layers train with and why (FlexAttention's gradient probe runs here, before a compiled
        # model traces its first step, under the training's autocast: a bf16 training's probe builds bf16 kernels)
        # status.json's training segment records it
        with self.autocast:
            self.attention_paths = self.model.attention_paths(self.device)
        self.first_step, self.t0 = self.step, time.perf_counter()
        if self.is_main:
            tqdm.write(trainer_plan(self))
            self.write_progress("running")

    def start_wandb(self):
        settings = self.job.logger.wandb
        if settings.mode == "disabled":
            return None
        import wandb

        id_file = self.run_dir / "wandb_id"
        # our own id (wandb.util.generate_id is gone from recent wandb), kept so a resumed run logs to the same run
        run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:8]
        atomic_write_text(id_file, run_id)
        # wandb's own ~25 lines at start and finish only when asked for (WANDB_SILENT=false); one line here instead
        silent = os.environ.get("WANDB_SILENT", "true").strip().lower() not in ("false", "0", "no")
        if silent:
            sync = f"; `wandb sync {self.run_dir / 'wandb'}` uploads it" if settings.mode == "offline" else ""
            tqdm.write(f"wandb: {settings.mode} run {run_id} in {self.run_dir / 'wandb'}{sync} (WANDB_SILENT=false: "
                       f"wandb's own output)")
        return wandb.init(project=settings.project, entity=settings.entity, mode=settings.mode,
                          dir=str(self.run_dir), id=run_id, resume="allow", name=f"{self.job.name}/{self.run_dir.name}",
                          config=dataclasses.asdict(self.job), settings=wandb.Settings(silent=silent))

    def forward_backward(self) -> float:
        """The gradients of one optimizer step's micro-batches; their mean loss (over all ranks)."""
        tc, loss_sum = self.tc, torch.zeros((), device=self.device)
        for micro in range(tc.grad_accum):
            sync = self.world > 1 and micro < tc.grad_accum - 1
            with self.train_model.no_sync() if sync else contextlib.nullcontext(), self.autocast:
                loss = self.stream.loss(self.train_model, self.step, micro, self.device) / tc.grad_accum
            loss.backward()
            loss_sum += loss.detach()
        if self.world > 1:
            dist.all_reduce(loss_sum, op=dist.ReduceOp.AVG)
        return loss_sum.item()

    def train_step(self) -> None:
        """One optimizer step, then its log record, and validation and a checkpoint when they are due."""
        loss = self.forward_backward()
        if not math.isfinite(loss):
            self.diverged(f"loss is {loss}", self.step + 1)
        norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.tc.grad_clip))
        if not math.isfinite(norm):
            self.diverged(f"gradient norm is {norm}", self.step + 1)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.tokens_seen += self.tokens_per_step
        rate = self.tokens_per_step * (self.step - self.first_step) / max(time.perf_counter() - self.t0, 1e-9)
        record = {"step": self.step, "loss": loss, "lr": self.scheduler.get_last_lr()[0], "tokens": self.tokens_seen,
                  "tokens_per_s": rate}
        due = self.step % self.tc.eval_every == 0 or self.step == self.steps
        if due:
            record[self.stream.metric] = self.last_val = self.validate()
            if not math.isfinite(self.last_val):  # the weights of this step: never checkpointed
                self.diverged(f"validation {self.stream.metric} is {self.last_val}", self.step)
            record.update(self.model.learned_values())  # e.g. FIRE's threshold as it learns
        last = self.step == self.steps or (due and self.solved())  # solved: the checkpoint of the last step
        self.log_lines.append(json.dumps(record))
        self.bar.update(1)
        if self.is_main and self.step - self.first_step == ESTIMATE_AFTER_STEPS < self.steps - self.first_step:
            tqdm.write(train_estimate(self))
        shown = {self.stream.metric: f"{self.last_val:.3g}"} if self.last_val is not None else {}
        self.bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{rate:,.0f}", **shown)
        if self.wandb is not None:
            self.wandb.log(record, step=self.step)
        if self.step % self.tc.checkpoint_every == 0 or last:
            self.checkpoint()
        if self.is_main and self.tc.keep_checkpoints_every and self.step % self.tc.keep_checkpoints_every == 0:
            self.keep_weights()

    def keep_weights(self) -> None:
        """train.keep_checkpoints_every: this step's weights alone in checkpoints/step-N.pt (scored over training)."""
        if (entry := non_finite_state({"model": self.model.state_dict()})) is not None:
            self.diverged(f"{entry} is not finite", self.step)
        with atomic_file(kept_path(self.run_dir, self.step)) as f:
            torch.save({"model": self.model.state_dict(), "step": self.step,
                        "model_config": dataclasses.asdict(self.model.cfg)}, f)

    def solved(self) -> bool:
        """Whether the last validation reached train.stop_at_accuracy (a task solved at L: training ends there). A
        resumed run reads its last validation from the log, so it stops where the uninterrupted run stopped."""
        target = self.tc.stop_at_accuracy
        return target is not None and self.last_val is not None and self.last_val >= target

    def validate(self) -> float:
        """The stream's validation metric at L: perplexity (language modelling) or exact match (a task)."""
        self.model.eval()
        value = self.stream.validate(self.model, self.device, self.eval_dtype)
        self.model.train()
        if self.world > 1:  # rank 0's value for all: train.stop_at_accuracy must stop every rank at the same step
            shared = torch.tensor([value], dtype=torch.float64, device=self.device)
            dist.broadcast(shared, src=0)
            value = float(shared.item())
        return value

    def diverged(self, what: str, step: int):
        """Stop at a non-finite loss, gradient norm, validation or weight (`what` at `step`): status failed, nothing
        saved after the last finite checkpoint. A checkpoint of the step just before made the non-finite number, so
        it is withdrawn: the one before it takes its place (checkpoint.withdraw_checkpoint)."""
        kept = f"the last good checkpoint (step {self.saved_step}) is kept" if self.saved_step is not None else \
            "no checkpoint was written yet"
        if self.saved_step is not None and self.saved_step == self.step:  # the weights that made it are checkpointed
            restored = withdraw_checkpoint(self.run_dir) if self.is_main else True
            before = f"the one of step {self.previous_step}" if self.previous_step is not None else "the one before it"
            kept = (f"its checkpoint of step {self.saved_step} made it, so {before} is kept" if restored
                    else f"its checkpoint of step {self.saved_step} made it and was set aside ({self.run_dir.name}/"
                         f"checkpoint.nonfinite.pt): no finite checkpoint is kept")
        if self.is_main:
            self.mark_failed(step=step, reason=f"{what} at step {step}", diverged=True)
        raise TrainingDiverged(f"{what} at step {step}; training stopped and {kept} in {self.run_dir}; lower train.lr "
                               f"or raise train.warmup_steps, in a new run (another name=, or delete the folder)")

    def stopped_at_once(self) -> str:
        """A second Ctrl-C: status.json says stopped (at the last complete checkpoint), and the one line."""
        if self.is_main and self.saved_step is not None:
            with contextlib.suppress(UserError):
                kept = {k: v for k, v in read_status(self.run_dir).items() if k not in ("status", "step", "signal")}
                write_status(self.run_dir, "stopped", **kept, signal="SIGINT (twice)", step=self.saved_step)
        kept = f"its checkpoint of step {self.saved_step} is kept" if self.saved_step is not None else \
            "it has no checkpoint yet"
        return (f"training of {self.run_dir} stopped at once by a second Ctrl-C; {kept}: continue with the same command "
                f"and train.resume=true")

    def checkpoint(self) -> None:
        """log.jsonl, then checkpoint.pt with every rank's RNG and sampler state (rank 0 writes both)."""
        rngs, samplers, threads = [rng_state(self.device)], [self.stream.state_dict()], [torch.get_num_threads()]
        if self.world > 1:  # every rank's, so that a resumed DDP run continues exactly
            rngs, samplers, threads = [None] * self.world, [None] * self.world, [None] * self.world
            dist.all_gather_object(rngs, rng_state(self.device))
            dist.all_gather_object(samplers, self.stream.state_dict())
            dist.all_gather_object(threads, torch.get_num_threads())  # one per rank, as the RNGs
        if (entry := non_finite_state({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()})):
            self.diverged(f"{entry} is not finite", self.step)  # every rank: their weights are the same
        if self.is_main:
            state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                     "scheduler": self.scheduler.state_dict(), "step": self.step, "tokens_seen": self.tokens_seen,
                     "rng": rngs, "sampler": samplers, "model_config": dataclasses.asdict(self.model.cfg),
                     "cpu_threads": threads if self.device.type == "cpu" else None,  # (world,)
                     "config": dataclasses.asdict(self.job)}
            try:
                # The log first: killed between the two writes, the log runs ahead of the checkpoint, and a
                # resume drops the lines past the checkpoint's step (the other way round would lose lines).
                atomic_write_text(self.run_dir / "log.jsonl", "".join(ln + "\n" for ln in self.log_lines))
                save_checkpoint(self.run_dir, state, keep_previous=True)
            except Interrupted:  # a second Ctrl-C during the save: the previous checkpoint stays, as it is
                raise
            except UserError as e:  # disk full, folder made read-only: the previous checkpoint is untouched
                kept = f"its checkpoint of step {self.saved_step} is kept" if self.saved_step else "it has no checkpoint yet"
                self.mark_failed(step=self.step, reason=f"checkpoint write failed: {e}")
                raise UserError(f"training stopped at step {self.step}, {kept}: {e}; then continue with "
                                f"train.resume=true") from e
            self.write_progress("running")  # after the checkpoint: the segments it records are all saved
        self.previous_step, self.saved_step = self.saved_step, self.step  # checkpoint.previous.pt's step, and this one

    def timing(self) -> dict:
        """status.json's account of the training time: the segments so far, this one up to now, and their sum
        (None when a segment trained before segments were recorded)."""
        seconds = round(time.perf_counter() - self.t0, 3)
        now = [dict(commit=git_commit(), steps=[self.first_step, self.step], seconds=seconds,
                    device=device_name(self.device, self.eval_dtype),  # device and threads: the seconds depend on them
                    precision="fp32" if self.eval_dtype is None else "bf16", attention=self.attention_paths)]
        segments = self.segments + (now if self.step > self.first_step or not self.segments else [])
        seconds = [s["seconds"] for s in segments]
        return dict(train_segments=segments, train_seconds=None if None in seconds else round(sum(seconds), 3))

    def write_progress(self, status: str, **info) -> None:
        # processes: under torchrun each trains batch_size windows a step, so the global batch is world times that
        write_status(self.run_dir, status, step=self.step, steps=self.steps, **info, train_commits=self.train_commits,
                     processes=self.world, **self.timing())

    def stop_agreed(self, stop: StopRequest) -> bool:
        """Whether any rank received a stop signal: under DDP every rank must stop after the same step."""
        if self.world == 1:
            return stop.signal is not None
        flag = torch.tensor([float(stop.signal is not None)], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def interrupt(self, stop: StopRequest):
        """After a stop signal: checkpoint this step (all ranks), status interrupted, Interrupted."""
        if self.saved_step != self.step:
            self.checkpoint()
        self.bar.close()
        signal_name = stop.name or "a stop signal on another rank"
        if self.is_main:
            self.write_progress(status_after(stop.signal), signal=signal_name)
        if self.wandb is not None:
            self.wandb.finish()
        stop.pass_on()  # under submitit: requeue the job (it exits here); it resumes from this checkpoint
        raise Interrupted(f"training stopped by {signal_name} at step {self.step}/{self.steps}; its checkpoint is saved "
                          f"in {self.run_dir}: continue with the same command and train.resume=true (sweeps: auto)",
                          stop.signal)

    def mark_failed(self, **info) -> None:
        """status.json -> failed, if it can still be written (not when the disk is full)."""
        with contextlib.suppress(UserError):
            write_status(self.run_dir, "failed", **info)

    def finish(self, stop: StopRequest | None = None) -> None:
        """status completed; then train.evaluate_after, unless a stop signal came during the last step: then the
        signal is handed on (submitit requeues the job, which finds the run trained and evaluates it)."""
        self.bar.close()
        if self.is_main:
            learned = self.model.learned_values()
            solved = {"solved_at_step": self.step} if self.solved() else {}
            # a task: the first validation that met the learning criterion
            met = first_met(self.log_lines, self.stream.metric) if isinstance(self.stream, TaskStream) else {}
            self.write_progress("completed", **{self.stream.metric: self.last_val}, **solved, **met,
                                **({"learned": learned} if learned else {}))
            drop_previous_checkpoint(self.run_dir)  # kept only while a next step could find the latest one bad
            val = f"{self.last_val:.4g}" if self.last_val is not None else "not measured"
            what = "perplexity" if self.stream.metric == "val_ppl" else "exact match"
            early = f" of {self.steps}: reached train.stop_at_accuracy={self.tc.stop_at_accuracy}" \
                if solved and self.step < self.steps else ""
            print(f"done: {self.run_dir} (step {self.step}{early}, validation {what} at L={self.tc.seq_len}: {val})")
        if self.wandb is not None:
            self.wandb.finish()
        if stop is not None and self.tc.evaluate_after and self.stop_agreed(stop):  # every rank alike under DDP
            stop.pass_on()
            raise Interrupted(f"training of {self.run_dir} completed, then {stop.name or 'a stop signal'} stopped it "
                              f"before its evaluation; the same command evaluates it (train.evaluate_after)", stop.signal)
        self.evaluate()
        if self.world > 1:
            dist.barrier()

    def evaluate(self) -> None:
        """With train.evaluate_after: the extrapolation evaluation, scoring only cells not yet in the CSV."""
        if self.tc.evaluate_after and self.is_main:
            evaluate_run(self.run_dir, self.job.eval, self.job.paths.results, device=self.tc.device,
                         progress=self.tc.progress, skip_done=True)
