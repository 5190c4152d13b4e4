"""Where a task's answers come from: each head's attention on the token an answer copies, by distance.

For a task whose answers copy an earlier token (Task.sources: the passkey's needle digits, MQAR's paired values,
copy's symbols, flip-flop's last written bit), each answer position t with source s gives, per layer and head, the
attention probability that the query at t puts on keys s - 1 .. s + 1 (SOURCE_WINDOW; never t or t - 1 as a
neighbour), and whether the answer's teacher-forced argmax is right. They are pooled by the distance t - s in token
steps (bins of powers of two: 1, 2-3, 4-7, ...) at each evaluation length Lv, into
results/<experiment>/retrieval.csv. A head whose scheme has per-head slopes (ALiBi's -m_h (i - j)) records its
slope, so that its reach, the farthest distance at which it still puts REACH_ATTENTION on the source, can be read
beside its slope. The task evaluation (evaluation.py) runs it after the scores, on eval.examples / 4 test sequences
of the task as trained per length. With randomized positions, distances are still counted in tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..results.store import key_text, read_table, replace_keyed, row_keys
from .base import Batch, Task

RETRIEVAL_CSV = "retrieval.csv"
KEY = ["task", "task_options", "position", "positions", "train_len", "eval_len", "seed", "distance", "layer", "head"]
COLUMNS = [*KEY, "attention", "token_acc", "answers", "slope", "run", "step", "weights", "commit", "device", "wall_s",
           "timestamp", "command"]
# A head may read the copied token through its neighbour (s + 1, which the first layer told what precedes it): the
# measured attention is the mass on s - 1 .. s + 1. Seen in the passkey's 2-layer ALiBi model: a retrieval head
# split 0.36 / 0.58 between a digit and the one after it.
SOURCE_WINDOW = 1
REACH_ATTENTION = 0.5  # a head "reaches" a distance where its mean attention on the copied token is at least this
PROBS_BUDGET = 2**24  # attention probabilities held at once, (B, H, T, T) per layer: ~64 MiB of float32


def distance_bin(distance: np.ndarray) -> np.ndarray:
    """The lower edge of each distance's power-of-two bin: 1, 2, 2, 4, 4, 4, 4, 8, ..."""
    return 2 ** np.floor(np.log2(np.maximum(distance, 1))).astype(np.int64)


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
    from .training import EVAL_SEED

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


def read_retrieval(path: Path) -> pd.DataFrame:
    df = read_table(path, "re-run the evaluation", what="retrieval table", columns=COLUMNS)
    df["task_options"] = df["task_options"].astype(object).fillna("").astype(str)
    return df


def measured_lengths(path: Path, identity: dict, weights: str) -> set[str]:
    """The eval lengths (as key_text) at which retrieval.csv holds this run's rows from these weights: read once for
    all lengths, the other runs' rows dropped first (a row per distance, layer and head: the biggest table)."""
    df = read_retrieval(path)
    df = df[df.reindex(columns=["weights"])["weights"].map(key_text) == key_text(weights)]  # none: an old table
    run = tuple(key_text(v) for v in identity.values())
    return {key[-1] for key in row_keys(df, [*identity, "eval_len"]) if key[:-1] == run}


def has_rows(path: Path, identity: dict, eval_len: int, weights: str) -> bool:
    """Whether retrieval.csv holds this run's rows at eval_len from these weights."""
    return key_text(eval_len) in measured_lengths(path, identity, weights)


def write_rows(path: Path, rows: list[dict]) -> None:
    """Replace this run's rows at their eval length (bins that no longer occur go too) with `rows`."""
    new = pd.DataFrame(rows).reindex(columns=COLUMNS)
    stale = [k for k in KEY if k not in ("distance", "layer", "head")]
    sort_by = ["task", "task_options", "positions", "position", "train_len", "seed", "eval_len", "distance", "layer",
               "head"]
    replace_keyed(path, new, stale, read_retrieval, sort_by)


def attention_curves(part: pd.DataFrame) -> pd.DataFrame:
    """(layer, head) x distance bin: the mean attention on the source over `part`'s rows (one scheme; pooled over
    their seeds and eval lengths, weighted by answers)."""
    weighted = part.assign(mass=part["attention"] * part["answers"])
    grouped = weighted.groupby(["layer", "head", "distance"])[["mass", "answers"]].sum()
    return (grouped["mass"] / grouped["answers"]).unstack("distance")


def reach(curves: pd.DataFrame) -> pd.Series:
    """Per (layer, head): the largest distance bin whose attention >= REACH_ATTENTION; 0 where none is."""
    reached = curves.ge(REACH_ATTENTION)
    return pd.Series([max((int(d) for d, ok in row.items() if ok), default=0) for _, row in reached.iterrows()],
                     index=curves.index, dtype=float)


def reach_by_seed(part: pd.DataFrame) -> pd.DataFrame:
    """(layer, head) x seed: each seed's reach (its own curves)."""
    return pd.DataFrame({seed: reach(attention_curves(rows)) for seed, rows in part.groupby("seed")})


def best_heads(part: pd.DataFrame) -> pd.DataFrame:
    """One scheme's rows -> per seed (index): its own best head ("layer.head": the most attention on the source summed
    over distances), that head's curve (a column per distance bin) and its reach. Heads are compared within a run
    only: head 1.2 of one seed has nothing in common with head 1.2 of another (fixed ALiBi slopes aside)."""
    out = {}
    for seed, rows in part.groupby("seed"):
        curves = attention_curves(rows)  # (layer, head) x distance
        layer, head = curves.sum(axis=1).idxmax()
        out[seed] = {"head": f"{layer}.{head}", **curves.loc[(layer, head)], "reach": reach(curves).loc[(layer, head)]}
    return pd.DataFrame.from_dict(out, orient="index")


def sloped_heads(part: pd.DataFrame) -> pd.DataFrame:
    """The heads of one scheme's rows that have a slope (ALiBi's layers, also in a mix): per (layer, head), the curve
    pooled over seeds and, per seed, its slope, reach and slope x reach (each seed's own learned slope)."""
    rows = part[part["slope"].notna()]
    if rows.empty:
        return pd.DataFrame()
    curves, reaches = attention_curves(rows), reach_by_seed(rows)
    slopes = rows.groupby(["layer", "head", "seed"])["slope"].first().unstack("seed")  # (layer, head) x seed
    return pd.concat({"curve": curves, "reach": reaches, "slope": slopes, "slope_x_reach": slopes * reaches}, axis=1)


__all__ = ["RETRIEVAL_CSV", "REACH_ATTENTION", "attention_curves", "best_heads", "distance_bin", "has_rows", "measure",
           "measured_lengths", "reach", "reach_by_seed", "read_retrieval", "rows_of", "sequences_at", "sloped_heads",
           "source_attention", "write_rows"]
