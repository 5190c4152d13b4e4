"""Whether a run folder may be resumed or reused for a command: only for the config that made it. NOT_MODEL_KEYS
lists the entries that do not change the trained model (how and where it runs, logs and is evaluated); the same
list decides whether an experiment=X command is X's run (alibi_lm/naming.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from omegaconf import OmegaConf

from ..checkpoint import CHECKPOINT, checkpoint_config, flat_config, read_status
from ..config import TrainJob
from ..errors import UserError
from ..model import EXECUTION_FIELDS


def diverged_error(run_dir: Path, why: str) -> UserError:
    return UserError(f"{run_dir} diverged in training ({why}); resuming it would diverge again: start a new run with a "
                     f"lower train.lr or more train.warmup_steps (another name=, or delete the folder)")


def resume_wanted(resume, run_dir: Path) -> bool:
    """Whether train.resume (true | false | auto) continues the checkpoint in run_dir; a UserError when
    the setting does not fit what is there."""
    has_checkpoint = (run_dir / CHECKPOINT).is_file()
    if resume is True and not has_checkpoint:
        raise UserError(f"train.resume=true but there is no checkpoint to resume: {run_dir / CHECKPOINT} does not "
                        f"exist; drop train.resume (or use train.resume=auto) to start the run from scratch")
    status = read_status(run_dir)["status"]
    if has_checkpoint and resume is not False and read_status(run_dir).get("diverged"):
        raise diverged_error(run_dir, f"status.json: {read_status(run_dir).get('reason')}")
    if has_checkpoint and resume is False and status != "completed":
        raise UserError(f"{run_dir} already holds a checkpoint (status: {status}); add train.resume=true to continue "
                        f"it, or change name=/seed= (or delete the folder) for a new run")
    return has_checkpoint and resume is not False


# Entries of a run's config.yaml that do not change the trained model: how and where it runs, logs and is
# evaluated. Every other entry must match the command's for its run folder to be resumed or reused.
NOT_MODEL_KEYS = ("name", "position.", "data.root", "data.cache_dir", "data.hub_path", "data.hub_config",
                  "tokenizer.token_dtype", "train.eval_every", "train.eval_tokens", "train.checkpoint_every",
                  "train.resume", "train.compile", "train.device", "train.precision", "train.threads", "train.progress",
                  "train.evaluate_after", "eval.", "logger.", "paths.", *(f"model.{f}" for f in EXECUTION_FIELDS))
# train.resume=true may extend a run's budget, and lift the accuracy that ended it
BUDGET_KEYS = ("train.max_steps", "train.max_tokens", "train.stop_at_accuracy")


def free_keys(job, free: tuple[str, ...]) -> tuple[str, ...]:
    """The keys of `free` that may differ without changing the trained model: not the validation cadence of a run
    that stops on solving its task (train.stop_at_accuracy), which decides the step where it ends."""
    return tuple(k for k in free if k != "train.eval_every") if job.train.stop_at_accuracy is not None else free


def saved_configs(run_dir: Path) -> list[tuple[str, dict]]:
    """The flat configs a run folder records ({"a": {"b": 1}} -> {"a.b": 1}), each with where it comes from: its
    config.yaml and the copy its checkpoint.pt keeps beside the weights, which a config.yaml edited after training
    does not change. Missing or unreadable ones are left out (a damaged checkpoint's load reports it)."""
    configs = []
    try:
        configs.append(("config.yaml", flat_config(OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"),
                                                                           resolve=True))))
    except Exception:  # noqa: BLE001 - missing, or damaged by hand: the checkpoint's copy decides
        pass
    try:
        config = checkpoint_config(run_dir / CHECKPOINT)
    except Exception:  # noqa: BLE001 - no checkpoint yet, or a damaged one
        config = None
    return configs + ([(CHECKPOINT, flat_config(config))] if config else [])


def other_settings(job: TrainJob, run_dir: Path) -> str | None:
    """The recorded entries of run_dir (config.yaml's, then its checkpoint's copy) that change the trained model and
    differ from job's ("k=v there, w now", at most three), or None: NOT_MODEL_KEYS may differ, and so may the budget
    under train.resume=true, which trains further. Keys one side lacks (a config older than a key) are skipped; with
    no readable record, nothing (there is no run to reuse)."""
    now = flat_config(dataclasses.asdict(job))
    free = free_keys(job, NOT_MODEL_KEYS) + (BUDGET_KEYS if job.train.resume is True else ())
    for where, saved in saved_configs(run_dir):
        diff = [k for k in sorted(saved.keys() & now.keys()) if not k.startswith(free) and saved[k] != now[k]]
        if diff:
            shown = ", ".join(f"{k}={saved[k]!r} there, {now[k]!r} now" for k in diff[:3]) + (" ..." if diff[3:] else "")
            return shown + (f"; as its {where} records" if where == CHECKPOINT else "")
    return None


def check_same_run(job: TrainJob, run_dir: Path) -> None:
    """The command must ask for the run that run_dir holds before that run is reused (skipped as trained) or
    resumed: every config.yaml entry that changes the trained model equal (other_settings)."""
    if shown := other_settings(job, run_dir):
        raise UserError(f"{run_dir} holds a run trained with other settings ({shown}); reusing or resuming it would "
                        f"report the old model: use another name= (or paths.runs=) for the new settings, or delete "
                        f"{run_dir} to retrain it")


def check_same_processes(run_dir: Path, world: int) -> None:
    """A trained run is reused (skipped as trained) only by a command that runs as many processes as trained it:
    under torchrun each process draws train.batch_size windows a step, so another count is another global batch,
    which the config does not show. Runs recorded before the count was (no `processes` in status.json) pass."""
    trained = read_status(run_dir).get("processes")
    if trained is not None and int(trained) != world:
        raise UserError(f"{run_dir} was trained by {trained} process(es) (torchrun: a global batch of {trained} x "
                        f"train.batch_size windows a step) and this command runs {world}: reusing it would report "
                        f"another training's model; run it as it was trained, or use another name= (or delete the "
                        f"folder) for this one")
