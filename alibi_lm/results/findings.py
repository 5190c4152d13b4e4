"""Press et al.'s findings, checked on an experiment's rows: the first section of its report.

Each finding is a ratio ppl(kL) / ppl(L) (the mean over seeds of each seed's ratio) with the criterion a
small-budget reproduction is held to: the paper's effect in direction and in a size a small model can show
(sinusoidal at least 2x worse at 8L, where the paper has 14.7x at L = 1024). The training-length finding
(Table 5) compares runs of different L at the same Lv.
"""

from __future__ import annotations

import operator
from pathlib import Path

import numpy as np
import pandas as pd

from .published import PRESS_SLIDING, PRESS_TABLE3, published_ratio

# (finding, scheme, protocol, multiples k, criterion on the mean ratio at every k, its text, the effect's direction:
# what a demo's few hundred steps show before they reach the criterion's size)
FINDINGS = [
    ("sinusoidal breaks down past L", "sinusoidal", "nonoverlapping", (8,), (operator.ge, 2.0), "ppl(8L) / ppl(L) ≥ 2",
     (operator.gt, 1.0)),
    ("T5 improves from L to 2L", "t5", "nonoverlapping", (2,), (operator.lt, 1.0), "ppl(2L) / ppl(L) < 1",
     (operator.lt, 1.0)),
    ("ALiBi flat or falling to 16L", "alibi", "nonoverlapping", (2, 4, 8, 16), (operator.le, 1.0),
     "ppl(kL) / ppl(L) ≤ 1 for k = 2..16", (operator.le, 1.0)),
    ("ALiBi flat with sliding windows", "alibi", "sliding", (2, 4, 8, 16), (operator.le, 1.05),
     "ppl(kL) / ppl(L) ≤ 1.05 for k = 2..16", (operator.le, 1.05)),
]
# Experiments that show the idea in minutes (make demo, make smoke), not reproduce its size: their verdicts say what
# the rows show ("shown to 8L") instead of holding a short training to the reproduction's criteria.
DEMO_EXPERIMENTS = ("demo", "smoke")
PUBLISHED = {"nonoverlapping": (PRESS_TABLE3, "Table 3, L = 1024"), "sliding": (PRESS_SLIDING, "Tables 13-15, stride 1")}


def paper_text(scheme: str, mode: str, multiples) -> str:
    """The published ratios at the columns closest to each k x L (published.py)."""
    table, source = PUBLISHED[mode]
    found = [(k, r) for k in multiples if (r := published_ratio(table, scheme, k))]
    return "; ".join(f"{k}L: {r[0]:.3g}" for k, r in found) + f" ({source})" if found else "-"


def seed_ratios(rows: pd.DataFrame, k: int) -> pd.Series:
    """Each seed's ppl(kL) / ppl(L) in rows of one scheme, training length and protocol."""
    at_L = rows[rows["eval_len"] == rows["train_len"]].set_index("seed")["ppl"]
    at_kL = rows[rows["eval_len"] == k * rows["train_len"]].set_index("seed")["ppl"]
    ratios = (at_kL / at_L).dropna()
    return ratios[np.isfinite(ratios)]


def ratio_text(ratios: pd.Series) -> str:
    """Mean over seeds, with std and n when there are several."""
    return f"{ratios.mean():.3f}" + (f" ± {ratios.std():.3f} (n={len(ratios)})" if len(ratios) > 1 else "")


def is_demo(df: pd.DataFrame) -> bool:
    """Whether every row comes from a run of a demo experiment (runs/<experiment>/<run>, DEMO_EXPERIMENTS)."""
    experiments = {Path(str(run)).parent.name for run in df["run"]} if "run" in df else set()
    return bool(experiments) and experiments <= set(DEMO_EXPERIMENTS)


def demo_verdict(measured: dict, multiples, criterion_met: bool, direction) -> str:
    """A demo's verdict: whether its rows show the finding's effect, and up to which multiple they were scored."""
    compare, bound = direction
    if not all(compare(r.mean(), bound) for r in measured.values()):
        return "not shown at this budget"
    reach = "" if len(measured) == len(multiples) else f" to {max(measured)}L, the longest scored"
    return f"shown{reach}" if criterion_met else f"shown in direction{reach}; the reproduction's criterion asks more"


