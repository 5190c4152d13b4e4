"""Train a decoder LM with one position scheme at context length L.

    python -m alibi_lm.train position=rope train.seq_len=256
    python -m alibi_lm.train -m position=sinusoidal,learned,t5,rope,alibi,nope
    torchrun --nproc_per_node=2 -m alibi_lm.train experiment=quick data=wikitext2

Each run writes into its own folder (runs/<name>/<position>-L<L>-seed<seed>/): config.yaml,
tokenizer.json, checkpoint.pt (atomic, latest), log.jsonl and status.json. One process at a time
trains a folder (.lock); a killed run continues from its last checkpoint with train.resume=true
(or auto), to the same weights as a run that was never stopped. Without Hydra:
Trainer(job, run_dir).run() with a TrainJob (alibi_lm.config).
"""

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
import pandas as pd
import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from tqdm import tqdm

from . import cli
from .attention import FLEX_MIN_HEAD_DIM, narrow_head_error, no_flex_backward_error
from .checkpoint import (
    CHECKPOINT,
    atomic_write_text,
    load_checkpoint,
    lock_run,
    read_status,
    remove_stale_temporaries,
    save_checkpoint,
    write_status,
)
from .config import TrainJob, autocast_dtype, check_writable, resolve_device, set_cpu_threads
from .costs import ESTIMATE_AFTER_STEPS, train_estimate, trainer_plan
from .data import WindowSampler, check_data, get_batch, prepare_data
from .errors import TrainingDiverged, UserError, write_error
from .eval.evaluation import evaluate_run
from .eval.scoring import score_stream
from .model import EXECUTION_FIELDS, LMConfig, TransformerLM
from .naming import custom_name, free_keys
from .optim import build_optimizer, build_scheduler
from .positions import POSITION_SCHEMES
from .provenance import device_name, git_commit
from .stopping import Interrupted, StopRequest, stop_requests
from .tasks import TASKS, build_task
from .tasks.training import TaskStream


def setup_distributed(device: str = "auto") -> tuple[int, int]:
    """(rank, world_size); initialises the process group when launched by torchrun: nccl where train.device
    resolves to CUDA (each process on its LOCAL_RANK's GPU), gloo on the CPU (train.device=cpu on a machine with
    GPUs too)."""
    if "RANK" in os.environ and not dist.is_initialized():
        resolved = resolve_device(device, "train.device")
        dist.init_process_group("nccl" if resolved.type == "cuda" else "gloo")
        if resolved.type == "cuda":
            torch.cuda.set_device(resolved)
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def rng_state(device=None) -> dict:
    """Every generator's state as plain data (tensors, numbers, strings), which torch.load(weights_only=True)
    reads back: numpy's key array travels as a tensor. The CUDA generator's only where `device` is a GPU (a run on
    the CPU of a GPU machine opens no CUDA context)."""
    on_cuda = device is not None and torch.device(device).type == "cuda"
    cuda = torch.cuda.get_rng_state(torch.device(device)) if on_cuda else None
    numpy = np.random.get_state(legacy=False)  # {bit_generator, state: {key (624,) uint32, pos}, has_gauss, gauss}
    numpy["state"]["key"] = torch.from_numpy(numpy["state"]["key"].astype(np.int64))
    return {"python": random.getstate(), "numpy": numpy, "torch": torch.get_rng_state(), "cuda": cuda}


def set_rng_state(state: dict, device=None) -> None:
    random.setstate(state["python"])
    numpy = state["numpy"]  # a dict; a legacy tuple in checkpoints of earlier versions
    if isinstance(numpy, dict):
        numpy["state"]["key"] = np.asarray(numpy["state"]["key"], dtype=np.uint32)
    np.random.set_state(numpy)
    torch.set_rng_state(state["torch"])
    cuda = state["cuda"]
    if cuda is not None and device is not None and torch.device(device).type == "cuda":
        device = torch.device(device)
        index = device.index if device.index is not None else torch.cuda.current_device()
        if isinstance(cuda, (list, tuple)):  # earlier checkpoints: every visible GPU's
            cuda = cuda[index] if index < len(cuda) else None
        if cuda is not None:
            torch.cuda.set_rng_state(cuda.cpu(), device)


