"""Context-use curve: the loss of a target as a function of how many tokens of context it has.

Windows of W + 1 tokens start every `stride` tokens of the split (default W / 4) and every one of their
W targets is scored: the target at window position p has c = p + 1 tokens of context (its input token and
the p before it), all of them at positions 0..p, so the loss at context c does not depend on W. The
window lengths are Lv = context.multiplier x L, Lv / 4, Lv / 16, ... (context.levels of them, none
shorter than MIN_WINDOW), and their sums add up: with one length, a short context would get only
N / stride targets (a few hundred on WikiText-2's validation split, +-0.17 nats), against thousands in
the wide bins at long contexts, and the rule below could not see context use there at all. A window of
W adds only the contexts c > W' of the next shorter length W' = W / 4: every start of the W windows is
also a start of the W' windows (whose strides divide theirs, or equal them), and at c <= W' both see the
same tokens at the same positions, so the W window's losses there would only repeat the W' window's and
shrink the standard errors without adding information. Every length costs about 4 N token-forwards. The
sums go into log-spaced bins of c (context.bins_per_octave per doubling).

One number per run, the saturation context c*: the smallest bin context c such that no later bin is
better by more than eps plus z standard errors of the difference, i.e. for every c' > c
    loss(c') >= loss(c) - eps - z * sqrt(se(c)^2 + se(c')^2)
(context.eps in nats, context.z; z = 0 is the plain rule loss(c') >= loss(c) - eps). A bin's standard error
is that of its mean over its distinct (target, context) pairs, taken as independent (neighbouring targets
of one window are not quite, so it is a little optimistic); the z term keeps sampling noise (about 3.5 nats
/ sqrt(n) per bin: +-0.1 nats for the one-context bins at small c) from passing for context use. A model
that uses context beyond its training length L has c* > L; c* = the last bin means context still helped
at Lv. Beside it, the gain beyond L: the loss in the bin holding c = L minus the loss in the last bin
(the longest contexts, near Lv), with its standard error: a fixed pair of bins, so a flat curve gives 0
on average (the lowest bin beyond L would be biased towards a gain by the noise it is picked from).
"""

from __future__ import annotations

import math
import time
from datetime import datetime, timezone

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from ..costs import FirstBatchEstimate
from ..errors import UserError
from ..subjects import NOT_APPLICABLE, Subject

MIN_WINDOW = 16  # shorter windows add little: their contexts are in the first, one-wide bins already


