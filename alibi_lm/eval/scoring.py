"""Perplexity of a token stream at an evaluation length Lv, with exact token accounting, and the lengths Lv
that an evaluation or a probe asks for (eval_lengths).

Two protocols (Press et al., 2022, Section 4 and Appendix B):

nonoverlapping  The stream is cut into consecutive blocks of Lv input tokens; every target is scored
                once, with the context inside its block. The tail that does not fill a block is
                scored as one final shorter block, so every length scores the same N - 1 targets.
sliding         Windows of Lv tokens advance by `stride`; the first window scores all its targets,
                each later one only the targets no earlier window scored (its last `stride`), so every
                target is scored once with up to Lv - 1 tokens of context. The last window is moved
                back to end exactly at the stream's end. stride=1 is the paper's Tables 13-15.

Key-token perplexity (LongPPL, Fang et al., ICLR 2025, arXiv 2410.23771) beside the ordinary one: a target is key
when its loss with the context cut to L exceeds its loss with the window's full context by more than alpha and
its full-context loss is below beta (the reference's alpha = 2, and log-probability above -2: beta = 2 nats), the
model itself as evaluator. The cut-context losses come from short_context_nll (windows of L, advancing by L/2, as
the reference's truncation refreshed every sliding_window tokens); only targets with more than L tokens of context
in their window can be key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..metrics import perplexity


def eval_lengths(train_len: int | None, multipliers, lengths) -> list[int]:
    """multipliers x L plus explicit lengths, deduplicated and sorted (train_len None: no L, lengths only)."""
    scaled = {int(round(m * train_len)) for m in (multipliers or [])} if train_len is not None else set()
    return sorted(scaled | {int(x) for x in (lengths or [])})


@dataclass
class Window:
    start: int  # first input token of the window in the stream
    length: int  # input tokens; targets are the next `length` tokens
    first_scored: int  # targets before this offset were scored by an earlier window


def plan_windows(num_tokens: int, eval_len: int, mode: str = "nonoverlapping", stride: int | None = None) -> list[Window]:
    """Windows over a stream of num_tokens tokens, scoring each of its num_tokens - 1 targets once."""
    n_targets = num_tokens - 1
    if eval_len < 1 or n_targets < 1:
        raise ValueError(f"need eval_len >= 1 and at least 2 tokens, got eval_len={eval_len}, tokens={num_tokens}")
    if mode == "nonoverlapping":
        return [Window(s, min(eval_len, n_targets - s), 0) for s in range(0, n_targets, eval_len)]
    if mode != "sliding":
        raise ValueError(f"eval.mode must be nonoverlapping or sliding, got {mode!r}")
    if stride is None or not 1 <= stride <= eval_len:
        raise ValueError(f"eval.stride must be in [1, eval_len={eval_len}] for sliding evaluation, got {stride}")
    first = min(eval_len, n_targets)  # a stream of at most eval_len targets is this one window
    windows, scored_until = [Window(0, first, 0)], first  # targets [0, scored_until) are done
    while scored_until < n_targets:
        start = min(windows[-1].start + stride, n_targets - eval_len)
        windows.append(Window(start, eval_len, scored_until - start))
        scored_until = start + eval_len
    return windows


@dataclass
class Cost:
    """What score_stream runs for one length: windows, forward passes (batches) and tokens through the model."""

    windows: int
    forwards: int
    tokens: int  # input tokens of every window together (token-forwards): N for nonoverlapping, ~N·Lv/S sliding


def plan_cost(num_tokens: int, eval_len: int, mode: str = "nonoverlapping", stride: int | None = None,
              tokens_per_batch: int = 16384) -> Cost:
    """plan_windows' windows and score_stream's batches of a stream of num_tokens tokens, counted without
    building them (stride 1 over a whole split is one window per target)."""
    n, batch = num_tokens - 1, max(1, tokens_per_batch // eval_len)
    if mode == "nonoverlapping":
        full, tail = divmod(n, eval_len)  # the tail is one shorter window, a batch of its own
        return Cost(full + (tail > 0), math.ceil(full / batch) + (tail > 0), n)
    if n <= eval_len:  # one window, the whole stream
        return Cost(1, 1, n)
    windows = 1 + math.ceil((n - eval_len) / stride)  # all of eval_len tokens: one group of batches
    return Cost(windows, math.ceil(windows / batch), windows * eval_len)


@dataclass
class ScoreResult:
    loss: float  # mean negative log-likelihood per scored target (nats)
    ppl: float
    tokens: int  # scored targets
    position_loss: np.ndarray  # (min(Lv, N - 1),) mean loss by position inside the window (nan where unscored)
    position_count: np.ndarray  # (min(Lv, N - 1),) scored targets at each position
    key_tokens: int | None = None  # LongPPL's key targets (None: not asked for)
    key_loss: float | None = None  # their mean full-context loss (nan without any)

    @property
    def key_ppl(self) -> float | None:
        return None if self.key_loss is None else perplexity(self.key_loss)


@dataclass
class KeyTokens:
    """What score_stream needs to find LongPPL's key targets: each target's loss with its context cut to train_len
    (short_context_nll), and the thresholds."""

    short_nll: np.ndarray  # (N - 1,) per target of the stream
    train_len: int
    alpha: float = 2.0
    beta: float = 2.0


def short_context_nll(model, tokens: np.ndarray, train_len: int, tokens_per_batch: int = 16384, device="cpu",
                      autocast_dtype: torch.dtype | None = None) -> np.ndarray:
    """(N - 1,) each target's loss with at most train_len and, past the first window, at least train_len / 2 tokens
    of context: sliding windows of train_len advancing by train_len / 2 (plan_windows)."""
    windows = plan_windows(len(tokens), train_len, "sliding", max(1, train_len // 2))
    nll = np.full(len(tokens) - 1, np.nan)
    batch = max(1, tokens_per_batch // train_len)
    for length in sorted({w.length for w in windows}):
        group = [w for w in windows if w.length == length]
        for b in range(0, len(group), batch):
            chunk = group[b : b + batch]
            idx = torch.from_numpy(tokens[np.array([w.start for w in chunk])[:, None] + np.arange(length + 1)]
                                   .astype(np.int64)).to(device)  # (B, length + 1)
            with torch.no_grad(), torch.autocast(device_type=torch.device(device).type,
                                                 dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
                out = model(idx[:, :-1], targets=idx[:, 1:]).float().cpu().numpy()  # (B, length)
            for w, row in zip(chunk, out):
                nll[w.start + w.first_scored : w.start + length] = row[w.first_scored :]
    return nll


@torch.no_grad()
def score_stream(
    model,
    tokens: np.ndarray,
    eval_len: int,
    mode: str = "nonoverlapping",
    stride: int | None = None,
    tokens_per_batch: int = 16384,
    device="cpu",
    autocast_dtype: torch.dtype | None = None,
    progress=None,
    key: KeyTokens | None = None,
) -> ScoreResult:
    """Score `tokens` (1-D ids) with `model` at evaluation length eval_len; with `key`, LongPPL's key targets too."""
    windows = plan_windows(len(tokens), eval_len, mode, stride)
    key_count, key_sum = 0, 0.0
    width = min(eval_len, len(tokens) - 1)  # no window is longer than the stream's targets, whatever Lv asks
    loss_sum = np.zeros(width, dtype=np.float64)  # by position inside the window
    count = np.zeros(width, dtype=np.int64)
    # Batch size follows the length so that a batch holds about tokens_per_batch tokens at any Lv.
    batch = max(1, tokens_per_batch // width)
    groups: dict[int, list[Window]] = {}
    for w in windows:
        groups.setdefault(w.length, []).append(w)
    for length, group in groups.items():
        offsets = np.arange(length + 1)
        for b in range(0, len(group), batch):
            chunk = group[b : b + batch]
            idx = tokens[np.array([w.start for w in chunk])[:, None] + offsets].astype(np.int64)  # (B, length+1)
            idx = torch.from_numpy(idx).to(device)
            with torch.autocast(device_type=torch.device(device).type, dtype=autocast_dtype or torch.float32,
                                enabled=autocast_dtype is not None):
                nll = model(idx[:, :-1], targets=idx[:, 1:]).float().cpu().numpy()  # (B, length)
            keep = np.arange(length)[None, :] >= np.array([w.first_scored for w in chunk])[:, None]  # (B, length)
            if key is not None:  # past L tokens of context, much better than with it cut, and well predicted
                target = np.array([w.start for w in chunk])[:, None] + np.arange(length)  # (B, length) in the stream
                is_key = keep & (np.arange(length) >= key.train_len)[None, :] & (nll < key.beta)
                is_key &= key.short_nll[target] - nll > key.alpha
                key_count, key_sum = key_count + int(is_key.sum()), key_sum + float(nll[is_key].sum())
            loss_sum[:length] += np.where(keep, nll, 0.0).sum(0)
            count[:length] += keep.sum(0)
            if progress is not None:  # tokens through the model (Cost.tokens): what the time is spent on
                progress.update(len(chunk) * length)
    total = int(count.sum())
    mean = float(loss_sum.sum() / total)
    position_loss = np.where(count > 0, loss_sum / np.maximum(count, 1), np.nan)  # maximum: no 0 / 0 where unscored
    key_loss = None if key is None else (key_sum / key_count if key_count else math.nan)
    return ScoreResult(loss=mean, ppl=perplexity(mean), tokens=total, position_loss=position_loss, position_count=count,
                       key_tokens=None if key is None else key_count, key_loss=key_loss)