def resume_wanted(resume, run_dir: Path) -> bool:
    """Whether train.resume (true | false | auto) continues the checkpoint in run_dir; a UserError when
    the setting does not fit what is there."""
    has_checkpoint = (run_dir / CHECKPOINT).is_file()
    if resume is True and not has_checkpoint:
        raise UserError(f"train.resume=true but there is no checkpoint to resume: {run_dir / CHECKPOINT} does not "
                        f"exist; drop train.resume (or use train.resume=auto) to start the run from scratch")
    status = read_status(run_dir)["status"]
    if has_checkpoint and resume is False and status != "completed":
        raise UserError(f"{run_dir} already holds a checkpoint (status: {status}); add train.resume=true to continue "
                        f"it, or change name=/seed= (or delete the folder) for a new run")
    return has_checkpoint and resume is not False


class LMStream:
    """Language modelling as the trainer's stream of batches: random windows of L tokens of the training split
    (WindowSampler, whose state the checkpoint keeps), validation perplexity at L. tasks.training.TaskStream is
    the synthetic tasks' counterpart."""

    metric = "val_ppl"

    def __init__(self, data, train_cfg, seed: int, rank: int = 0, world: int = 1):
        self.data, self.tc = data, train_cfg
        self.train_tokens, self.valid_tokens = data.split("train"), data.split("valid")
        self.vocab_size = data.vocab_size
        self.sampler = WindowSampler(len(self.train_tokens), train_cfg.seq_len, train_cfg.batch_size, seed, rank, world)

    def loss(self, model, step: int, micro: int, device) -> torch.Tensor:
        x, y = get_batch(self.train_tokens, self.sampler.next_batch(), self.tc.seq_len, device)  # (B, L) each
        return model(x, targets=y).mean()

    def validate(self, model, device, autocast_dtype=None) -> float:
        """Validation perplexity at L on the first train.eval_tokens tokens of the validation split."""
        tokens = self.valid_tokens if self.tc.eval_tokens is None else self.valid_tokens[: self.tc.eval_tokens + 1]
        return score_stream(model, tokens, self.tc.seq_len, device=device, autocast_dtype=autocast_dtype).ppl

    def state_dict(self) -> dict:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)

    def save_vocab(self, run_dir: Path) -> None:
        self.data.save_tokenizer(run_dir / "tokenizer.json")


def is_synthetic(job: TrainJob) -> bool:
    return TASKS[job.task_name].synthetic


