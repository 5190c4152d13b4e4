"""The task suite's main table: Wilson intervals (against published values), the interval over seeds, the relative
effective length (NoLiMa's rule), and learned seeds kept apart from the rest."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from alibi_lm.results.task_learning import effective_length, late_movement_table, learning_table, seed_interval, wilson


@pytest.mark.parametrize("k, n, low, high", [
    (0, 10, 0.0, 0.2775), (5, 10, 0.2366, 0.7634), (81, 263, 0.2553, 0.3662),  # Newcombe 1998, Table I; Wikipedia
    (10, 10, 0.7225, 1.0),
])
def test_wilson_matches_published_intervals(k, n, low, high):
    lo, hi = wilson(k, n)
    assert lo == pytest.approx(low, abs=6e-5) and hi == pytest.approx(high, abs=6e-5)
    assert all(math.isnan(v) for v in wilson(0, 0))


def test_the_interval_over_seeds_is_the_wider_of_t_over_seeds_and_the_pooled_wilson():
    one = seed_interval(pd.Series([0.5]), pd.Series([1000]))
    assert one[:2] == pytest.approx((0.5, wilson(500, 1000)[0])) and one[3] == 1
    spread = seed_interval(pd.Series([0.2, 0.8]), pd.Series([1000, 1000]))  # t(1) = 12.706: the whole [0, 1]
    assert spread == (pytest.approx(0.5), 0.0, 1.0, 2)
    alike = seed_interval(pd.Series([0.5, 0.5, 0.5]), pd.Series([1000, 1000, 1000]))  # no spread: Wilson of 1500/3000
    assert alike[1:3] == pytest.approx(wilson(1500, 3000))


def test_effective_length_is_the_longest_length_up_to_which_the_mean_keeps_85_percent_of_L():
    assert effective_length({64: 1.0, 128: 0.9, 256: 0.86, 512: 0.5, 1024: 0.9}, 64) == 256  # 1024 is past a drop
    assert effective_length({64: 0.5, 128: 0.4}, 64) == 64
    assert effective_length({64: 0.5, 128: 0.5, 256: 0.425}, 64) == 256  # 0.425 = 85% of 0.5: kept
    assert effective_length({64: 0.0, 128: 0.0}, 64) is None and effective_length({128: 1.0}, 64) is None


def test_learned_seeds_are_counted_and_kept_apart_from_all_seeds():
    rows = []
    for seed, (at_L, at_4L) in enumerate([(1.0, 0.9), (0.96, 0.7), (0.2, 0.2)]):
        rows += [dict(label="alibi", seed=seed, eval_len=64, exact=at_L, examples=1000),
                 dict(label="alibi", seed=seed, eval_len=256, exact=at_4L, examples=1000)]
    rows += [dict(label="nope", seed=0, eval_len=64, exact=0.5, examples=1000),
             dict(label="nope", seed=0, eval_len=256, exact=0.5, examples=1000)]
    table = learning_table(pd.DataFrame(rows), 64, ["alibi", "nope"]).splitlines()
    alibi = [c.strip() for c in table[2].split("|")[1:-1]]
    learned = seed_interval(pd.Series([0.9, 0.7]), pd.Series([1000, 1000]))
    everyone = seed_interval(pd.Series([0.9, 0.7, 0.2]), pd.Series([1000] * 3))
    assert alibi[:2] == ["alibi", "2/3"]
    assert alibi[2] == f"{learned[0]:.2f} [{learned[1]:.2f}, {learned[2]:.2f}]" and alibi[3] == "1L"  # 0.80 < 0.85 x 0.98
    assert alibi[4] == f"{everyone[0]:.2f} [{everyone[1]:.2f}, {everyone[2]:.2f}]"
    nope = [c.strip() for c in table[3].split("|")[1:-1]]
    assert nope[1:4] == ["0/1", "", ""] and nope[5] == "-"  # no learned seed; over all seeds flat at 0.5 < 0.95 at L


def test_a_task_whose_answers_grow_is_tabled_by_answer_token_accuracy_with_answers_as_trials():
    rows = [dict(label="rope", seed=0, eval_len=64, exact=1.0, token_acc=1.0, examples=1000, answers=3000),
            dict(label="rope", seed=0, eval_len=1024, exact=0.0, token_acc=0.9, examples=1000, answers=51000)]
    cells = [c.strip() for c in learning_table(pd.DataFrame(rows), 64, ["rope"], "token_acc").splitlines()[2].split("|")]
    low, high = wilson(0.9 * 51000, 51000)
    assert cells[2:5] == ["1/1", f"0.90 [{low:.2f}, {high:.2f}]", "16L"]
    exact = [c.strip() for c in learning_table(pd.DataFrame(rows), 64, ["rope"]).splitlines()[2].split("|")]
    assert exact[3:5] == ["0.00 [0.00, 0.00]", "1L"]


def test_a_length_the_scheme_cannot_take_reads_n_a_not_blank():
    """position=learned (a table of L rows): its cells past L are rows without a value, shown n/a over learned and
    all seeds alike; a scheme without rows at a length stays blank."""
    rows = [dict(label="learned", seed=0, eval_len=64, exact=1.0, examples=1000),
            dict(label="learned", seed=0, eval_len=256, exact=math.nan, examples=math.nan),
            dict(label="alibi", seed=0, eval_len=64, exact=1.0, examples=1000)]
    table = learning_table(pd.DataFrame(rows), 64, ["learned", "alibi"]).splitlines()
    assert [c.strip() for c in table[2].split("|")[1:-1]] == ["learned", "1/1", "n/a", "n/a", "n/a", "n/a"]
    assert [c.strip() for c in table[3].split("|")[1:-1]] == ["alibi", "1/1", "", "1L", "", "1L"]


def test_late_movement_is_each_seeds_range_over_the_last_quarter_of_training_past_L():
    """Per scheme and Lv > L: each seed's largest minus smallest value over the kept steps from 75% of the last one
    on (an earlier step, and Lv = L, left out), and the largest of those ranges."""
    values = {(0, 500): 0.0, (0, 750): 0.2, (0, 1000): 0.7, (1, 500): 0.1, (1, 750): 0.9, (1, 1000): 0.9}
    over = pd.DataFrame([dict(label="t5", seed=seed, step=step, eval_len=lv, exact=value)
                         for (seed, step), value in values.items() for lv in (64, 256)])
    table = late_movement_table(over, 64, "exact").splitlines()
    assert table[2:] == ["| t5 | 4L | 0.50, 0.00 | 0.50 |"]
