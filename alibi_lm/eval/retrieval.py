"""Where a task's answers come from: each head's attention on the token an answer copies, by distance.

For a task whose answers copy an earlier token (Task.sources: the passkey's needle digits, MQAR's paired values,
copy's symbols, flip-flop's last written bit), each answer position t with source s gives, per layer and head, the
attention probability that the query at t puts on keys s - 1 .. s + 1 (SOURCE_WINDOW; never t or t - 1 as a
neighbour), and whether the answer's teacher-forced argmax is right. They are pooled by the distance t - s in token
steps (bins of powers of two: 1, 2-3, 4-7, ...) at each evaluation length Lv, into
results/<experiment>/retrieval.csv (alibi_lm/results/retrieval_store.py). A head whose scheme has per-head slopes
(ALiBi's -m_h (i - j)) records its
slope, so that its reach, the farthest distance at which it still puts REACH_ATTENTION on the source, can be read
beside its slope. The task evaluation (tasks.py) runs it after the scores, on eval.examples / 4 test sequences
of the task as trained per length. With randomized positions, distances are still counted in tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np
import torch

from ..results.retrieval_store import SOURCE_WINDOW, distance_bin
from ..tasks.base import Batch, Task
from ..tasks.stream import EVAL_SEED

PROBS_BUDGET = 2**24  # attention probabilities held at once, (B, H, T, T) per layer: ~64 MiB of float32


def sequences_at(base: int, train_len: int, length: int) -> int:
    """How many test sequences to measure at `length`: `base` up to 4L, then half as many per doubling, down to
    base / 4 (16L). The explicit attention costs Lv^2 per sequence, and a long sequence spreads more answers over
    the far distance bins, which only long lengths reach."""
    return max(1, base // 4, int(base * min(1.0, 4 * train_len / length)))


@dataclass
class RetrievalSums:
    """Per distance bin: the summed attention on the source (layers, heads), right answers and answers."""

    attention: dict[int, np.ndarray] = field(default_factory=dict)  # bin -> (n_layer, H)
    right: dict[int, int] = field(default_factory=dict)
    answers: dict[int, int] = field(default_factory=dict)

    def add(self, bins: np.ndarray, attention: np.ndarray, right: np.ndarray) -> None:
        """bins (N,), attention (n_layer, N, H), right (N,) bool: one batch's answers."""
        for b in np.unique(bins):
            at = bins == b
            self.attention[int(b)] = self.attention.get(int(b), 0) + attention[:, at].sum(1)
            self.right[int(b)] = self.right.get(int(b), 0) + int(right[at].sum())
            self.answers[int(b)] = self.answers.get(int(b), 0) + int(at.sum())


@torch.no_grad()
def source_attention(model, batch: Batch, sources: np.ndarray, positions, device):
    """One batch: (distance (N,), attention on the source (n_layer, N, H), right (N,) bool) over its N answers.
    sources: Task.sources of the batch, (B, T)."""
    b, t = np.nonzero(sources >= 0)  # (N,) each: the answers
    s = sources[b, t]
    logits, probs = model(batch.inputs.to(device), return_attention=True, positions=positions)  # probs: (B, H, T, T)
    bi, ti, si = (torch.from_numpy(a).to(device) for a in (b, t, s))
    # s - 1 >= 0 (<bos> comes first) and s + 1 <= t (a source precedes its answer): no index leaves the sequence.
    # A neighbour that is the query itself or the key before it is left out: attending there is recency, not retrieval.
    keys = [(si + d, (si + d < ti - 1) | (d == 0)) for d in range(-SOURCE_WINDOW, SOURCE_WINDOW + 1)]  # (N,) each
    attention = torch.stack([sum(p[bi, :, ti, j] * counted[:, None] for j, counted in keys)
                             for p in probs])  # (n_layer, N, H)
    right = logits[bi, ti].argmax(-1) == batch.targets.to(device)[bi, ti]  # (N,)
    return t - s, attention.float().cpu().numpy(), right.cpu().numpy()


def head_slopes(model) -> list[list[float | None]]:
    """(n_layer, H): each layer's scheme's per-head slope where it has one (ALiBi, fixed or learned), else None."""
    schemes = model.schemes()
    out = []
    for name in model.layer_scheme:
        slopes = getattr(schemes[name], "slopes", None)  # duck-typed: only linear-bias schemes define it
        out.append(slopes.tolist() if isinstance(slopes, torch.Tensor) else [None] * model.cfg.n_head)
    return out


def measure(model, task: Task, policy, length: int, examples: int, device) -> RetrievalSums:
    """The sums over `examples` test sequences of `length` (the task as trained), a few at a time."""
    sums = RetrievalSums()
    size = max(1, min(examples, PROBS_BUDGET // (model.cfg.n_head * length * length)))
    for index, start in enumerate(range(0, examples, size)):
        batch = task.batch(EVAL_SEED, "test", index, min(size, examples - start), length)
        sources = task.sources(batch.tokens.numpy(), batch.answer.numpy())
        positions = policy.draw(EVAL_SEED, "test", index, length, device)
        distance, attention, right = source_attention(model, batch, sources, positions, device)
        sums.add(distance_bin(distance), attention, right)
    return sums


def rows_of(sums: RetrievalSums, key: dict, slopes, provenance: dict, wall_s: float, command: str) -> list[dict]:
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    rows = []
    for b in sorted(sums.answers):
        n = sums.answers[b]
        for layer, per_head in enumerate(sums.attention[b] / n):
            rows += [dict(key, distance=b, layer=layer, head=h, attention=float(a), token_acc=sums.right[b] / n,
                          answers=n, slope=slopes[layer][h], **provenance, wall_s=wall_s, timestamp=now,
                          command=command)
                     for h, a in enumerate(per_head)]
    return rows
