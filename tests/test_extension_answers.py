"""The extension comparison's answers (plans/extension/answers.py, claims.py): paired differences over seeds with
Student's t intervals, the largest fine-tune chosen by its label, and the published claims' verdicts, checked against
values computed here by hand."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from alibi_lm.plans.extension.answers import context_use_table, largest_finetune, versus_finetune_rows
from alibi_lm.plans.extension.claims import claim_lines

L = 64
T2 = 4.303  # Student's t, two-sided 95%, 2 degrees of freedom


def rows(position: str, method: str, by_ratio: dict[int, list[float]], train_len: int = L) -> list[dict]:
    """Nonoverlapping perplexity rows of one column, one per seed and ratio (values per seed 0, 1, 2)."""
    return [dict(position=position, rope_scaling="" if method == "none" else method, mode="nonoverlapping", seed=seed,
                 train_len=train_len, eval_len=ratio * L, ppl=value)
            for ratio, values in by_ratio.items() for seed, value in enumerate(values)]


def interval(diffs: list[float]) -> str:
    n = len(diffs)
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    half = T2 * sd / math.sqrt(n)
    return f"{mean:+.1f} [{mean - half:+.1f}, {mean + half:+.1f}] (n={n})"


def cells(table: str, scheme: str, method: str) -> list[str]:
    line = next(line for line in table.splitlines() if line.startswith(f"| {scheme} | {method} |"))
    return [c.strip() for c in line.split("|")[3:-1]]


def test_context_use_is_each_columns_perplexity_past_L_minus_its_own_at_L_paired_by_seed():
    df = pd.DataFrame(rows("rope", "none", {1: [100, 110, 120], 4: [130, 150, 160], 16: [200, 230, 250]})
                      + rows("rope", "streaming", {1: [100, 110, 120], 4: [98, 107, 118], 16: [97.5, 108, 117]}))
    table = context_use_table(df)
    assert cells(table, "rope", "none") == [interval([30, 40, 40]) + ": higher", interval([100, 120, 130]) + ": higher"]
    streaming = cells(table, "rope", "streaming")
    assert streaming[0] == interval([-2, -3, -2]) + ": lower"
    assert streaming[1] == interval([-2.5, -2, -3]) + ": lower"


def test_an_interval_that_holds_zero_gets_no_verdict_and_one_seed_no_interval():
    df = pd.DataFrame(rows("alibi", "none", {1: [100, 100, 100], 4: [101, 99, 100.5], 16: [100, 100, 100]})
                      + [dict(position="alibi+ft4x0.05", rope_scaling="", mode="nonoverlapping", seed=0, train_len=L,
                              eval_len=r * L, ppl=v) for r, v in ((1, 90.0), (4, 88.0), (16, 87.0))])
    table = context_use_table(df)
    assert cells(table, "alibi", "none")[0] == interval([1, -1, 0.5]) + ": within noise"
    assert cells(table, "alibi", "ft4x0.05") == ["-2.0 (n=1)", "-3.0 (n=1)"]


@pytest.mark.parametrize("methods, scale, expected", [
    (["none", "ft2x0.125", "ft4x0.01", "ft4x0.125", "ft4x0.05", "streaming"], 4, "ft4x0.125"),
    (["none", "ft4x0.05-linear", "ft4x0.125-linear", "ft2x0.5-linear"], 4, "ft4x0.125-linear"),
    (["none", "ft2x0.125"], 4, None),
    (["none", "scratch4x"], 4, None),
])
def test_the_largest_finetune_is_chosen_by_its_budget_at_the_scale(methods, scale, expected):
    assert largest_finetune(methods, scale) == expected


def test_the_finetune_stands_against_the_training_free_method_with_the_lowest_mean():
    ratios = (1, 4, 16)
    df = pd.DataFrame(
        rows("xpos", "none", dict(zip(ratios, ([100, 102, 104], [120, 121, 125], [150, 160, 170]))))
        + rows("xpos", "streaming", dict(zip(ratios, ([100, 102, 104], [101, 103, 104], [100, 103, 105]))))
        + rows("xpos", "rerope", dict(zip(ratios, ([110, 112, 114], [115, 118, 119], [140, 150, 160]))))
        + rows("xpos+ft4x0.125", "none", dict(zip(ratios, ([95, 97, 99], [96, 99, 99], [99, 101, 104]))))
        + rows("xpos+ft4x0.05", "none", dict(zip(ratios, ([90, 90, 90], [90, 90, 90], [90, 90, 90]))))
        + rows("xpos", "none", {1: [101], 4: [99], 16: [98]}, train_len=4 * L))
    at4, at16 = versus_finetune_rows(df)
    assert at4[:6] == ["xpos", "4L", f"{(120 + 121 + 125) / 3:.1f}", f"streaming {(101 + 103 + 104) / 3:.1f}",
                       f"ft4x0.125 {(96 + 99 + 99) / 3:.1f}", "99.0"]
    assert at4[6] == interval([96 - 101, 99 - 103, 99 - 104]) + ": fine-tune lower"
    assert at4[7] == interval([96 - 120, 99 - 121, 99 - 125]) + ": fine-tune lower"
    assert at16[3] == f"streaming {(100 + 103 + 105) / 3:.1f}" and at16[5] == "98.0"
    assert at16[6] == interval([99 - 100, 101 - 103, 104 - 105]) + ": within noise"


def claim(lines: list[str], source: str) -> str:
    return next(line for line in lines if line.startswith(source))


def test_a_claim_is_called_the_same_direction_only_when_the_rows_point_its_way():
    falling = {1: [100, 110, 120], 16: [90, 101, 108]}
    rising = {1: [100, 110, 120], 16: [120, 131, 139]}
    tasks = pd.DataFrame(columns=["task", "position", "rope_scaling", "variant", "train_len", "eval_len", "exact",
                                  "examples"])
    same = claim_lines(pd.DataFrame(rows("rope", "rerope", falling) + rows("rope", "leaky_rerope", falling)), tasks)
    assert "ReRoPE" in claim(same, "ReRoPE") and claim(same, "ReRoPE").endswith("Same direction.")
    assert f"rope rerope 16L minus L {interval([-10, -9, -12])}: lower" in claim(same, "ReRoPE")
    differs = claim_lines(pd.DataFrame(rows("rope", "rerope", rising) + rows("rope", "leaky_rerope", falling)), tasks)
    assert "Not the same direction; why it may differ: ReRoPE's window" in claim(differs, "ReRoPE")
    assert claim(same, "Self-Extend").endswith("Not decided by these rows (a seed or a column is missing).")
    assert "Here: not scored" not in claim(same, "StreamingLLM")


def test_lm_infinite_and_streaming_count_as_stable_unless_the_rise_excludes_zero():
    flat = {1: [100, 110, 120], 16: [101, 109, 120.5]}
    rise = {1: [100, 110, 120], 16: [110, 121, 129]}
    tasks = pd.DataFrame(columns=["task", "position", "rope_scaling", "variant", "train_len", "eval_len", "exact",
                                  "examples"])
    lines = claim_lines(pd.DataFrame(rows("rope", "lm_infinite", flat) + rows("alibi", "lm_infinite", flat)
                                     + rows("rope", "streaming", flat) + rows("alibi", "streaming", rise)), tasks)
    assert claim(lines, "LM-Infinite").endswith("Same direction.")
    assert "Not the same direction" in claim(lines, "StreamingLLM")
    assert f"alibi streaming 16L minus L {interval([10, 11, 9])}: higher" in claim(lines, "StreamingLLM")


def test_self_extend_passkey_compares_wilson_intervals_of_the_task_models():
    def task_rows(method: str, exact: float) -> dict:
        return dict(task="passkey", position="rope", rope_scaling="" if method == "none" else method, variant="",
                    seed=0, train_len=L, eval_len=2 * L, exact=exact, examples=1000)
    tasks = pd.DataFrame([task_rows("none", 0.6), task_rows("self_extend", 0.95)])
    line = claim(claim_lines(pd.DataFrame(rows("rope", "none", {1: [1.0, 1.0, 1.0]})), tasks), "Self-Extend")
    # Wilson (z = 1.96) of 950 of 1000: [0.9347, 0.9624]; of 600 of 1000: [0.5693, 0.6298]
    assert "self_extend 0.95 [0.93, 0.96] (seeds 1), no method 0.60 [0.57, 0.63] (seeds 1)" in line
    assert line.endswith("Same direction.")
    tasks.loc[1, "exact"] = 0.61  # overlapping intervals: not the claim's direction
    line = claim(claim_lines(pd.DataFrame(rows("rope", "none", {1: [1.0, 1.0, 1.0]})), tasks), "Self-Extend")
    assert "Not the same direction" in line


def test_lceg_counts_the_schemes_where_the_largest_finetune_beats_lm_infinite_at_4L():
    tasks = pd.DataFrame(columns=["task", "position", "rope_scaling", "variant", "train_len", "eval_len", "exact",
                                  "examples"])
    df = pd.DataFrame(rows("alibi", "lm_infinite", {1: [100, 101, 102], 4: [100, 101, 102]})
                      + rows("alibi+ft4x0.125", "none", {1: [95, 96, 97], 4: [90, 92, 91]})
                      + rows("rope", "lm_infinite", {1: [100, 101, 102], 4: [100, 101, 102]})
                      + rows("rope+ft4x0.125-linear", "none", {1: [95, 96, 97], 4: [99, 103, 101]}))
    line = claim(claim_lines(df, tasks), "LCEG")
    assert "fine-tune lower in alibi; method lower in none; within noise in rope" in line
    assert line.endswith("Same direction.")
    df.loc[(df["position"] == "alibi+ft4x0.125") & (df["eval_len"] == 4 * L), "ppl"] = [110, 112, 111]
    assert "Not the same direction" in claim(claim_lines(df, tasks), "LCEG")