@torch.no_grad()
def context_sums(subject: Subject, tokens: np.ndarray, eval_len: int, stride: int, tokens_per_batch: int,
                 progress=None):
    """Per window position p (context p + 1): (loss sum (Lv,), loss^2 sum (Lv,), count (Lv,))."""
    n_windows = max(0, (len(tokens) - 1 - eval_len) // stride + 1)  # windows of Lv + 1 tokens inside the split
    if n_windows == 0:
        raise UserError(f"the split has {len(tokens)} tokens, fewer than a context-use window of Lv + 1 = "
                        f"{eval_len + 1}; lower context.multiplier or raise context.max_tokens")
    starts = np.arange(n_windows) * stride
    total, total_sq = np.zeros(eval_len), np.zeros(eval_len)
    batch, offsets = max(1, tokens_per_batch // eval_len), np.arange(eval_len + 1)
    for b in range(0, n_windows, batch):
        idx = np.asarray(tokens[starts[b : b + batch, None] + offsets], dtype=np.int64)  # (B, Lv + 1)
        idx = torch.from_numpy(idx).to(subject.device)
        with subject.autocast():
            nll = subject.scorer.loss(idx[:, :-1], idx[:, 1:]).double().cpu().numpy()  # (B, Lv)
        total += nll.sum(0)
        total_sq += (nll**2).sum(0)
        if progress is not None:
            progress.update(idx.numel() - len(idx))  # tokens through the model: B x Lv
    return total, total_sq, np.full(eval_len, n_windows)


def window_lengths(eval_len: int, levels: int) -> list[int]:
    """Lv, Lv / 4, Lv / 16, ...: `levels` of them at most, none shorter than MIN_WINDOW (Lv itself always)."""
    lengths = [eval_len]
    while len(lengths) < levels and lengths[-1] // 4 >= MIN_WINDOW:
        lengths.append(lengths[-1] // 4)
    return lengths


def multi_resolution_sums(subject: Subject, tokens, eval_len: int, levels: int, stride, tokens_per_batch: int):
    """context_sums over every window length of window_lengths, added up position by position: a window of W
    adds its contexts c > W / 4 only (the shorter windows have the rest; module docstring), the shortest
    window all of its contexts 1..W: (loss sum (Lv,), loss^2 sum (Lv,), count (Lv,))."""
    total, total_sq, count = np.zeros(eval_len), np.zeros(eval_len), np.zeros(eval_len, dtype=np.int64)
    lengths = window_lengths(eval_len, levels)  # Lv, Lv / 4, ...
    steps = [int(stride) if stride is not None else max(1, w // 4) for w in lengths]
    work = sum(max(0, (len(tokens) - 1 - w) // s + 1) * w for w, s in zip(lengths, steps))  # tokens through the model
    bar = tqdm(total=work, unit="tok", unit_scale=True, desc="context use", dynamic_ncols=True)
    progress = FirstBatchEstimate(bar, "tokens through the model", " (at the longest window; shorter ones cost less)")
    for window, shorter, step in zip(lengths, [*lengths[1:], 0], steps):
        t, t2, n = context_sums(subject, tokens, window, step, tokens_per_batch, progress)  # (window,) each
        total[shorter:window] += t[shorter:]
        total_sq[shorter:window] += t2[shorter:]
        count[shorter:window] += n[shorter:]
    bar.close()
    return total, total_sq, count


def log_bins(eval_len: int, per_octave: int) -> np.ndarray:
    """Bin edges on the context c in [1, Lv]: bin k holds edges[k] <= c < edges[k + 1]; log-spaced, the
    first bins one context length wide."""
    n = int(np.ceil(np.log2(eval_len + 1) * per_octave))
    return np.unique(np.round(np.geomspace(1, eval_len + 1, n + 1)).astype(int))


def binned_curve(total, total_sq, count, per_octave: int) -> pd.DataFrame:
    """Per-position sums -> one row per bin: context_lo, context_hi (inclusive), context (mean c), loss, se, count."""
    edges, context = log_bins(len(count), per_octave), np.arange(1, len(count) + 1)
    rows = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = (context >= lo) & (context < hi)
        n = count[sel].sum()
        mean = total[sel].sum() / n
        var = max(total_sq[sel].sum() / n - mean**2, 0.0)
        rows.append(dict(context_lo=int(lo), context_hi=int(hi - 1), context=float((context[sel] * count[sel]).sum() / n),
                         loss=float(mean), se=float(np.sqrt(var / n)), count=int(n)))
    return pd.DataFrame(rows)


def saturation_context(context, loss, eps: float, se=None, z: float = 0.0) -> float:
    """The smallest context c_i with loss_j >= loss_i - eps - z sqrt(se_i^2 + se_j^2) for all j > i
    (bins in increasing context; se None: the plain rule)."""
    context, loss = np.asarray(context, dtype=float), np.asarray(loss, dtype=float)
    se = np.zeros_like(loss) if se is None else np.asarray(se, dtype=float)
    margin = eps + z * np.sqrt(se[:, None] ** 2 + se[None, :] ** 2)  # (K, K): i, j
    later = np.triu(np.ones((len(loss), len(loss)), dtype=bool), k=1)  # j > i
    better = later & (loss[None, :] < loss[:, None] - margin)  # bin j beats bin i
    return float(context[np.argmax(~better.any(1))])  # the last bin always qualifies


def summary(curve: pd.DataFrame, train_len: int, eps: float, z: float = 0.0) -> dict:
    """One run's numbers: c*, the loss in the bin holding c = L, the loss in the last bin (the longest
    contexts) and how much lower that is, with its standard error."""
    curve = curve.sort_values("context")
    c_star = saturation_context(curve["context"], curve["loss"], eps, curve["se"], z)
    at_L = curve[(curve["context_lo"] <= train_len) & (curve["context_hi"] >= train_len)]
    last = curve.iloc[-1]
    loss_L, se_L = (float(at_L[c].iloc[0]) for c in ("loss", "se")) if len(at_L) else (np.nan, np.nan)
    return dict(c_star=c_star, c_star_over_L=c_star / train_len, last_context=float(last["context"]),
                loss_at_L=loss_L, loss_at_end=float(last["loss"]), gain_beyond_L=loss_L - float(last["loss"]),
                gain_beyond_L_se=float(np.hypot(se_L, last["se"])))


def settings(cfg) -> str:
    """The context config a curve was made with, as its rows record it: a curve made with other settings is
    not done (report.context_done)."""
    return (f"multiplier={float(cfg.multiplier):g} stride={cfg.stride or 'auto'} levels={int(cfg.levels)} "
            f"max_tokens={cfg.max_tokens or 'all'} bins_per_octave={int(cfg.bins_per_octave)} "
            f"eps={float(cfg.eps):g} z={float(cfg.z):g}")


def curve_length(subject: Subject, cfg) -> tuple[int, str]:
    """Lv of a model's curve, and a note when its position table's end cuts it short (learned)."""
    eval_len = int(round(cfg.multiplier * subject.identity["train_len"]))
    table = getattr(subject.scorer, "max_positions", None)
    if table is not None and table < eval_len:
        return table, f"curve up to context {table} only: the position table's end"
    return eval_len, ""


def curve_tokens(subject: Subject, cfg, split: str):
    return subject.tokens(split)[: None if cfg.max_tokens is None else int(cfg.max_tokens) + 1]


def check_fits(subject: Subject, cfg, split: str) -> None:
    """Before any forward: one window of Lv + 1 tokens fits in the (cut) split."""
    eval_len, tokens = curve_length(subject, cfg)[0], curve_tokens(subject, cfg, split)
    if len(tokens) < eval_len + 1:
        raise UserError(f"the {split} split has {len(tokens)} tokens, fewer than a context-use window of Lv + 1 = "
                        f"{eval_len + 1}; lower context.multiplier or raise context.max_tokens")


def plan(subject: Subject, cfg, split: str, tokens_per_batch: int) -> str:
    """The line printed before the curve runs: windows and forward passes of each window length."""
    eval_len, tokens = curve_length(subject, cfg)[0], curve_tokens(subject, cfg, split)
    parts, total = [], 0
    for window in window_lengths(eval_len, int(cfg.levels)):
        step = int(cfg.stride) if cfg.stride is not None else max(1, window // 4)
        n_windows = max(0, (len(tokens) - 1 - window) // step + 1)  # as context_sums
        forwards = math.ceil(n_windows / max(1, tokens_per_batch // window))
        total += forwards
        parts.append(f"W={window}: {n_windows:,} windows in {forwards:,} forward passes")
    windows = len(window_lengths(eval_len, int(cfg.levels)))
    fewer = (f" (context.levels={int(cfg.levels)} asks for {int(cfg.levels)}; at Lv = {eval_len} only {windows} are "
             f"{MIN_WINDOW} tokens or longer, the rows' levels)") if windows < int(cfg.levels) else ""
    return f"context-use plan: {'; '.join(parts)}; {total:,} forward passes in all{fewer}"


def probe(subject: Subject, cfg, split: str, tokens_per_batch: int) -> list[dict]:
    """The curve of one model (cfg: the context config section) as rows, one per bin. A model with a
    position table shorter than Lv (learned) gets its curve up to the table's end, with a note."""
    eval_len, note = curve_length(subject, cfg)
    stride = int(cfg.stride) if cfg.stride is not None else max(1, eval_len // 4)
    tokens = curve_tokens(subject, cfg, split)
    common = dict(subject.identity, split=split, eval_len=eval_len, stride=stride,
                  levels=len(window_lengths(eval_len, int(cfg.levels))), eps=float(cfg.eps), z=float(cfg.z),
                  settings=settings(cfg))
    t0 = time.perf_counter()
    try:
        subject.scorer.check_positions(eval_len)
        sums = multi_resolution_sums(subject, tokens, eval_len, int(cfg.levels), cfg.stride, tokens_per_batch)
    except NOT_APPLICABLE as e:
        curve, note = pd.DataFrame([{}]), f"not applicable: {str(e).splitlines()[0][:160]}"
    else:
        curve = binned_curve(*sums, int(cfg.bins_per_octave))
    stamp = dict(wall_s=round(time.perf_counter() - t0, 3), timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    note = "; ".join(filter(None, (subject.note, note)))  # a failed run scored on purpose says so
    return [dict(common, **r, note=note, **stamp) for r in curve.to_dict("records")]
