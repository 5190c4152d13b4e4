"""The task suite's protocol: validation is exact match at L on VALID_SEQUENCES fixed sequences (the learning
criterion, counted against an independent count), the same sequences whatever the run's seed."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from alibi_lm.tasks import build_task
from alibi_lm.tasks.training import EVAL_SEED, VALID_BATCH, VALID_SEQUENCES, TaskStream


class Lookup(torch.nn.Module):
    """Hidden states that are the one-hot next tokens of the validation batches it was shown (argmax through an
    identity output layer reads them back), wrong at the targets `wrong` lists as (batch index, row, position)."""

    def __init__(self, task, L: int, wrong: list[tuple[int, int, int]]):
        super().__init__()
        self.states, V = {}, task.vocab_size
        for index in range(VALID_SEQUENCES // VALID_BATCH):
            batch = task.batch(EVAL_SEED, "valid", index, VALID_BATCH, L)
            predicted = batch.targets.clone()  # (B, T)
            for b, row, t in wrong:
                if b == index:
                    predicted[row, t] = (predicted[row, t] + 1) % V
            self.states[batch.inputs.numpy().tobytes()] = torch.nn.functional.one_hot(predicted, V).float()
        self.vocab = SimpleNamespace(logits=lambda h: h)

    def hidden(self, x, positions=None):
        return self.states[x.numpy().tobytes()]  # (B, T, V)


def test_validation_is_exact_match_on_the_fixed_sequences_whatever_the_seed():
    task = build_task("copy")
    L, first = 64, 64 - task.options.symbols - 1  # the first answer target at L
    tc = SimpleNamespace(seq_len=L, min_seq_len=None, positions="sequential", max_position=None, batch_size=32)
    # three wrong answer tokens in two sequences, and one wrong prediction at a non-answer position (not counted)
    model = Lookup(task, L, [(0, 3, first), (0, 3, first + 2), (5, 7, first + 15), (2, 0, 1)])
    for seed in (0, 1):
        assert TaskStream(task, tc, seed=seed).validate(model, torch.device("cpu")) == (VALID_SEQUENCES - 2) / VALID_SEQUENCES
    assert VALID_SEQUENCES >= 2000