class Trainer:
    """One training run in run_dir: build(), restore() when resuming, start(), then train_step() until
    the budget is spent (each step validates and checkpoints when due), finish(). Rank `rank` of
    `world` processes under DDP; rank 0 alone writes."""

    def __init__(self, job: TrainJob, run_dir: Path, rank: int = 0, world: int = 1):
        self.job, self.tc, self.run_dir = job, job.train, Path(run_dir)
        self.rank, self.world, self.is_main = rank, world, rank == 0
        self.step, self.tokens_seen, self.saved_step, self.last_val = 0, 0, None, None
        self.log_lines: list[str] = []
        self.wandb = None

    def run(self) -> dict:
        completed = read_status(self.run_dir)["status"] == "completed"
        if completed or resume_wanted(self.tc.resume, self.run_dir):  # neither skip nor resume another config's run
            check_same_run(self.job, self.run_dir)
        if completed and self.tc.resume is not True:
            solved = read_status(self.run_dir).get("solved_at_step")
            further = "a larger train.max_steps" + (f" and a higher train.stop_at_accuracy (it reached "
                                                    f"{self.tc.stop_at_accuracy} at step {solved})" if solved else "")
            print(f"{self.run_dir} is already trained (status.json says completed); skipping. Delete it to retrain, "
                  f"or add train.resume=true (with {further}) to train it further.")
            self.evaluate()
            return {"run_dir": str(self.run_dir), "skipped": True}
        # a scheduler's signal ends the step under way; then a checkpoint, status interrupted, exit 75
        with stop_requests() as stop:
            resume = resume_wanted(self.tc.resume, self.run_dir)
            self.build()
            if resume:
                self.restore()
            self.start()
            while self.step < self.steps and not self.solved():
                if self.stop_agreed(stop):
                    self.interrupt(stop)
                self.train_step()
        self.finish(stop)
        return {"run_dir": str(self.run_dir), "val_ppl": self.last_val}

    def build(self) -> None:
        """Data (rank 0 tokenizes and fills the cache first), model, step budget, optimizer, schedule, sampler."""
        job, tc = self.job, self.tc
        set_cpu_threads(tc.threads)
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
        self.steps = int(tc.max_steps) if tc.max_tokens is None else math.ceil(tc.max_tokens / self.tokens_per_step)
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
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.stream.load_state_dict(state["sampler"][self.rank])
        set_rng_state(state["rng"][self.rank], self.device)
        self.step = self.saved_step = state["step"]
        self.tokens_seen = state["tokens_seen"]
        log_path = self.run_dir / "log.jsonl"
        if log_path.exists():  # drop the log lines written after the checkpoint
            lines = [ln for ln in log_path.read_text().splitlines() if ln]
            self.log_lines = [ln for ln in lines if json.loads(ln)["step"] <= self.step]
        metric = self.stream.metric
        self.last_val = next((r[metric] for r in map(json.loads, reversed(self.log_lines)) if metric in r), None)
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
        return wandb.init(project=settings.project, entity=settings.entity, mode=settings.mode,
                          dir=str(self.run_dir), id=run_id, resume="allow", name=f"{self.job.name}/{self.run_dir.name}",
                          config=dataclasses.asdict(self.job))

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
            self.diverged(loss)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.tc.grad_clip)
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

    def solved(self) -> bool:
        """Whether the last validation reached train.stop_at_accuracy (a task solved at L: training ends there). A
        resumed run reads its last validation from the log, so it stops where the uninterrupted run stopped."""
        target = self.tc.stop_at_accuracy
        return target is not None and self.last_val is not None and self.last_val >= target

    def validate(self) -> float:
        """The stream's validation metric at L: perplexity (language modelling) or answer accuracy (a task)."""
        self.model.eval()
        value = self.stream.validate(self.model, self.device, self.eval_dtype)
        self.model.train()
        if self.world > 1:  # rank 0's value for all: train.stop_at_accuracy must stop every rank at the same step
            shared = torch.tensor([value], dtype=torch.float64, device=self.device)
            dist.broadcast(shared, src=0)
            value = float(shared.item())
        return value

    def diverged(self, loss: float):
        """Stop at a NaN or inf loss: status failed, nothing saved after the last good checkpoint."""
        if self.is_main:
            self.mark_failed(step=self.step + 1, reason=f"loss is {loss} at step {self.step + 1}")
        kept = "no checkpoint was written yet"
        if self.saved_step:
            kept = f"the last good checkpoint (step {self.saved_step}) is kept"
        raise TrainingDiverged(f"loss is {loss} at step {self.step + 1}; training stopped and {kept} in {self.run_dir}; "
                               f"lower train.lr or raise train.warmup_steps")

    def checkpoint(self) -> None:
        """log.jsonl, then checkpoint.pt with every rank's RNG and sampler state (rank 0 writes both)."""
        rngs, samplers = [rng_state(self.device)], [self.stream.state_dict()]
        if self.world > 1:  # every rank's, so that a resumed DDP run continues exactly
            rngs, samplers = [None] * self.world, [None] * self.world
            dist.all_gather_object(rngs, rng_state(self.device))
            dist.all_gather_object(samplers, self.stream.state_dict())
        if self.is_main:
            state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                     "scheduler": self.scheduler.state_dict(), "step": self.step, "tokens_seen": self.tokens_seen,
                     "rng": rngs, "sampler": samplers, "model_config": dataclasses.asdict(self.model.cfg),
                     "config": dataclasses.asdict(self.job)}
            try:
                # The log first: killed between the two writes, the log runs ahead of the checkpoint, and a
                # resume drops the lines past the checkpoint's step (the other way round would lose lines).
                atomic_write_text(self.run_dir / "log.jsonl", "".join(ln + "\n" for ln in self.log_lines))
                save_checkpoint(self.run_dir, state)
            except UserError as e:  # disk full, folder made read-only: the previous checkpoint is untouched
                kept = f"its checkpoint of step {self.saved_step} is kept" if self.saved_step else "it has no checkpoint yet"
                self.mark_failed(step=self.step, reason=f"checkpoint write failed: {e}")
                raise UserError(f"training stopped at step {self.step}, {kept}: {e}; then continue with "
                                f"train.resume=true") from e
            self.write_progress("running")  # after the checkpoint: the segments it records are all saved
        self.saved_step = self.step

    def timing(self) -> dict:
        """status.json's account of the training time: the segments so far, this one up to now, and their sum
        (None when a segment trained before segments were recorded)."""
        seconds = round(time.perf_counter() - self.t0, 3)
        now = [dict(commit=git_commit(), steps=[self.first_step, self.step], seconds=seconds,
                    device=device_name(self.device, self.eval_dtype),  # device and threads: the seconds depend on them
                    precision="fp32" if self.eval_dtype is None else "bf16")]
        segments = self.segments + (now if self.step > self.first_step or not self.segments else [])
        seconds = [s["seconds"] for s in segments]
        return dict(train_segments=segments, train_seconds=None if None in seconds else round(sum(seconds), 3))

    def write_progress(self, status: str, **info) -> None:
        write_status(self.run_dir, status, step=self.step, steps=self.steps, **info, train_commits=self.train_commits,
                     **self.timing())

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
            self.write_progress("interrupted", signal=signal_name)
        if self.wandb is not None:
            self.wandb.finish()
        stop.pass_on()  # under submitit: requeue the job (it exits here); it resumes from this checkpoint
        raise Interrupted(f"training stopped by {signal_name} at step {self.step}/{self.steps}; its checkpoint is saved "
                          f"in {self.run_dir}: continue with the same command and train.resume=true (sweeps: auto)")

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
            self.write_progress("completed", **{self.stream.metric: self.last_val}, **solved,
                                **({"learned": learned} if learned else {}))
            val = f"{self.last_val:.4g}" if self.last_val is not None else "not measured"
            what = "perplexity" if self.stream.metric == "val_ppl" else "answer accuracy"
            early = f" of {self.steps}: reached train.stop_at_accuracy={self.tc.stop_at_accuracy}" \
                if solved and self.step < self.steps else ""
            print(f"done: {self.run_dir} (step {self.step}{early}, validation {what} at L={self.tc.seq_len}: {val})")
        if self.wandb is not None:
            self.wandb.finish()
        if stop is not None and self.tc.evaluate_after and self.stop_agreed(stop):  # every rank alike under DDP
            stop.pass_on()
            raise Interrupted(f"training of {self.run_dir} completed, then {stop.name or 'a stop signal'} stopped it "
                              f"before its evaluation; the same command evaluates it (train.evaluate_after)")
        self.evaluate()
        if self.world > 1:
            dist.barrier()

    def evaluate(self) -> None:
        """With train.evaluate_after: the extrapolation evaluation, scoring only cells not yet in the CSV."""
        if self.tc.evaluate_after and self.is_main:
            evaluate_run(self.run_dir, self.job.eval, self.job.paths.results, device=self.tc.device,
                         progress=self.tc.progress, skip_done=True)


