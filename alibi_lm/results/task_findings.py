"""The questions the task suite is run to answer, checked on its rows: the first section of tasks.md.

Each comparison sets one scheme's answer-token accuracy against another's on the same task at Lv = 4L and 16L
(mean ± std over seeds), and says whether the first lies above or below the second by more than the seed spread
(their mean ± std intervals disjoint) or within it. The questions come from the published findings the suite
tests (Kazemnejad et al. 2023, NoPE against the other schemes; Ruoss et al. 2023 on randomized positions;
Lin et al. 2025, FoX; Yang et al. 2025 and Llama 4 on
interleaved NoPE layers; Nakanishi 2025, Scalable-Softmax) and from what users ask (learned ALiBi slopes).
"""

from __future__ import annotations

import pandas as pd

from .findings import above, interval
from .markdown import cell_text

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


def verdict(a: tuple[float, float, int], b: tuple[float, float, int]) -> str:
    """'above' / 'below' when a's interval lies wholly above / below b's (results.findings.above), else 'within the
    spread', or 'one seed' when either has one."""
    if min(a[2], b[2]) < 2:
        return "one seed"
    return "above" if above(a, b) else "below" if above(b, a) else "within the spread"


def comparison_rows(main: pd.DataFrame, task: str, L: int) -> list[list[str]]:
    """One task's main cells (label, eval_len, token_acc per seed) -> a row per comparison whose two schemes are
    present: the two accuracies at 4L and 16L and the verdict at each."""
    rows = []
    randomized = [(f"randomized positions rescue {label.removesuffix('+random')}", label, label.removesuffix("+random"))
                  for label in sorted(set(main["label"])) if label.endswith("+random")]
    for question, scheme, against in [*randomized, *COMPARISONS]:
        if not {scheme, against} <= set(main["label"]):
            continue
        cells = [question, f"{scheme} vs {against}"]
        for k in MULTIPLES:
            at = main[main["eval_len"] == k * L]
            values = [at.loc[at["label"] == s, "token_acc"].dropna() for s in (scheme, against)]
            if not all(len(v) for v in values):
                cells += ["", ""]
                continue
            cells += [" vs ".join(cell_text(v) for v in values), verdict(*map(interval, values))]
        rows.append([task, *cells])
    return rows


def solved_at(main: pd.DataFrame, lv: int, metric: str, threshold: float = 0.95) -> list[str]:
    """The schemes whose mean `metric` at Lv is at least `threshold`."""
    means = main[main["eval_len"] == lv].groupby("label")[metric].mean()
    return sorted(means[means >= threshold].index)


__all__ = ["COMPARISONS", "comparison_rows", "solved_at", "verdict"]
