"""The extension group (extension=<method>) in the passkey probe and the synthetic task evaluation: at a method's
identity settings every prompt's and every sequence's scores equal the plain model's (two code paths, one model),
a method that changes distances changes them, rows carry the method's label as perplexity rows do, a scheme the
method has no meaning for is refused in one line before any work, and the relative effective length of a passkey
table is the hand-computed one."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import REPO, HandMadeSubject, compose_job, make
from forked_app import run_python

from alibi_lm.config import RopeScalingConfig
from alibi_lm.errors import ConfigError, UserError
from alibi_lm.eval.extension import chosen_method
from alibi_lm.extension import OPTIONS
from alibi_lm.probes import passkey_probe
from alibi_lm.probes.config import PasskeyConfig
from alibi_lm.subjects import NativeScorer

L = 16
SCORE_KEYS = passkey_probe.score_keys  # the probe's own, wrapped by probed() to record every prompt's scores
# settings under which a method changes nothing up to Lv = 4L = 64 (every distance below its window or limit)
IDENTITY = {"streaming": {"sinks": 2, "window": 100}, "lm_infinite": {"n_global": 1, "n_local": 100, "limit": 100},
            "self_extend": {"group": 3, "window": 100}, "rerope": {"window": 100},
            "leaky_rerope": {"window": 100, "factor": 4}, "dca": {"chunk": 200, "local": 2}}
CASES = [("alibi", "lm_infinite"), ("alibi", "dca"), ("t5", "rerope"), ("rope", "self_extend"), ("rope", "streaming"),
         ("xpos", "leaky_rerope"), ("nope", "streaming")]


class Words:
    """A word-level encoder: digits are ids 0-9, every new word the next id."""

    def __init__(self):
        self.ids = {str(d): d for d in range(10)}

    def encode(self, text: str) -> list[int]:
        return [self.ids.setdefault(w, len(self.ids)) for w in text.split()]


def cfg() -> PasskeyConfig:
    """A prompt of 10 fixed tokens (3-digit key), so that Lv = L = 16 holds filler."""
    return PasskeyConfig(multipliers=[1, 2, 4], depths=[0, 0.5, 1], trials=4, key_tokens=3, filler_text="a b c .",
                         key_text="key {key} .", cue_text="key ?")


def probed(scheme: str, options, monkeypatch) -> tuple[list[dict], list[tuple[np.ndarray, np.ndarray]]]:
    """The probe's rows and every batch's per-prompt scores ((S, K) log-probabilities, (S, K) hits) of the test
    model of `scheme` under extension options (None: the plain model)."""
    scorer = NativeScorer(make(scheme))
    subject = HandMadeSubject(scorer, None, dict(position=scheme, train_len=L, seed=0), encoder=Words().encode)
    method = chosen_method(RopeScalingConfig(), options, L)
    scores = []

    def recorded(*args):
        scores.append(SCORE_KEYS(*args))
        return scores[-1]

    monkeypatch.setattr(passkey_probe, "score_keys", recorded)
    rows = passkey_probe.probe(subject, cfg(), "valid", tokens_per_batch=1024, method=method)
    return rows, scores


@pytest.mark.parametrize("scheme,method", CASES)
def test_the_passkey_probe_at_identity_settings_scores_every_prompt_as_the_plain_model(scheme, method, monkeypatch):
    plain_rows, plain = probed(scheme, None, monkeypatch)
    rows, extended = probed(scheme, OPTIONS[method](**IDENTITY[method]), monkeypatch)
    assert len(extended) == len(plain) == 9  # one batch per (Lv, depth) cell
    for (logp, hit), (logp0, hit0) in zip(extended, plain):
        assert np.array_equal(hit, hit0)  # every key token's argmax, prompt by prompt
        np.testing.assert_allclose(logp, logp0, rtol=0, atol=2e-5)  # masks built per query block: float order only
    assert [r["acc"] for r in rows] == [r["acc"] for r in plain_rows]
    label = OPTIONS[method](**IDENTITY[method])
    assert {r["rope_scaling"] for r in rows} == {chosen_method(RopeScalingConfig(), label, L).label()}
    assert {r["rope_scaling"] for r in plain_rows} == {""}


def test_a_method_that_caps_distances_changes_the_passkey_scores_past_L(monkeypatch):
    _, plain = probed("alibi", None, monkeypatch)
    rows, capped = probed("alibi", OPTIONS["lm_infinite"](limit=4), monkeypatch)
    assert {r["rope_scaling"] for r in rows} == {"lm_infinite-limit4"}
    assert not np.allclose(capped[-1][0], plain[-1][0], atol=1e-3)  # Lv = 4L: distances past 4 capped


def test_the_effective_length_of_a_hand_made_passkey_table():
    from alibi_lm.plans.extension.tables import passkey_effective

    # per (seed, Lv) accuracy, two depths each: the means per Lv are 0.8, 0.7, 0.69, 0.5, 0.9 (seed 0) -> 85% of 0.8
    # is 0.68: kept up to 4L, lost at 8L (16L recovers, but past a drop); seed 1: 0.5 at L, 0.45 at 2L, 0.4 at 4L
    # (0.4 < 0.425) -> 2L
    acc = {0: [0.8, 0.7, 0.69, 0.5, 0.9], 1: [0.5, 0.45, 0.4, 0.5, 0.5]}
    rows = [dict(position="alibi", rope_scaling="", seed=s, train_len=L, eval_len=L * 2 ** i, depth=d, acc=a + dd)
            for s, values in acc.items() for i, a in enumerate(values) for d, dd in ((0.0, -0.1), (1.0, 0.1))]
    table = passkey_effective(pd.DataFrame(rows))
    assert table.set_index("seed")["effective_len"].to_dict() == {0: 4 * L, 1: 2 * L}


def test_a_task_run_under_identity_settings_scores_every_sequence_as_the_plain_model(tmp_path):
    from alibi_lm.eval.task_evaluation import evaluate_task_run
    from alibi_lm.results.task_store import TASKS_CSV, read_task_results
    from alibi_lm.training.trainer import Trainer

    Trainer(compose_job("train", *job_overrides(tmp_path, "position=alibi")), tmp_path / "run").run()
    ev = {"multipliers": [1, 4], "examples": 12}
    plain = evaluate_task_run(tmp_path / "run", ev, tmp_path / "results", torch.device("cpu"), progress=False)
    same = evaluate_task_run(tmp_path / "run", ev, tmp_path / "results", torch.device("cpu"), progress=False,
                             extension_cfg=OPTIONS["lm_infinite"](n_global=1, n_local=1000, limit=1000))
    capped = evaluate_task_run(tmp_path / "run", ev, tmp_path / "results", torch.device("cpu"), progress=False,
                               extension_cfg=OPTIONS["rerope"](window=2))
    metrics = ("token_acc", "exact", "greedy", "greedy_agree")
    assert [[r[m] for m in metrics] for r in same] == [[r[m] for m in metrics] for r in plain]
    assert [r["loss"] for r in same] == pytest.approx([r["loss"] for r in plain], abs=1e-5)
    assert capped[-1]["loss"] != pytest.approx(plain[-1]["loss"], abs=1e-4)  # distances past 2 capped
    df = read_task_results(tmp_path / "results" / "tasks" / TASKS_CSV)
    assert sorted(df["rope_scaling"].unique()) == ["", "lm_infinite-n_global1-n_local1000-limit1000", "rerope-window2"]
    assert len(df[df["variant"] == ""]) == 3 * 2  # one row per method and length: none replaced another
    assert "alibi+rerope-window2" in (tmp_path / "results" / "tasks" / "tasks.md").read_text()


def test_a_task_run_of_a_scheme_without_distances_to_remap_is_refused_in_one_line(tmp_path):
    from alibi_lm.eval.task_evaluation import evaluate_task_run
    from alibi_lm.training.trainer import Trainer

    Trainer(compose_job("train", *job_overrides(tmp_path, "position=sinusoidal")), tmp_path / "run").run()
    with pytest.raises(UserError, match="extension=self_extend cannot extend position=sinusoidal") as e:
        evaluate_task_run(tmp_path / "run", {"multipliers": [1, 4], "examples": 4}, tmp_path / "results",
                          torch.device("cpu"), progress=False, extension_cfg=OPTIONS["self_extend"]())
    assert "\n" not in str(e.value) and not (tmp_path / "results").exists()


def job_overrides(tmp_path, *extra) -> list[str]:
    return ["experiment=tasks", "task=copy", "task.symbols=4", "model.n_layer=1", "model.d_model=32", "model.d_ff=64",
            "train.seq_len=16", "train.batch_size=4", "train.max_steps=2", "train.warmup_steps=1", "train.eval_every=2",
            "train.checkpoint_every=2", "train.progress=false", "train.evaluate_after=false",
            f"paths.runs={tmp_path / 'runs'}", *extra]


def test_the_probes_job_takes_the_extension_group_for_the_passkey_probe_only():
    job = compose_job("probes", "probe=passkey", "extension=self_extend", "extension.window=8")
    assert type(job.extension).__name__ == "SelfExtendOptions" and job.extension.window == 8
    assert compose_job("probes").extension is None
    with pytest.raises(ConfigError, match="applies to the passkey probe here, not probe=all; add probe=passkey") as e:
        compose_job("probes", "extension=streaming")
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_the_probes_app_refuses_a_method_a_scheme_has_no_use_for_in_one_line(tmp_path):
    from test_probes import make_run, write_prompt_corpus

    write_prompt_corpus(tmp_path)
    run = make_run(tmp_path, "sinusoidal")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = run_python(["-m", "alibi_lm.probes", f"run={run}", "probe=passkey", "extension=self_extend",
                      f"paths.results={tmp_path}/results"], env, tmp_path, timeout=300)
    assert out.returncode != 0 and out.stderr.strip().count("\n") == 0, out.stderr
    assert out.stderr.startswith("error: extension=self_extend cannot extend position=sinusoidal")
    assert not (tmp_path / "results").exists()


def test_the_comparison_scores_again_only_the_rows_a_dirty_tree_scored(tmp_path):
    from alibi_lm.plans.extension.scoring import dirty_labels, method_labels
    from alibi_lm.results import store

    common = dict(position="alibi", train_len=64, mode="nonoverlapping", seed=0, split="valid", attention="full", ppl=1.0)
    rows = [dict(common, eval_len=64, rope_scaling="", weights="w1", commit="abc1234 (with uncommitted changes)"),
            dict(common, eval_len=64, rope_scaling="streaming", weights="w1", commit="abc1234"),
            dict(common, eval_len=64, rope_scaling="dca", weights="w2", commit="abc1234 (with uncommitted changes)")]
    store.upsert_rows(tmp_path / store.CSV_NAME, rows)
    assert dirty_labels(tmp_path / store.CSV_NAME, "w1") == {""}  # not streaming (clean), not dca (other weights)
    assert dirty_labels(tmp_path / "missing.csv", "w1") == set()
    assert method_labels(tmp_path / store.CSV_NAME, "w1") == {"", "streaming"}
    assert method_labels(tmp_path / store.CSV_NAME, "w3") == set()
    plain = tmp_path / "plain.csv"  # a table without rope_scaling: the plain model's rows alone
    pd.DataFrame([dict(weights="w1", commit="abc1234"), dict(weights="w2", commit="abc1234")]).to_csv(plain, index=False)
    assert method_labels(plain, "w1", pd.read_csv) == {""} and method_labels(plain, "w3", pd.read_csv) == set()


def test_the_comparison_covers_kerple_power_sandwich_and_xpos_with_the_methods_they_take():
    from alibi_lm.extension import REMAP_METHODS
    from alibi_lm.plans.extension.runs import PAPER_SCHEMES, SCHEMES, methods_for

    assert SCHEMES[: len(PAPER_SCHEMES)] == PAPER_SCHEMES == ("alibi", "rope", "t5", "nope", "sinusoidal")
    assert {"kerple_power", "sandwich", "xpos"} <= set(SCHEMES)
    assert methods_for("kerple_power") == methods_for("sandwich") == list(REMAP_METHODS)
    assert methods_for("xpos") == list(REMAP_METHODS)  # rotary: every remap; the RoPE rescalings are RoPE's only