def train(job: TrainJob, run_dir: Path) -> dict:
    """Train `job` in run_dir (rank 0 holding the folder's lock), under torchrun on every rank."""
    rank, world = setup_distributed(job.train.device)
    try:
        if rank != 0:
            return Trainer(job, run_dir, rank, world).run()
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise write_error(run_dir, e) from e
        if not os.access(run_dir, os.W_OK):
            raise UserError(f"run folder {run_dir} is not writable; fix its permissions or set paths.runs=<a writable folder>")
        with lock_run(run_dir):  # a second process on this folder (a sweep started twice) stops here
            remove_stale_temporaries(run_dir)  # what a kill during a write left; no one else writes here now
            return Trainer(job, run_dir, rank, world).run()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# ---- the preflight: what a job reads and writes, checked before Hydra creates its folder -----------------

# Entries of a run's config.yaml that do not change the trained model: how and where it runs, logs and is
# evaluated. Every other entry must match the command's for its run folder to be resumed or reused.
NOT_MODEL_KEYS = ("name", "position.", "data.root", "data.cache_dir", "data.hub_path", "data.hub_config",
                  "tokenizer.token_dtype", "train.eval_every", "train.eval_tokens", "train.checkpoint_every",
                  "train.resume", "train.compile", "train.device", "train.precision", "train.threads", "train.progress",
                  "train.evaluate_after", "eval.", "logger.", "paths.", *(f"model.{f}" for f in EXECUTION_FIELDS))
