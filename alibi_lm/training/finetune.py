"""A short fine-tune of a trained run at a longer length (train.init_from, train.finetune_fraction): the baseline that
training-free extension is measured against (Position Interpolation's 1,000 steps, YaRN's 400, LCEG's 1B tokens).

The new run starts from the parent's weights (its checkpoint; a fresh optimizer and schedule), trains at its own
train.seq_len = s L with the parent's scheme (RoPE's rescalings are evaluation-time methods here, so a RoPE parent
is fine-tuned as it is), for finetune_fraction of the tokens the parent trained on. Its folder holds finetune.json:
the parent, its L and tokens, s, the fraction, the steps; the evaluation reads it and labels the run's rows
<scheme>+ft<s>x<fraction> at the parent's L, so that they sit beside the parent's rows at the same Lv / L.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from ..checkpoint import CHECKPOINT, atomic_write_text, load_checkpoint, read_status
from ..errors import UserError
from ..model import EXECUTION_FIELDS, LMConfig
from ..subjects.native import FINETUNE_JSON


def parent_of(parent_dir: Path) -> dict:
    """The parent's checkpoint state; a one-line UserError for a folder that is not a completed run."""
    if not (parent_dir / CHECKPOINT).is_file() or read_status(parent_dir).get("status") != "completed":
        raise UserError(f"train.init_from={parent_dir} is not a completed run folder (checkpoint.pt and status.json "
                        f"saying completed); train it first, or point at another run")
    return load_checkpoint(parent_dir / CHECKPOINT, map_location="cpu")


def finetune_steps(fraction: float, parent_tokens: int, tokens_per_step: int) -> int:
    """Steps that spend `fraction` of the parent's training tokens (at least one)."""
    return max(1, math.ceil(fraction * parent_tokens / tokens_per_step))


def start_from_parent(model, state: dict, parent_dir: Path) -> None:
    """Load the parent's weights into `model`, whose config must be the parent's (bar execution fields)."""
    saved = dataclasses.asdict(LMConfig(**state["model_config"]))
    now = dataclasses.asdict(model.cfg)
    diff = [f"{k}={saved[k]!r} there, {now[k]!r} here" for k in now if k not in EXECUTION_FIELDS and saved[k] != now[k]]
    if diff:
        raise UserError(f"train.init_from={parent_dir} has another model config ({diff[0]}); fine-tune with the "
                        f"parent's model and position settings")
    model.load_state_dict(state["model"])


def write_record(run_dir: Path, parent_dir: Path, state: dict, seq_len: int, fraction: float, steps: int,
                 tokens_per_step: int) -> dict:
    parent_len = int(state["config"]["train"]["seq_len"]) if state.get("config") else None
    record = dict(parent=str(parent_dir), parent_train_len=parent_len, parent_tokens=int(state["tokens_seen"]),
                  parent_step=int(state["step"]), scale=seq_len / parent_len if parent_len else None,
                  fraction=fraction, steps=steps, tokens=steps * tokens_per_step)
    atomic_write_text(run_dir / FINETUNE_JSON, json.dumps(record, indent=1) + "\n")
    return record
