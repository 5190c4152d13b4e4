"""learned.csv (alibi_lm/results/learned_values.py): each evaluated run's learned scalars beside their initial values, in
the language-modelling and the task reports."""

import math

import pandas as pd
import pytest
import torch
from conftest import make

from alibi_lm.positions.alibi import alibi_slopes
from alibi_lm.results.learned_values import LEARNED_CSV, initial_values, learned_table, read_learned, record_learned


def test_initial_values_are_the_schemes_own_starting_points():
    model = make("alibi", position_options={"learn_slopes": True}, ssmax=True)  # make() spreads the parameters
    with torch.no_grad():
        model.blocks[1].attn.ssmax.add_(0.2)
    initial = initial_values(model)
    assert [initial[f"alibi_slope_{h}"] for h in range(4)] == pytest.approx(alibi_slopes(4).tolist())
    assert initial["ssmax_s_1_3"] == pytest.approx(0.43) and len(initial) == 4 + 2 * 4
    assert model.learned_values()["ssmax_s_1_3"] == pytest.approx(0.63)
    fire = make("fire")
    fresh = initial_values(fire)
    assert set(fresh) == {"fire_threshold", "fire_c"} and fresh != pytest.approx(fire.learned_values())
    state = torch.random.get_rng_state()
    initial_values(fire)
    assert torch.equal(state, torch.random.get_rng_state())  # building the fresh scheme draws nothing


def test_rows_replace_the_runs_earlier_rows(tmp_path):
    model = make("alibi", position_options={"learn_slopes": True})
    identity = dict(position="alibi+learn_slopes", train_len=16, seed=0)
    assert record_learned(model, tmp_path, identity, {"run": "r", "weights": "w1"}) == 4
    before = (tmp_path / LEARNED_CSV).read_bytes()
    assert record_learned(model, tmp_path, identity, {"run": "r", "weights": "w1"}) == 0  # a rerun: left alone
    assert (tmp_path / LEARNED_CSV).read_bytes() == before
    with torch.no_grad():
        model.position.log_slopes.add_(math.log(2))  # every slope doubles
    record_learned(model, tmp_path, identity, {"run": "r", "weights": "w2"})
    record_learned(model, tmp_path, dict(identity, seed=1), {"run": "r1", "weights": "w3"})
    rows = read_learned(tmp_path / LEARNED_CSV)
    assert len(rows) == 8 and set(rows["weights"]) == {"w2", "w3"} and set(rows["task"]) == {"lm"}
    seed0 = rows[rows["seed"] == 0].set_index("name")
    assert seed0.loc["alibi_slope_3", "value"] == pytest.approx(model.position.slopes[3].item())
    assert seed0.loc["alibi_slope_3", "initial"] == pytest.approx(2**-8)
    assert record_learned(make("rope"), tmp_path, dict(identity, position="rope"), {}) == 0  # nothing learned


def test_the_table_gives_mean_and_std_over_seeds_per_task():
    df = pd.DataFrame(dict(task=["lm", "lm", "passkey"], task_options="", position="fire", positions="sequential",
                           train_len=128, seed=[0, 1, 0], name="fire_threshold", value=[30.0, 34.0, 12.5],
                           initial=32.0))
    table = learned_table(df, lambda row: row["position"])
    assert "| scheme | learned value | initial | lm | passkey |" in table
    assert "| fire | fire_threshold | 32 | 32.000 ± 2.828 (n=2) | 12.500 |" in table