# train.resume=true may extend a run's budget, and lift the accuracy that ended it
BUDGET_KEYS = ("train.max_steps", "train.max_tokens", "train.stop_at_accuracy")


def check(job: TrainJob, run_dir: Path | None) -> None:
    if not is_synthetic(job):
        check_data(job.data)  # split files present and text (their first 64 KiB), or the hub reachable
    device = resolve_device(job.train.device, "train.device")
    head_dim = job.model.d_model // job.model.n_head
    on_cuda_flex = job.model.attention == "flex" and device.type == "cuda"
    if on_cuda_flex and head_dim < FLEX_MIN_HEAD_DIM:
        raise narrow_head_error(head_dim)
    if on_cuda_flex and not POSITION_SCHEMES[job.model.position].flex_backward:  # the first backward would fail
        raise no_flex_backward_error(job.model.position)
    check_writable(job.paths.runs, "paths.runs")
    if job.train.evaluate_after:
        check_writable(job.paths.results, "paths.results")
    if run_dir is not None:
        check_writable(run_dir, "hydra.run.dir")
        if resume_wanted(job.train.resume, run_dir) or read_status(run_dir)["status"] == "completed":
            check_same_run(job, run_dir)


def check_same_run(job: TrainJob, run_dir: Path) -> None:
    """The command must ask for the run that run_dir holds before that run is reused (skipped as trained) or
    resumed: every config.yaml entry that changes the trained model equal (NOT_MODEL_KEYS may differ; so may
    the budget under train.resume=true, which trains further). Keys one side lacks (a config.yaml older than
    a key) are skipped."""
    try:
        saved = OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"), resolve=True)
        saved = pd.json_normalize(saved, sep=".").to_dict("records")[0]  # {"a": {"b": 1}} -> {"a.b": 1}
    except Exception:  # noqa: BLE001 - a missing or unreadable config.yaml is reported by the resume itself
        return
    now = pd.json_normalize(dataclasses.asdict(job), sep=".").to_dict("records")[0]
    free = free_keys(job, NOT_MODEL_KEYS) + (BUDGET_KEYS if job.train.resume is True else ())
    diff = [k for k in sorted(saved.keys() & now.keys()) if not k.startswith(free) and saved[k] != now[k]]
    if diff:
        shown = ", ".join(f"{k}={saved[k]!r} there, {now[k]!r} now" for k in diff[:3]) + (" ..." if diff[3:] else "")
        raise UserError(f"{run_dir} holds a run trained with other settings ({shown}); reusing or resuming it would "
                        f"report the old model: use another name= (or paths.runs=) for the new settings, or delete "
                        f"{run_dir} to retrain it")


def main() -> None:
    cli.main("train", train, check, rename=lambda args: custom_name(args, NOT_MODEL_KEYS))


if __name__ == "__main__":
    main()