def ratio_findings(df: pd.DataFrame, train_len: int) -> list[list[str]]:
    """One row per finding whose rows exist at this L (valid split): measured ratios and the verdict (a demo's
    worded for a demo, demo_verdict)."""
    rows, demo = [], is_demo(df)
    for finding, scheme, mode, multiples, (compare, bound), criterion, direction in FINDINGS:
        mine = df[(df["position"] == scheme) & (df["mode"] == mode) & (df["split"] == "valid")
                  & (df["train_len"] == train_len)]
        scored = ""
        if mode == "sliding" and not mine.empty:  # the finest stride evaluated, on the targets it scored
            mine = mine[mine["stride"] == mine["stride"].min()]
            tokens = sorted({int(t) for t in mine["tokens"].dropna()})
            scored = f" (stride {int(mine['stride'].iloc[0])}, {', '.join(f'{t:,}' for t in tokens)} targets)"
        measured = {k: r for k in multiples if not (r := seed_ratios(mine, k)).empty}
        if not measured:
            continue
        failed = any(not compare(r.mean(), bound) for r in measured.values())
        ours = "; ".join(f"{k}L: {ratio_text(r)}" for k, r in measured.items()) + scored
        verdict = "does not hold" if failed else ("holds" if len(measured) == len(multiples) else "incomplete")
        if demo:
            verdict = demo_verdict(measured, multiples, not failed, direction)
        rows.append([finding, criterion, paper_text(scheme, mode, multiples), ours, verdict])
    return rows


def train_length_finding(df: pd.DataFrame, scheme: str) -> list[str] | None:
    """Table 5's finding for ALiBi: at every Lv >= 4 x the smallest L that every L was evaluated at, perplexity
    falls as L grows (nonoverlapping, valid; the mean over the seeds trained at every L, so that a 3-seed mean
    is never set against one seed)."""
    if scheme != "alibi":  # the paper's Table 5 trains ALiBi at several L (its sinusoidal row is Lv = L only)
        return None
    mine = df[(df["position"] == scheme) & (df["mode"] == "nonoverlapping") & (df["split"] == "valid")]
    lengths = sorted(mine["train_len"].unique())
    if len(lengths) < 2:
        return None
    seeds = set.intersection(*(set(mine.loc[mine["train_len"] == L, "seed"]) for L in lengths))
    mine = mine[mine["seed"].isin(seeds)]
    table = mine.groupby(["eval_len", "train_len"])["ppl"].mean().unstack("train_len")  # (Lv, L)
    table = table[table.index >= 4 * lengths[0]].dropna()
    if table.empty:
        return None
    falling = [lv for lv, row in table.iterrows() if all(np.diff(row[lengths].to_numpy()) < 0)]
    ours = (f"falls with L at {len(falling)} of {len(table)} Lv ({', '.join(map(str, table.index))}; "
            f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, sorted(seeds)))})")
    verdict = "holds" if len(falling) == len(table) else "does not hold"
    return [f"a longer L helps ({scheme}, L = {', '.join(map(str, lengths))})",
            "ppl falls as L grows at every Lv ≥ 4 x the smallest L", "Table 5", ours, verdict]


def interval(values: pd.Series) -> tuple[float, float, int]:
    """(mean, std, n) of one cell's values over seeds (std NaN for one seed)."""
    values = values.dropna()
    return float(values.mean()), float(values.std()), len(values)


def above(a: tuple[float, float, int], b: tuple[float, float, int]) -> bool:
    """Whether interval a lies wholly above b: mean_a - std_a > mean_b + std_b, both with two seeds or more (one seed
    has no spread). The reports' one rule for "differs by more than the seed spread"."""
    return min(a[2], b[2]) >= 2 and a[0] - a[1] > b[0] + b[1]


def spread_ranking(rows: pd.DataFrame) -> list[list[str]]:
    """Rows of one protocol, L and Lv, ranked by mean perplexity over seeds: per scheme its mean ± std (n) and
    whether it lies wholly above the one ranked just before it (above()). Only schemes with two seeds or more."""
    stats = {scheme: interval(ppl) for scheme, ppl in rows.dropna(subset=["ppl"]).groupby("position")["ppl"]}
    ranked, before = [], None
    for scheme in sorted((s for s in stats if stats[s][2] >= 2), key=lambda s: stats[s][0]):
        mean, std, n = stats[scheme]
        apart = "" if before is None else ("yes" if above(stats[scheme], before) else "no")
        ranked.append([str(scheme), f"{mean:.2f} ± {std:.2f} (n={n})", apart])
        before = stats[scheme]
    return ranked
