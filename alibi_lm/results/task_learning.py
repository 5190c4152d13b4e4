"""Learning at L apart from extrapolating past it: the task suite's main table (tasks.md, first per task).

A seed has *learned* a task when its exact match at Lv = L (the test cell, eval.examples sequences) reaches
LEARNED_AT. A scheme's accuracy past L is then given twice: over its learned seeds only (what the scheme does with
positions beyond L once it can do the task at all) and over all seeds (what a run of it gives). A column mixing
learned and unlearned seeds mostly counts how many seeds learned: it is never the basis of a finding.

Each cell is the mean exact match over the seeds with a 95% interval that holds both sources of error: the seeds'
spread (Student's t over seeds, where there are two or more) and the sampling of the test sequences (the Wilson
interval of the pooled counts): the wider of the two on each side. The relative effective length follows NoLiMa
(Modarressi et al. 2025): the longest evaluated length up to which the mean stays at or above EFFECTIVE_SHARE of
the mean at L, every shorter evaluated length included.
"""

from __future__ import annotations

import math
from pathlib import Path
from statistics import NormalDist

import pandas as pd

from ..tasks.stream import LEARNED_AT
from .markdown import markdown_table
from .plots import pyplot, save_figure
from .store import scheme_order

EFFECTIVE_SHARE = 0.85  # NoLiMa's threshold: 85% of the score at the base length
Z95 = NormalDist().inv_cdf(0.975)
# Student's t, two-sided 95%, by degrees of freedom 1..30 (beyond: the normal quantile, within 1.5%)
T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
       2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def wilson(successes: float, n: float, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion successes / n (Wilson 1927); (nan, nan) when n is 0."""
    if n <= 0:
        return math.nan, math.nan
    p = successes / n
    centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - half) / (1 + z * z / n)), min(1.0, (centre + half) / (1 + z * z / n))


def seed_interval(values: pd.Series, examples: pd.Series) -> tuple[float, float, float, int]:
    """(mean, low, high, seeds) of per-seed exact matches `values` on `examples` sequences each: the mean over
    seeds; the interval is the wider, on each side, of the t interval over seeds and the pooled counts' Wilson."""
    values, examples = values.astype(float), examples.astype(float)
    n = len(values)
    if n == 0:
        return math.nan, math.nan, math.nan, 0
    mean = float(values.mean())
    low, high = wilson(float((values * examples).sum()), float(examples.sum()))
    if n >= 2:
        t = T95[n - 2] if n - 1 <= len(T95) else Z95
        half = t * float(values.std(ddof=1)) / math.sqrt(n)
        low, high = min(low, max(0.0, mean - half)), max(high, min(1.0, mean + half))
    return mean, low, high, n


def interval_text(mean: float, low: float, high: float, n: int) -> str:
    return "" if n == 0 else f"{mean:.2f} [{low:.2f}, {high:.2f}]"


def learned_seeds(main: pd.DataFrame, L: int) -> pd.DataFrame:
    """Per (label, seed): its exact match at L and whether it learned the task (>= LEARNED_AT)."""
    at_L = main[main["eval_len"] == L][["label", "seed", "exact"]].dropna()
    return at_L.assign(learned=at_L["exact"] >= LEARNED_AT)


def effective_length(means: dict[int, float], L: int) -> int | None:
    """The longest evaluated length up to which every mean stays >= EFFECTIVE_SHARE x the mean at L (None: no value
    at L, or none above 0 there)."""
    base = means.get(L)
    if base is None or not base > 0:
        return None
    longest = L
    for length in sorted(lv for lv in means if lv > L):
        if not means[length] >= EFFECTIVE_SHARE * base:
            break
        longest = length
    return longest


def multiple(length: int | None, L: int) -> str:
    if length is None:
        return ""
    return f"{length // L}L" if length % L == 0 else str(length)


def scheme_row(part: pd.DataFrame, learned: set, lengths: list[int], L: int, metric: str = "exact"
               ) -> tuple[list[str], list[str]]:
    """One scheme's cells over its learned seeds and over all seeds: the intervals of `metric` (exact: sequences
    are the trials; token_acc: answers) at each length past L and the relative effective length (of the means)."""
    trials = "examples" if metric == "exact" else "answers"
    cells = []
    for seeds in (learned, set(part["seed"])):
        rows = part[part["seed"].isin(seeds)]
        chosen = rows.dropna(subset=[metric])
        stats = {lv: seed_interval(chosen.loc[chosen["eval_len"] == lv, metric],
                                   chosen.loc[chosen["eval_len"] == lv, trials]) for lv in [L, *lengths]}
        means = {lv: s[0] for lv, s in stats.items() if s[3]}
        # n/a: rows at Lv, none with a value (not applicable: a learned table shorter than Lv)
        text = {lv: "n/a" if not stats[lv][3] and (rows["eval_len"] == lv).any() else interval_text(*stats[lv])
                for lv in lengths}
        cells.append([*(text[lv] for lv in lengths), effective_text(means, text, lengths, L)])
    return cells[0], cells[1]


def effective_text(means: dict[int, float], text: dict[int, str], lengths: list[int], L: int) -> str:
    """The relative effective length's cell: n/a where no length past L could be scored (a learned table of L
    positions), '-' where the mean at L is below LEARNED_AT (seeds that did not learn the task: a length relative to
    their accuracy at L says nothing), else the multiple of L."""
    if lengths and all(text[lv] == "n/a" for lv in lengths):
        return "n/a"
    if L in means and means[L] < LEARNED_AT:
        return "-"
    return multiple(effective_length(means, L), L)


def learning_table(main: pd.DataFrame, L: int, order: list[str], metric: str = "exact") -> str:
    """Schemes x (seeds learned at L, `metric` at each Lv > L over the learned seeds, the effective length over
    them, the same over all seeds) for one task's main cells (label, seed, eval_len, exact, examples, ...)."""
    seeds = learned_seeds(main, L)
    lengths = sorted(lv for lv in main["eval_len"].unique() if lv > L)
    rows = []
    for label in order:
        part, mine = main[main["label"] == label], seeds[seeds["label"] == label]
        learned = set(mine.loc[mine["learned"], "seed"])
        over_learned, over_all = scheme_row(part, learned, lengths, L, metric)
        rows.append([label, f"{len(learned)}/{len(mine)}", *over_learned, *over_all])
    heads = [multiple(lv, L) for lv in lengths]
    return markdown_table(["scheme", "learned at L", *(f"{h} (learned)" for h in heads), "eff. length (learned)",
                           *(f"{h} (all)" for h in heads), "eff. length (all)"], rows)


def learning_lines(main: pd.DataFrame, L: int, order: list[str], per_answer: bool = False) -> list[str]:
    """The section of one task in tasks.md: what the table holds, then the table. per_answer (a task whose answers
    grow in number with the length, Task.answers_grow): answer-token accuracy past L, each answer a trial."""
    examples = int(main["examples"].min()) if main["examples"].notna().any() else 0
    metric, what = ("token_acc", "answer-token accuracy (each answer a trial: this task's answers grow in number "
                    "with the length, so exact match per sequence would fall with their count alone)") \
        if per_answer else ("exact", "exact match")
    return ["### learned at L, and accuracy past L (the suite's main table)\n",
            f"*learned at L*: seeds whose exact match at Lv = L reaches {LEARNED_AT} ({examples}+ test sequences per "
            f"cell, the same for every scheme). Then {what} at each Lv > L, mean over the learned seeds [95% "
            f"interval: t over seeds and Wilson over the pooled trials, the wider], and the relative effective "
            f"length (NoLiMa: the longest Lv up to which the mean stays >= {EFFECTIVE_SHARE:.0%} of its value at L; -: "
            f"that mean at L is below {LEARNED_AT}, so no length is relative to a learned task); then the same over "
            f"all seeds. n/a: not applicable (a learned position table of L rows takes no longer sequence).\n",
            learning_table(main, L, order, metric)]


def over_training_figure(over: pd.DataFrame, title: str, path: Path, metric: str = "exact") -> None:
    """One panel per evaluated multiple of L (L, 4L, 16L): `metric` (exact, or token_acc where answers grow in
    number with the length) against the training step of each kept checkpoint, a line per scheme (the mean over
    its seeds, each seed's own line faint)."""
    plt = pyplot()
    L = int(over["train_len"].iloc[0])
    lengths = sorted(int(lv) for lv in over["eval_len"].unique())
    fig, axes = plt.subplots(1, len(lengths), figsize=(4.2 * len(lengths), 3.4), squeeze=False, sharey=True)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, lv in zip(axes[0], lengths):
        at = over[over["eval_len"] == lv]
        for i, label in enumerate(scheme_order(at["label"].unique())):
            part, colour = at[at["label"] == label], colours[i % len(colours)]
            for _, seed in part.groupby("seed"):
                ax.plot(seed["step"], seed[metric], color=colour, alpha=0.25, linewidth=0.8)
            mean = part.groupby("step")[metric].mean()
            ax.plot(mean.index, mean.values, color=colour, label=label, linewidth=1.8)
        ax.set_title(f"Lv = {multiple(lv, L)} = {lv}", fontsize=10)
        ax.set_xlabel("training step")
        ax.set_ylim(-0.02, 1.02)
    axes[0][0].set_ylabel("exact match" if metric == "exact" else "answer-token accuracy")
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.suptitle(title, fontsize=10)
    save_figure(fig, path)


def over_training_lines(over: pd.DataFrame, L: int, figure: str, metric: str = "exact") -> list[str]:
    """tasks.md's section on one task's kept checkpoints: the figure, and per scheme the mean `metric` at each
    evaluated length by step (seeds averaged; n = seeds)."""
    lengths = sorted(int(lv) for lv in over["eval_len"].unique())
    steps = sorted(int(s) for s in over["step"].unique())
    rows = []
    for label in scheme_order(over["label"].unique()):
        part = over[over["label"] == label]
        for lv in lengths:
            at = part[part["eval_len"] == lv].groupby("step")[metric]
            means, n = at.mean(), at.size()
            rows.append([label, multiple(lv, L), *(f"{means[s]:.2f}" if s in means else "" for s in steps),
                         str(int(n.max())) if len(n) else "0"])
    what = "exact match" if metric == "exact" else "answer-token accuracy"
    return [f"### {what} over training (over_training.csv: the kept checkpoints)\n",
            f"![{what} against training steps]({figure})\n",
            "Each kept checkpoint scored on the test sequences of tasks.csv; mean over seeds (n).\n",
            markdown_table(["scheme", "Lv", *map(str, steps), "n"], rows), "",
            f"How far each seed's {what} still moves in the last quarter of training (the kept steps from "
            f"{LATE_SHARE:.0%} of the last one on, learning rate near the end of its cosine): per seed, the largest "
            f"minus the smallest value there; a cell whose seed moves this much would read otherwise had the budget "
            f"ended a checkpoint earlier.\n",
            late_movement_table(over, L, metric)]


LATE_SHARE = 0.75  # the last quarter of training: the kept steps at or after this share of the last one


def late_movement_table(over: pd.DataFrame, L: int, metric: str) -> str:
    """Scheme x Lv past L: each seed's range (max - min) of `metric` over its kept steps in the last quarter of
    training, and the largest of them."""
    late = over[over["step"] >= LATE_SHARE * over["step"].max()]
    rows = []
    for label in scheme_order(late["label"].unique()):
        part = late[(late["label"] == label) & (late["eval_len"] > L)].dropna(subset=[metric])
        for lv, at in part.groupby("eval_len"):
            ranges = at.groupby("seed")[metric].agg(lambda v: v.max() - v.min())  # (seeds,)
            rows.append([label, multiple(int(lv), L), ", ".join(f"{r:.2f}" for r in ranges), f"{ranges.max():.2f}"])
    return markdown_table(["scheme", "Lv", "range per seed (seed 0, 1, ...)", "largest"], rows)


__all__ = ["EFFECTIVE_SHARE", "effective_length", "late_movement_table", "learned_seeds", "learning_lines", "learning_table",
           "over_training_figure", "over_training_lines", "seed_interval", "wilson"]
