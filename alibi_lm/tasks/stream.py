"""A synthetic task as the trainer's stream of batches (the counterpart of language modelling's LMStream in
alibi_lm/train.py): each micro-batch is a pure function of (seed, step, micro-batch, rank), so a resumed run
sees exactly the batches, lengths and randomized positions it would have seen, and nothing needs saving.

Validation is the suite's learning criterion, measured, never a reason to stop by itself: exact match (every
answer token right) at length L on VALID_SEQUENCES fixed sequences of the valid split, the same for every run.
On 2,048 sequences a last-bit difference between two machines moves it by a sequence or two, not by the 5-10%
that four batches of 32 could swing (the suite's first protocol stopped on those and a rerun stopped 500 steps
earlier)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..checkpoint import atomic_write_text
from .base import SPLITS, Batch, Task, batch_rng, random_positions

VALID_SEQUENCES = 2048  # the periodic validation: this many sequences at length L, the same at every validation
VALID_BATCH = 256  # sequences per validation batch
LEARNED_AT = 0.95  # exact match at L that counts as having learned the task (the suite's criterion)
KEPT_DIR = "checkpoints"  # train.keep_checkpoints_every: the weights of every N steps, scored over training


def kept_path(run_dir: Path, step: int) -> Path:
    """Where train.keep_checkpoints_every keeps the weights of `step`: run_dir/checkpoints/step-000500.pt."""
    return Path(run_dir) / KEPT_DIR / f"step-{step:06d}.pt"


def kept_steps(run_dir: Path) -> list[tuple[int, Path]]:
    """The (step, path) of every kept checkpoint of a run, by step."""
    found = [(int(m.group(1)), p) for p in (Path(run_dir) / KEPT_DIR).glob("step-*.pt")
             if (m := re.fullmatch(r"step-(\d+)\.pt", p.name))]
    return sorted(found)


def first_met(log_lines: list[str], metric: str = "val_exact", target: float = LEARNED_AT) -> dict:
    """status.json's record of the criterion: the first validation step whose `metric` reached `target` (None: never
    within the budget), and the rule itself."""
    steps = [r["step"] for r in map(json.loads, log_lines) if r.get(metric) is not None and r[metric] >= target]
    return {"learned_at_step": steps[0] if steps else None, "criterion": f"{metric} >= {target} at L"}
EVAL_SEED = 0  # the valid/test sequences' seed: every run, whatever its own seed, is scored on the same ones


def positions_rng(seed: int, split: str, index: int, length: int) -> np.random.Generator:
    """The generator of a batch's randomized positions: a stream of its own beside the batch's tokens."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), SPLITS[split], int(index), int(length), 1]))


@dataclass
class PositionPolicy:
    """Which positions the scheme sees: 0..T-1, or (random) a sorted random subset of [0, max_position)."""

    kind: str = "sequential"
    max_position: int | None = None

    @property
    def label(self) -> str:
        """The results rows' positions column."""
        return "sequential" if self.kind == "sequential" else f"random-{self.max_position}"

    def draw(self, seed: int, split: str, index: int, length: int, device) -> torch.Tensor | None:
        if self.kind == "sequential":
            return None
        chosen = random_positions(positions_rng(seed, split, index, length), length, self.max_position)
        return torch.from_numpy(chosen).to(device)  # (T,)


def answer_loss(model, batch: Batch, positions, device) -> torch.Tensor:
    """The mean loss over the batch's answer positions only (prompts, filler and padding are not trained on)."""
    x, y, answer = batch.inputs.to(device), batch.targets.to(device), batch.answer.to(device)  # (B, T) each
    nll = model(x, targets=y, positions=positions)  # (B, T)
    if not bool(answer.any()):  # a short flip-flop batch may hold no read: nothing to learn, not a NaN mean
        return nll.sum() * 0.0
    return nll[answer].mean()


class TaskStream:
    """Training and validation batches of `task` for the Trainer: lengths uniform in [min_len, L] per step (so that
    no answer sits at a fixed position), exact match at L on fixed validation sequences (val_exact)."""

    metric = "val_exact"

    def __init__(self, task: Task, train_cfg, seed: int, rank: int = 0, world: int = 1):
        self.task, self.tc, self.seed, self.rank, self.world = task, train_cfg, seed, rank, world
        self.train_task = task.for_training()  # the task itself, or a mixture of easier settings (MQAR's min_pairs)
        self.min_len = train_cfg.min_seq_len or max(task.min_length, train_cfg.seq_len // 4)
        self.positions = PositionPolicy(train_cfg.positions, train_cfg.max_position)
        self.vocab_size = task.vocab_size

    def loss(self, model, step: int, micro: int, device) -> torch.Tensor:
        """The answer loss of micro-batch `micro` of optimizer step `step` (0-based) on this rank."""
        index = (step * self.tc.grad_accum + micro) * self.world + self.rank
        length = int(batch_rng(self.seed, "train", index, 0).integers(self.min_len, self.tc.seq_len + 1))
        batch = self.train_task.batch(self.seed, "train", index, self.tc.batch_size, length)
        return answer_loss(model, batch, self.positions.draw(self.seed, "train", index, length, device), device)

    @torch.no_grad()
    def validate(self, model, device, autocast_dtype=None) -> float:
        """Exact match at length L (the share of sequences with every answer token right) on VALID_SEQUENCES fixed
        validation sequences (seed EVAL_SEED: the same for every run)."""
        exact = total = 0
        L = self.tc.seq_len
        for index, start in enumerate(range(0, VALID_SEQUENCES, VALID_BATCH)):
            batch = self.task.batch(EVAL_SEED, "valid", index, min(VALID_BATCH, VALID_SEQUENCES - start), L)
            positions = self.positions.draw(EVAL_SEED, "valid", index, L, device)
            with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                h = model.hidden(batch.inputs.to(device), positions=positions)  # (B, T, D)
            answer, targets = batch.answer.to(device), batch.targets.to(device)  # (B, T) each
            right = torch.zeros_like(answer)
            right[answer] = model.vocab.logits(h[answer]).argmax(-1) == targets[answer]
            exact += int(((right == answer).all(1) & answer.any(1)).sum())
            total += int(answer.any(1).sum())
        return exact / max(total, 1)

    def state_dict(self) -> dict:
        return {}  # batches follow from the step: nothing to save

    def load_state_dict(self, state: dict) -> None:
        pass

    def save_vocab(self, run_dir) -> None:
        """run_dir/vocab.txt: the task's tokens, id i on line i + 1 (to read its sequences)."""
        atomic_write_text(run_dir / "vocab.txt", "\n".join(self.task.vocab) + "\n")
