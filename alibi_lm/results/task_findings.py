"""The questions the task suite is run to answer, checked on its rows: the first section of tasks.md.

Each comparison sets one scheme against another on the same task at Lv = 4L and 16L on the suite's metric (exact
match; answer-token accuracy for a task whose answers grow in number with the length, Task.answers_grow: flip-flop),
as the main table does (task_learning.py): once over the seeds that learned the task at L (exact match >= LEARNED_AT
at L: what a scheme does past L once it can do the task at all) and once over all seeds. Each side is its mean with
the 95% interval of task_learning.seed_interval (t over seeds and Wilson over the pooled trials, the wider); the first
scheme is *above* / *below* the second when the two intervals are disjoint, *within* when they overlap, and there is
no verdict where either side has fewer than MIN_SEEDS seeds. The questions come from the published findings the suite
tests (Kazemnejad et al. 2023, NoPE against the other schemes; Ruoss et al. 2023 on randomized positions; Lin et al.
2025, FoX; Yang et al. 2025 and Llama 4 on interleaved NoPE layers; Nakanishi 2025, Scalable-Softmax) and from what
users ask (learned ALiBi slopes).
"""

from __future__ import annotations

import pandas as pd

from ..tasks import TASKS
from ..tasks.stream import LEARNED_AT
from .store import scheme_order
from .task_learning import interval_text, learned_seeds, multiple, seed_interval

# (question, scheme, against): labels as tasks.md writes them (position_label); besides these, every scheme trained
# with randomized positions (label +random) is set against itself trained with sequential ones
COMPARISONS = [
    ("NoPE against T5's bias", "nope", "t5"),  # Kazemnejad et al. 2023: NoPE ahead of all four
    ("NoPE against ALiBi", "nope", "alibi"),
    ("NoPE against RoPE", "nope", "rope"),
    ("NoPE against absolute (sinusoidal)", "nope", "sinusoidal"),
    ("FoX against ALiBi", "fox", "alibi"),
    ("FoX with RoPE against ALiBi", "fox+rope", "alibi"),
    ("a NoPE layer in the mix against RoPE alone", "rope+nope2", "rope"),
    ("the same with a window of L/2 on the RoPE layer", "rope+nope2-w32", "rope"),
    ("Scalable-Softmax on NoPE", "nope+ssmax", "nope"),
    ("Scalable-Softmax on ALiBi", "alibi+ssmax", "alibi"),
    ("QK-norm on RoPE", "rope+qk_norm", "rope"),
    ("learned ALiBi slopes", "alibi+learn_slopes", "alibi"),
]
MULTIPLES = (4, 16)
MIN_SEEDS = 2  # seeds a side needs for a verdict: with one, nothing says how far another seed would land
TRIALS = {"exact": "examples", "token_acc": "answers"}  # what each metric counts: sequences, or answer tokens
METRIC_TEXT = {"exact": "exact match", "token_acc": "answer-token accuracy"}
Stats = tuple[float, float, float, int]  # (mean, low, high, seeds) of task_learning.seed_interval


def task_metric(task: str) -> str:
    """The suite's metric for `task`: answer-token accuracy where its answers grow in number with the length (exact
    match per sequence would fall with their count alone), else exact match."""
    return "token_acc" if task in TASKS and TASKS[task].answers_grow else "exact"


def seed_sets(main: pd.DataFrame, L: int, learned_only: bool) -> dict[str, set]:
    """Per scheme label: the seeds that learned the task at L (learned_only), or all its seeds."""
    if not learned_only:
        return {label: set(part["seed"]) for label, part in main.groupby("label")}
    seeds = learned_seeds(main, L)
    return {label: set(part.loc[part["learned"], "seed"]) for label, part in seeds.groupby("label")}


def cell_stats(main: pd.DataFrame, label: str, lv: int, seeds: set, metric: str) -> Stats:
    """One scheme's `metric` at Lv over `seeds`: seed_interval's (mean, low, high, seeds)."""
    at = main[(main["label"] == label) & (main["eval_len"] == lv) & main["seed"].isin(seeds)]
    at = at.dropna(subset=[metric])
    return seed_interval(at[metric], at[TRIALS[metric]])


def stats_text(stats: Stats, seeds: str = "seeds") -> str:
    """'0.97 [0.93, 0.99] (n=3)', or 'no learned seeds' where none has a value."""
    return f"{interval_text(*stats)} (n={stats[3]})" if stats[3] else f"no {seeds}"


def verdict(a: Stats, b: Stats, seeds: str = "seeds") -> str:
    """'above' / 'below' where a's 95% interval lies wholly above / below b's, 'within' where they overlap; no
    verdict where either side has fewer than MIN_SEEDS seeds."""
    if min(a[3], b[3]) < MIN_SEEDS:
        return f"fewer than {MIN_SEEDS} {seeds}"
    return "above" if a[1] > b[2] else "below" if a[2] < b[1] else "within"


def questions(labels: set) -> list[tuple[str, str, str]]:
    """The comparisons whose two schemes both have rows: each +random scheme against its sequential self first."""
    randomized = [(f"randomized positions rescue {label.removesuffix('+random')}", label, label.removesuffix("+random"))
                  for label in sorted(labels) if label.endswith("+random")]
    return [q for q in [*randomized, *COMPARISONS] if {q[1], q[2]} <= labels]


