"""The published claims the comparison stands beside, each with what its rows say on the same question: the claim
(quoted from its paper or reference code), the measurement here (computed from the rows), and whether it points the
same way. Where it does not, `differs` says why this setting may differ; that text is shown only then."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from .answers import direction, largest_finetune, paired_text, ppl_by_seed, task_cell, task_cell_text

SCALE_NOTE = ("here the models are 2-layer, trained for 300 steps at L = 64 on WikiText-2 (perplexity ~470), where "
              "the published results are 7B models at L = 2k-4k")


@dataclass(frozen=True)
class Claim:
    source: str
    text: str
    measure: Callable[[pd.DataFrame, pd.DataFrame], tuple[str, bool | None]]  # (what the rows say, same direction?)
    differs: str


def growth(df: pd.DataFrame, scheme: str, method: str, ratio: int = 16) -> pd.Series:
    """Per seed: perplexity at ratio x L minus at L under `method` (empty where not scored)."""
    ppl = ppl_by_seed(df)
    if (scheme, method) not in ppl.index.droplevel("seed") or ratio not in ppl:
        return pd.Series(dtype=float)
    cell = ppl.loc[(scheme, method)]  # (seeds,) x ratio
    return cell[ratio] - cell[1]


def rerope_keeps_improving(df: pd.DataFrame, tasks: pd.DataFrame) -> tuple[str, bool | None]:
    diffs = {m: growth(df, "rope", m) for m in ("rerope", "leaky_rerope")}
    said = "; ".join(f"rope {m} 16L minus L {paired_text(d)}" for m, d in diffs.items())
    ways = [direction(d) for d in diffs.values() if len(d)]
    return said, (None if not ways or None in ways else all(w == "lower" for w in ways))


def self_extend_passkey(df: pd.DataFrame, tasks: pd.DataFrame) -> tuple[str, bool | None]:
    with_method, without = task_cell(tasks, "rope", "self_extend", 2), task_cell(tasks, "rope", "none", 2)
    said = (f"passkey task model, rope at 2L: self_extend {task_cell_text(tasks, 'rope', 'self_extend', 2)}, no method "
            f"{task_cell_text(tasks, 'rope', 'none', 2)}")
    return said, (with_method[1] > without[2] if with_method[3] and without[3] else None)


def stays_flat(method: str) -> Callable[[pd.DataFrame, pd.DataFrame], tuple[str, bool | None]]:
    """The claim of a stable perplexity past L, for rope and alibi under `method`: the same way where neither's
    16L-minus-L interval lies above 0."""
    def measure(df: pd.DataFrame, tasks: pd.DataFrame) -> tuple[str, bool | None]:
        diffs = {s: growth(df, s, method) for s in ("rope", "alibi")}
        said = "; ".join(f"{s} {method} 16L minus L {paired_text(d)}" for s, d in diffs.items())
        ways = [direction(d) for d in diffs.values() if len(d)]
        return said, (None if not ways or None in ways else "higher" not in ways)
    return measure


def finetune_beats_lm_infinite(df: pd.DataFrame, tasks: pd.DataFrame) -> tuple[str, bool | None]:
    """At 4L, per scheme: the largest fine-tune at 4L minus LM-Infinite, paired by seed; which is lower where the
    interval excludes 0."""
    ppl, tally = ppl_by_seed(df), {"fine-tune lower": [], "method lower": [], "within noise": []}
    for scheme, part in ppl.groupby(level="position"):
        by = part.droplevel("position")[4].unstack("method") if 4 in part else pd.DataFrame()  # (seeds, methods)
        tuned = largest_finetune(list(by.columns), 4)
        if tuned and "lm_infinite" in by:
            way = direction(by[tuned] - by["lm_infinite"])
            if way:
                tally[{"lower": "fine-tune lower", "higher": "method lower"}.get(way, way)].append(scheme)
    said = "at 4L, largest fine-tune at 4L minus lm_infinite, paired by seed: " + "; ".join(
        f"{v} in {', '.join(s) or 'none'}" for v, s in tally.items())
    decided = len(tally["fine-tune lower"]) + len(tally["method lower"])
    return said, (len(tally["fine-tune lower"]) > len(tally["method lower"]) if decided else None)


CLAIMS = [
    Claim("ReRoPE (bojone/rerope README, Llama-2-7B, L = 4k)",
          "loss 1.497 at 4k; plain RoPE 8.86 at 8k, NTK 1.54, ReRoPE (w = 1024) 1.427 at 8k and 1.400 at 16k: a RoPE "
          "model keeps improving past L under ReRoPE.", rerope_keeps_improving,
          "ReRoPE's window is w = L/8 here (the reference's 512 of 4k); every key beyond it sits at distance w, so "
          "the keys past L carry no order, and far tokens help a model at perplexity ~470 little"),
    Claim("Self-Extend (datamllab/LongLM README)",
          "passkey answered at 5k tokens by Llama-2 (L = 4k) and 10k by Mistral, where the base model fails.",
          self_extend_passkey, "the passkey task models are one seed each so far"),
    Claim("LM-Infinite (Han et al., NAACL 2024)",
          "zero-shot to 128k tokens with stable perplexity, on RoPE models and on MPT (ALiBi), whose far keys get "
          "ALiBi's bias at the distance limit.", stays_flat("lm_infinite"),
          "its local branch is L keys and its global branch 10 here, as the reference scales them"),
    Claim("StreamingLLM (Xiao et al., ICLR 2024)",
          "stable perplexity to 4M tokens with 4 sinks; window attention without the sinks collapses once the first "
          "tokens are evicted; the authors say it does not extend the context window.", stays_flat("streaming"),
          "the window here is L - 5 keys besides the 4 sinks"),
    Claim("LCEG (Lu et al. 2024)",
          "exact-attention fine-tuning works within its range, approximate attention (LM-Infinite, Landmark) "
          "underperforms it, and perplexity tracks downstream scores only for exact attention.",
          finetune_beats_lm_infinite,
          "the fine-tunes here are a few dozen steps (at most 12.5% of a 300-step run), far from LCEG's budgets"),
]


def claim_lines(df: pd.DataFrame, tasks: pd.DataFrame) -> list[str]:
    """One markdown item per claim: the claim, the rows' answer, and whether they point the same way (and why not)."""
    lines = []
    for claim in CLAIMS:
        said, same = claim.measure(df, tasks)
        verdict = {True: "same direction", False: f"not the same direction; why it may differ: {claim.differs}; "
                   f"{SCALE_NOTE}", None: "not decided by these rows (a seed or a column is missing)"}[same]
        lines.append(f"{claim.source}: {claim.text} Here: {said or 'not scored'}. {verdict[0].upper()}{verdict[1:]}.")
    return lines
