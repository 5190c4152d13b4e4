"""Train a decoder LM with one position scheme at context length L.

    python -m alibi_lm.train position=rope train.seq_len=256
    python -m alibi_lm.train -m position=sinusoidal,learned,t5,rope,alibi,nope
    torchrun --nproc_per_node=2 -m alibi_lm.train experiment=quick data=wikitext2

Each run writes into its own folder (runs/<name>/<position>-L<L>-seed<seed>/): config.yaml,
tokenizer.json, checkpoint.pt (atomic, latest), log.jsonl and status.json. One process at a time
trains a folder (.lock); a killed run continues from its last checkpoint with train.resume=true
(or auto), to the same weights as a run that was never stopped.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
import uuid
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from . import cli
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
from .config import model_config, validate_train_config, validate_train_run
from .data import WindowSampler, get_batch, prepare_data
from .errors import UserError, write_error
from .model import EXECUTION_FIELDS, TransformerLM, same_model
from .optim import build_optimizer, build_scheduler, total_steps
from .scoring import score_stream


class TrainingDiverged(RuntimeError):
    pass


def pick_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("train.device=cuda but no CUDA device is visible; use train.device=auto or cpu")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and dist.is_initialized():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device(name)


def setup_distributed() -> tuple[int, int]:
    """(rank, world_size); initialises the process group when launched by torchrun."""
    if "RANK" not in os.environ or dist.is_initialized():
        return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    return dist.get_rank(), dist.get_world_size()


def rng_state() -> dict:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _mark_failed(run_dir: Path, **info) -> None:
    """status.json -> failed, if it can still be written (not when the disk is full)."""
    try:
        write_status(run_dir, "failed", **info)
    except UserError:
        pass


def train(cfg: DictConfig) -> dict:
    rank, world = setup_distributed()
    is_main = rank == 0
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    if not is_main:
        return _train(cfg, run_dir, rank, world)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise write_error(run_dir, e) from e
    if not os.access(run_dir, os.W_OK):
        raise UserError(f"run folder {run_dir} is not writable; "
                        f"fix its permissions or set paths.runs=<a writable folder>")
    with lock_run(run_dir):  # a second process on this folder (a sweep started twice) stops here
        remove_stale_temporaries(run_dir)  # what a kill during a write left; no one else writes here now
        return _train(cfg, run_dir, rank, world)


def _train(cfg: DictConfig, run_dir: Path, rank: int, world: int) -> dict:
    is_main = rank == 0
    tc = cfg.train
    status = read_status(run_dir)["status"]
    has_checkpoint = (run_dir / CHECKPOINT).is_file()
    if status == "completed" and tc.resume is not True:
        print(f"{run_dir} is already trained (status.json says completed); skipping. Delete it to retrain, "
              f"or add train.resume=true (with a larger train.max_steps) to train it further.")
        if tc.evaluate_after and is_main:
            evaluate_after(cfg, run_dir)
        return {"run_dir": str(run_dir), "skipped": True}
    resume = tc.resume is True or (tc.resume == "auto" and has_checkpoint)
    if tc.resume is True and not has_checkpoint:
        raise UserError(f"train.resume=true but there is no checkpoint to resume: {run_dir / CHECKPOINT} does not "
                        f"exist; drop train.resume (or use train.resume=auto) to start the run from scratch")
    if has_checkpoint and not resume:
        raise UserError(f"{run_dir} already holds a checkpoint (status: {status}); add train.resume=true to continue "
                        f"it, or change name=/seed= (or delete the folder) for a new run")

    if tc.threads:
        torch.set_num_threads(int(tc.threads))
    device = pick_device(tc.device)
    random.seed(cfg.seed), np.random.seed(cfg.seed), torch.manual_seed(cfg.seed)

    # Rank 0 tokenizes (and fills the cache) first; the others then read the cache.
    if is_main:
        data = prepare_data(cfg.data, cfg.tokenizer)
    if world > 1:
        dist.barrier()
    if not is_main:
        data = prepare_data(cfg.data, cfg.tokenizer)
    train_tokens, valid_tokens = data.split("train"), data.split("valid")

    model = TransformerLM(model_config(cfg, data.vocab_size)).to(device)  # same init on every rank
    torch.manual_seed(cfg.seed + rank)  # dropout differs across ranks
    steps = total_steps(tc, world)
    optimizer = build_optimizer(model, tc)
    scheduler = build_scheduler(optimizer, tc, steps)
    sampler = WindowSampler(len(train_tokens), tc.seq_len, tc.batch_size, cfg.seed, rank=rank, world_size=world)
    step, tokens_seen, log_lines, saved_step, last_val = 0, 0, [], None, None

    if resume:
        state = load_checkpoint(run_dir / CHECKPOINT, map_location=device)
        saved_cfg, now_cfg = state["model_config"], asdict(model.cfg)
        if not same_model(saved_cfg, now_cfg):
            keys = sorted((set(saved_cfg) | set(now_cfg)) - set(EXECUTION_FIELDS))
            diff = next(f"{k}={saved_cfg.get(k)!r} there, {now_cfg.get(k)!r} now"
                        for k in keys if saved_cfg.get(k) != now_cfg.get(k))
            raise UserError(f"{run_dir}/{CHECKPOINT} was trained with a different model config ({diff}); "
                            f"resume with the run's own config.yaml or start a new run")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        sampler.load_state_dict(state["sampler"][rank])
        set_rng_state(state["rng"][rank])
        step, tokens_seen = state["step"], state["tokens_seen"]
        saved_step = step
        log_path = run_dir / "log.jsonl"
        if log_path.exists():  # drop log lines written after the checkpoint we resume from
            log_lines = [ln for ln in log_path.read_text().splitlines() if ln and json.loads(ln)["step"] <= step]
        last_val = next((r["val_ppl"] for r in map(json.loads, reversed(log_lines)) if "val_ppl" in r), None)
        if is_main:
            print(f"resuming {run_dir} at step {step}/{steps}")

    if is_main:
        atomic_write_text(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
        data.save_tokenizer(run_dir / "tokenizer.json")
        write_status(run_dir, "running", step=step, steps=steps)
    wandb_run = init_wandb(cfg, run_dir) if is_main else None

    train_model = model
    if tc.compile:
        train_model = torch.compile(model)
    if world > 1:
        device_ids = [device.index] if device.type == "cuda" else None
        train_model = torch.nn.parallel.DistributedDataParallel(train_model, device_ids=device_ids)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
    eval_dtype = torch.bfloat16 if device.type == "cuda" else None
    tokens_per_step = tc.batch_size * tc.grad_accum * tc.seq_len * world

    def checkpoint():
        nonlocal saved_step
        rngs = [rng_state()]
        samplers = [sampler.state_dict()]
        if world > 1:  # every rank's RNG and sampler, so that a resumed DDP run continues exactly
            rngs, samplers = [None] * world, [None] * world
            dist.all_gather_object(rngs, rng_state())
            dist.all_gather_object(samplers, sampler.state_dict())
        if is_main:
            try:
                # The log first: killed between the two writes, the log runs ahead of the checkpoint, and a
                # resume drops the lines past the checkpoint's step (the other way round would lose lines).
                atomic_write_text(run_dir / "log.jsonl", "".join(ln + "\n" for ln in log_lines))
                save_checkpoint(run_dir, {
                    "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(), "step": step, "tokens_seen": tokens_seen, "rng": rngs,
                    "sampler": samplers, "model_config": asdict(model.cfg),
                    "config": OmegaConf.to_container(cfg, resolve=True),
                })
            except UserError as e:  # disk full, folder made read-only: the previous checkpoint is untouched
                kept = f"its checkpoint of step {saved_step} is kept" if saved_step else "it has no checkpoint yet"
                _mark_failed(run_dir, step=step, reason=f"checkpoint write failed: {e}")
                raise UserError(f"training stopped at step {step}, {kept}: {e}; then continue with "
                                f"train.resume=true") from e
        saved_step = step

    bar = tqdm(total=steps, initial=step, disable=not (is_main and tc.progress), desc=run_dir.name, dynamic_ncols=True)
    model.train()
    first_step = step
    t0 = time.perf_counter()
    while step < steps:
        loss_sum = torch.zeros((), device=device)
        for micro in range(tc.grad_accum):
            x, y = get_batch(train_tokens, sampler.next_batch(), tc.seq_len, device)  # (B, L) each
            sync = world > 1 and micro < tc.grad_accum - 1
            with train_model.no_sync() if sync else nullcontext(), amp:
                loss = train_model(x, targets=y).mean() / tc.grad_accum
            loss.backward()
            loss_sum += loss.detach()
        if tc.debug_nan_at_step is not None and step + 1 == tc.debug_nan_at_step:
            loss_sum = loss_sum * float("nan")  # test hook: behave as if the loss had diverged
        if world > 1:
            dist.all_reduce(loss_sum, op=dist.ReduceOp.AVG)
        loss_value = loss_sum.item()
        if not math.isfinite(loss_value):
            if is_main:
                _mark_failed(run_dir, step=step + 1, reason=f"loss is {loss_value} at step {step + 1}")
            kept = f"the last good checkpoint (step {saved_step}) is kept" if saved_step else "no checkpoint was written yet"
            raise TrainingDiverged(f"loss is {loss_value} at step {step + 1}; training stopped and {kept} in {run_dir}; "
                                   f"lower train.lr or raise train.warmup_steps")
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        tokens_seen += tokens_per_step
        elapsed = time.perf_counter() - t0
        rate = tokens_per_step * (step - first_step) / max(elapsed, 1e-9)
        record = {"step": step, "loss": loss_value, "lr": scheduler.get_last_lr()[0], "tokens": tokens_seen, "tokens_per_s": rate}
        if step % tc.eval_every == 0 or step == steps:
            model.eval()
            valid = valid_tokens if tc.eval_tokens is None else valid_tokens[: tc.eval_tokens + 1]
            last_val = score_stream(model, valid, tc.seq_len, device=device, autocast_dtype=eval_dtype).ppl
            model.train()
            record["val_ppl"] = last_val
        log_lines.append(json.dumps(record))
        bar.update(1)
        bar.set_postfix(loss=f"{loss_value:.3f}", tok_s=f"{rate:,.0f}", **({"val_ppl": f"{last_val:.1f}"} if last_val else {}))
        if wandb_run is not None:
            wandb_run.log(record, step=step)
        if step % tc.checkpoint_every == 0 or step == steps:
            checkpoint()
    bar.close()
    if is_main:
        write_status(run_dir, "completed", step=step, steps=steps, val_ppl=last_val, train_seconds=time.perf_counter() - t0)
        val = f"{last_val:.2f}" if last_val is not None else "not measured"
        print(f"done: {run_dir} (step {step}, validation perplexity at L={tc.seq_len}: {val})")
    if wandb_run is not None:
        wandb_run.finish()
    if tc.evaluate_after and is_main:
        evaluate_after(cfg, run_dir)
    if world > 1:
        dist.barrier()
    return {"run_dir": str(run_dir), "val_ppl": last_val}


def evaluate_after(cfg: DictConfig, run_dir: Path) -> None:
    """The extrapolation evaluation of a finished run (sweeps), scoring only cells not yet in the CSV."""
    from .evaluate import evaluate_run

    evaluate_run(run_dir, cfg.eval, cfg.paths.results, device=cfg.train.device, progress=cfg.train.progress,
                 skip_done=True)


def init_wandb(cfg: DictConfig, run_dir: Path):
    if cfg.logger.wandb.mode == "disabled":
        return None
    import wandb

    id_file = run_dir / "wandb_id"
    # our own id (wandb.util.generate_id is gone from recent wandb), kept so a resumed run logs to the same run
    run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:8]
    atomic_write_text(id_file, run_id)
    return wandb.init(project=cfg.logger.wandb.project, entity=cfg.logger.wandb.entity, mode=cfg.logger.wandb.mode,
                      dir=str(run_dir), id=run_id, resume="allow", name=f"{cfg.name}/{run_dir.name}",
                      config=OmegaConf.to_container(cfg, resolve=True))


def task(cfg: DictConfig):
    try:
        return train(cfg)
    except TrainingDiverged as e:
        cli.fail(str(e), status=3)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def main() -> None:
    cli.run("train", task, validate=validate_train_config, validate_run=validate_train_run)


if __name__ == "__main__":
    main()