def comparison_rows(main: pd.DataFrame, task: str, L: int, metric: str = "exact", learned_only: bool = True
                    ) -> list[list[str]]:
    """One task's main cells (label, seed, eval_len, exact, examples, ...) -> a row per comparison whose two
    schemes are present: both sides' `metric` at 4L and 16L (over the learned seeds, or all) and the verdict at each."""
    seeds, which = seed_sets(main, L, learned_only), "learned seeds" if learned_only else "seeds"
    rows = []
    for question, scheme, against in questions(set(main["label"])):
        cells = [task, question, f"{scheme} vs {against}"]
        for k in MULTIPLES:
            at = main[main["eval_len"] == k * L]
            if not {scheme, against} <= set(at["label"]):
                cells += ["", ""]
                continue
            a, b = (cell_stats(main, s, k * L, seeds.get(s, set()), metric) for s in (scheme, against))
            cells += [f"{stats_text(a, which)} vs {stats_text(b, which)}", verdict(a, b, which)]
        rows.append(cells)
    return rows


def learned_cells(main: pd.DataFrame, learned: dict[str, set], lv: int, metric: str) -> dict[str, Stats]:
    """Each scheme's `metric` at Lv over the seeds that learned the task at L (`learned`: seed_sets(learned_only))."""
    return {label: cell_stats(main, label, lv, chosen, metric) for label, chosen in learned.items()}


def with_enough_seeds(cells: dict[str, Stats]) -> dict[str, Stats]:
    """The cells over MIN_SEEDS seeds or more: one seed says nothing of where the next would land."""
    return {label: s for label, s in cells.items() if s[3] >= MIN_SEEDS}


def solved_at(main: pd.DataFrame, L: int, lv: int, metric: str = "exact", threshold: float = LEARNED_AT) -> list[str]:
    """The schemes whose mean `metric` at Lv over the seeds that learned the task at L is at least `threshold`, of
    those with MIN_SEEDS such seeds or more."""
    return solved_among(learned_cells(main, seed_sets(main, L, learned_only=True), lv, metric), threshold)


def solved_among(cells: dict[str, Stats], threshold: float = LEARNED_AT) -> list[str]:
    return scheme_order([label for label, s in with_enough_seeds(cells).items() if s[0] >= threshold])


def summary_line(main: pd.DataFrame, task: str, L: int, metric: str = "exact") -> str:
    """One item: at the longest Lv, the schemes that solve the task over their learned seeds and the best of them
    there (its interval; only the highest mean where another's interval overlaps it), both among the schemes with
    MIN_SEEDS learned seeds or more with a value at Lv; those with at least one but fewer, named apart with no
    verdict; and the schemes none of whose seeds learned it at L; '' without rows of the metric."""
    if main.empty or not main[metric].notna().any():
        return ""
    lv, seeds = int(main["eval_len"].max()), seed_sets(main, L, learned_only=True)
    every = seed_sets(main, L, learned_only=False)
    stats = learned_cells(main, seeds, lv, metric)
    scored = with_enough_seeds(stats)
    too_few = [label for label in scheme_order(stats) if 0 < stats[label][3] < MIN_SEEDS]
    unlearned = [label for label in scheme_order(every) if not seeds.get(label)]
    tried = sorted({len(every[label]) for label in unlearned})
    line = (f"- {task}, L = {L}: at {multiple(lv, L)} = {lv}, {METRIC_TEXT[metric]} ≥ {LEARNED_AT} over the seeds "
            f"that learned the task at L: {', '.join(solved_among(stats)) or 'none'}")
    among = f" of those with {MIN_SEEDS} learned seeds or more" if too_few else ""  # the one-seed ones follow
    if scored:
        best = max(scheme_order(scored), key=lambda label: scored[label][0])
        tied = [label for label in scheme_order(scored) if label != best and scored[label][2] >= scored[best][1]]
        line += (f"; best there{among}: {best}, {stats_text(scored[best])}" if not tied else  # no interval reaches it
                 f"; highest mean there{among}: {best}, {stats_text(scored[best])}, its interval overlapping "
                 f"{', '.join(tied[:3])}'s{f' and {len(tied) - 3} more' if len(tied) > 3 else ''}: none is ahead")
    if too_few:
        line += (f"; fewer than {MIN_SEEDS} learned seeds, no verdict: "
                 + ", ".join(f"{label} {stats_text(stats[label])}" for label in too_few))
    return line + (f"; no seed (of {'/'.join(map(str, tried))}) learned it at L: {', '.join(unlearned)}."
                   if unlearned else ".")


def comparison_note() -> str:
    return (f"Each question sets the first scheme against the second at 4L and 16L: exact match ({METRIC_TEXT['token_acc']}"
            f" for a task whose answers grow in number with the length: flip-flop), mean [95% interval: t over seeds "
            f"and Wilson over the pooled trials, the wider] (n = seeds), first over the seeds that learned the task at "
            f"L (exact match ≥ {LEARNED_AT} at L), then over all seeds. *above* / *below*: the first interval lies "
            f"wholly above / below the second; *within*: they overlap; no verdict where a side has fewer than "
            f"{MIN_SEEDS} seeds. Questions and criteria: alibi_lm/results/task_findings.py.\n")


__all__ = ["COMPARISONS", "MIN_SEEDS", "cell_stats", "comparison_note", "comparison_rows", "questions", "seed_sets",
           "solved_at", "stats_text", "summary_line", "task_metric", "verdict"]
