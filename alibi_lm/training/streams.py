"""What a run trains on, as the trainer's stream of batches: language modelling's LMStream here, a synthetic task's
TaskStream in alibi_lm/tasks/stream.py. Each gives loss(model, step, micro, device), validate(...), the state a
checkpoint keeps (state_dict) and the run folder's vocabulary file (save_vocab)."""

from __future__ import annotations

from pathlib import Path

import torch

from ..config import TrainJob
from ..data import WindowSampler, get_batch
from ..eval.scoring import score_stream
from ..tasks import TASKS


class LMStream:
    """Language modelling as the trainer's stream of batches: random windows of L tokens of the training split
    (WindowSampler, whose state the checkpoint keeps), validation perplexity at L. tasks.stream.TaskStream is
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
