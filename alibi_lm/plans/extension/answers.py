"""The comparison's answers, computed from its rows: which column lets which scheme use 4L-16L (its perplexity at Lv
minus its own at L, paired by seed), how the best training-free method stands against the largest short fine-tune at
the same length (paired by seed), and what the rows say beside each published claim (claims.py)."""

from __future__ import annotations

import math
import re

import pandas as pd

from ...results.markdown import markdown_table
from ...results.task_learning import interval_text, seed_interval
from .tables import METHOD_NAMES, columns_of, t_interval, task_rows

ANSWER_RATIOS = (4, 16)  # the lengths the question names: 4L (the fine-tunes' s = 4) and the longest, 16L
FINETUNE = re.compile(r"ft(\d+)x([\d.]+)")


def ppl_by_seed(df: pd.DataFrame) -> pd.DataFrame:
    """Perplexity per (scheme, method, seed) and Lv / L: index (position, method, seed), one column per ratio."""
    df = columns_of(df)
    ratio = (df["eval_len"] / df["train_len"]).round().astype(int)
    return df.assign(ratio=ratio).pivot_table(index=["position", "method", "seed"], columns="ratio", values="ppl")


def direction(diff: pd.Series) -> str | None:
    """Where the 95% t interval of a paired difference over seeds lies: 'lower' (below 0), 'higher' (above 0) or
    'within noise' (it holds 0); None with fewer than 2 seeds (no interval)."""
    _, low, high, n = t_interval(diff)
    return None if n < 2 else "lower" if high < 0 else "higher" if low > 0 else "within noise"


def paired_text(diff: pd.Series, lower: str = "lower", higher: str = "higher") -> str:
    """A paired difference over seeds as 'mean [95% t interval] (n): verdict', the verdict named by `lower` /
    `higher` (direction()); no interval with a single seed, '' with none."""
    mean, low, high, n = t_interval(diff)
    if n < 2:
        return f"{mean:+.1f} (n=1)" if n else ""
    verdict = {"lower": lower, "higher": higher}.get(direction(diff), "within noise")
    return f"{mean:+.1f} [{low:+.1f}, {high:+.1f}] (n={n}): {verdict}"


CONTEXT_USE_TEXT = (
    "Perplexity at 4L and 16L minus the same weights' at L, paired by seed, with its 95% t interval; a verdict only "
    "where the interval excludes 0. The windows do not overlap, so at L the first tokens of every window see few keys "
    "and at 16L only those of every 16th: part of any fall is that, not keys past L. `streaming` never sees more than "
    "L - 1 keys back, so its fall is the size of that part: a column uses keys past L where it falls further than "
    "streaming does.\n")


def context_use_table(df: pd.DataFrame) -> str:
    """Scheme x column: perplexity at 4L and 16L minus the same weights' at L, paired by seed (CONTEXT_USE_TEXT says
    how to read it)."""
    ppl = ppl_by_seed(df)  # (position, method, seed) x ratio
    rows = []
    for (scheme, method), cell in ppl.groupby(level=["position", "method"]):
        rows.append([scheme, method, *[paired_text(cell[r] - cell[1]) if r in cell else ""
                                       for r in ANSWER_RATIOS]])
    rows.sort(key=lambda r: (r[0], r[1] != "none", r[1]))
    return markdown_table(["scheme", "column", *[f"{r}L minus L" for r in ANSWER_RATIOS]], rows)


def largest_finetune(methods: list[str], scale: int) -> str | None:
    """The fine-tune column at `scale` with the largest budget (ft4x0.125 or ft4x0.125-linear), if any."""
    tuned = [(float(m.group(2)), name) for name in methods
             if (m := FINETUNE.match(name)) and int(m.group(1)) == scale]
    return max(tuned)[1] if tuned else None


def versus_finetune_rows(df: pd.DataFrame, scale: int = 4) -> list[list[str]]:
    """Per scheme and answer length: no method, the training-free method with the lowest mean, the largest fine-tune at
    `scale` and the reference from scratch, then the fine-tune minus each of the first two, paired by seed."""
    ppl = ppl_by_seed(df)
    rows = []
    for scheme, part in ppl.groupby(level="position"):
        part = part.droplevel("position")  # (method, seed) x ratio
        methods = list(dict.fromkeys(part.index.get_level_values("method")))
        tuned = largest_finetune(methods, scale)
        for r in [r for r in ANSWER_RATIOS if r in part and tuned and "none" in methods]:
            by = part[r].unstack("method")  # (seeds, methods)
            free = by[[m for m in methods if m in METHOD_NAMES and m != "none"]].mean().dropna()
            best = free.idxmin() if len(free) else None
            ref = f"scratch{scale}x"
            rows.append([scheme, f"{r}L", f"{by['none'].mean():.1f}",
                         f"{best} {free[best]:.1f}" if best else "", f"{tuned} {by[tuned].mean():.1f}",
                         f"{by[ref].mean():.1f}" if ref in by else "",
                         paired_text(by[tuned] - by[best], "fine-tune lower", "method lower") if best else "",
                         paired_text(by[tuned] - by["none"], "fine-tune lower", "no method lower")])
    return rows


def versus_finetune_table(df: pd.DataFrame, scale: int = 4) -> str:
    return markdown_table(["scheme", "Lv", "no method", "best training-free (lowest mean)",
                           f"largest fine-tune at {scale}L", f"from scratch at {scale}L (seed 0)",
                           "fine-tune minus best training-free", "fine-tune minus no method"],
                          versus_finetune_rows(df, scale))


def task_cell(tasks: pd.DataFrame, scheme: str, method: str, ratio: int, task: str = "passkey"
              ) -> tuple[float, float, float, int]:
    """Exact match of a task's runs of `scheme` under `method` ('none' for the plain model) at ratio x L: (mean, low,
    high, seeds), the interval the task table gives (results.task_learning.seed_interval)."""
    if tasks.empty:
        return math.nan, math.nan, math.nan, 0
    tasks = task_rows(tasks)
    rows = tasks[(tasks["task"] == task) & (tasks["position"] == scheme) & (tasks["method"] == method)
                 & (tasks["eval_len"] == ratio * tasks["train_len"])]
    return seed_interval(rows["exact"], rows["examples"])


def task_cell_text(tasks: pd.DataFrame, scheme: str, method: str, ratio: int) -> str:
    cell = task_cell(tasks, scheme, method, ratio)
    return interval_text(*cell) + f" (seeds {cell[3]})" if cell[3] else "not scored"
