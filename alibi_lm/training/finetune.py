"""A short fine-tune of a trained run at a longer length (train.init_from, train.finetune_fraction): the baseline that
training-free extension is measured against (Position Interpolation's 1,000 steps, YaRN's 400, LCEG's 1B tokens).

The new run starts from the parent's weights (its checkpoint; a fresh optimizer and schedule), trains at its own
train.seq_len = s L with the parent's scheme, for finetune_fraction of the tokens the parent trained on. A RoPE parent
is fine-tuned as it is, or with one of RoPE's rescalings (train.finetune_scaling=linear for Position Interpolation,
ntk, yarn, llama3) at factor s on the parent's L: set on the model before its first step and at every later load of
the run (subjects/native.set_trained_scaling: a resume, the evaluation, the probes), so that it is always scored with
the frequencies it trained with; an evaluation's own rescaling on top of it is refused. Its folder holds
finetune.json: the parent, its L and tokens, s, the fraction, the steps, the rescaling (null: none); the evaluation
reads it and labels the run's rows <scheme>+ft<s>x<fraction> (+ft<s>x<fraction>-linear with a rescaling) at the
parent's L, so that they sit beside the parent's rows at the same Lv / L.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from ..checkpoint import CHECKPOINT, atomic_write_text, load_checkpoint, read_status
from ..errors import UserError
from ..model import EXECUTION_FIELDS, LMConfig
from ..provenance import weights_digest
from ..subjects.native import FINETUNE_JSON, read_finetune_record


def check_not_own_parent(init_from: str | None, run_dir: Path) -> None:
    """A fine-tune's parent is not the folder it trains into (its weights would be replaced by the fine-tune's): a
    one-line UserError, checked before the reuse check, whose hint (delete the folder) would delete the parent."""
    if init_from and Path(init_from).resolve() == Path(run_dir).resolve():
        raise UserError(f"train.init_from={init_from} is this run's own folder; a fine-tune trains into a folder of "
                        f"its own: give it another name= (or hydra.run.dir=)")


def parent_of(parent_dir: Path) -> dict:
    """The parent's checkpoint state; a one-line UserError for a folder that is not a completed run."""
    if not (parent_dir / CHECKPOINT).is_file() or read_status(parent_dir).get("status") != "completed":
        raise UserError(f"train.init_from={parent_dir} is not a completed run folder (checkpoint.pt and status.json "
                        f"saying completed); train it first, or point at another run")
    return load_checkpoint(parent_dir / CHECKPOINT, map_location="cpu")


def finetune_steps(fraction: float, parent_tokens: int, tokens_per_step: int) -> int:
    """Steps that spend `fraction` of the parent's training tokens (at least one)."""
    return max(1, math.ceil(fraction * parent_tokens / tokens_per_step))


def check_parent_model(model, state: dict, parent_dir: Path) -> None:
    """`model`'s config must be the parent's (bar execution fields): else a one-line UserError, before anything of the
    fine-tune (its finetune.json) is written."""
    saved = dataclasses.asdict(LMConfig(**state["model_config"]))
    now = dataclasses.asdict(model.cfg)
    diff = [f"{k}={saved[k]!r} there, {now[k]!r} here" for k in now if k not in EXECUTION_FIELDS and saved[k] != now[k]]
    if diff:
        raise UserError(f"train.init_from={parent_dir} has another model config ({diff[0]}); fine-tune with the "
                        f"parent's model and position settings")


def start_from_parent(model, state: dict, parent_dir: Path) -> None:
    """Load the parent's weights into `model`, whose config must be the parent's (check_parent_model)."""
    check_parent_model(model, state, parent_dir)
    model.load_state_dict(state["model"])


def finetune_record(parent_dir: Path, state: dict, seq_len: int, fraction: float, steps: int, tokens_per_step: int,
                    rescaling: str | None = None) -> dict:
    """What finetune.json records; a one-line UserError for a rescaling whose factor s = seq_len / the parent's L
    is unknown (a parent checkpoint without its config) or below 1."""
    parent_len = int(state["config"]["train"]["seq_len"]) if state.get("config") else None
    if rescaling is not None and (parent_len is None or seq_len < parent_len):
        have = "names no L" if parent_len is None else f"trained at L = {parent_len}"
        raise UserError(f"train.finetune_scaling={rescaling} rescales by s = train.seq_len / the parent's L, but "
                        f"{parent_dir} {have} and train.seq_len={seq_len}; fine-tune at train.seq_len >= its L")
    return dict(parent=str(parent_dir), parent_weights=weights_digest(state["model"]), parent_train_len=parent_len,
                parent_tokens=int(state["tokens_seen"]),
                parent_step=int(state["step"]), scale=seq_len / parent_len if parent_len else None, fraction=fraction,
                steps=steps, tokens=steps * tokens_per_step, rescaling=rescaling)


def write_record(run_dir: Path, record: dict) -> None:
    """finetune.json; refused in one line where the folder's record says its steps so far started from other weights
    of the parent (the parent was trained again since): a resume would mix two fine-tunes."""
    before = (read_finetune_record(run_dir) or {}).get("parent_weights")
    resumed = (run_dir / CHECKPOINT).is_file()  # steps already taken: without them there is nothing to mix
    if resumed and before is not None and before != record["parent_weights"]:
        raise UserError(f"{run_dir} was fine-tuned from other weights of {record['parent']} (finetune.json parent_weights "
                        f"{before}, the parent's now {record['parent_weights']}: trained again since); delete {run_dir} "
                        f"to fine-tune the new parent")
    atomic_write_text(run_dir / FINETUNE_JSON, json.dumps(record, indent=1) + "\n")
