"""Evaluation: token accounting of both protocols, protocol parities on a real model, and evaluate_run
on fake run folders (learned past its table, bad folders, corrupt checkpoints). No data module needed."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import HandMadeSubject, fake_run_data, write_run
from forked_app import run_python

from alibi_lm.config import EvalConfig
from alibi_lm.errors import UserError
from alibi_lm.eval import evaluation
from alibi_lm.eval.scoring import eval_lengths, plan_windows, score_stream
from alibi_lm.model import LMConfig, TransformerLM
from alibi_lm.subjects import hf
from alibi_lm.subjects import native as subject

V = 61


class PositionStub:
    """A model whose loss (model(x, targets=y)) is target id + 100 * position in the window: the mean tells
    which targets were scored and with how much context, so it can be computed by hand."""

    def __call__(self, x, targets):
        return targets.float() + 100.0 * torch.arange(targets.shape[1], dtype=torch.float32)[None, :]


def covered(windows, n_targets):
    hits = np.zeros(n_targets, dtype=int)
    for w in windows:
        hits[w.start + w.first_scored : w.start + w.length] += 1
        assert 0 <= w.first_scored < w.length and w.start + w.length <= n_targets
    return hits


@pytest.mark.parametrize("n", [2, 3, 13, 17, 64])
@pytest.mark.parametrize("lv", [1, 2, 4, 5, 16, 100])
def test_plan_windows_scores_every_target_once(n, lv):
    assert (covered(plan_windows(n, lv), n - 1) == 1).all()
    for stride in sorted({1, 2, 3, lv}):
        if stride <= lv:
            assert (covered(plan_windows(n, lv, "sliding", stride), n - 1) == 1).all()


# 13 tokens 0..12, targets 1..12, Lv = 4. Hand-computed (windows as [start, first scored]):
#   nonoverlapping: [0,0] [4,0] [8,0]              -> positions 0-3 three times each
#   sliding s=1:    [0,0] [1,3] [2,3] ... [8,3]    -> positions 0,1,2 once, position 3 nine times
#   sliding s=3:    [0,0] [3,1] [6,1] [8,2]        -> position counts 1, 3, 4, 4
HAND = {
    ("nonoverlapping", None): dict(count=[3, 3, 3, 3], pos_loss=[5, 106, 207, 308], mean=6.5 + 100 * 18 / 12),
    ("sliding", 1): dict(count=[1, 1, 1, 9], pos_loss=[1, 102, 203, 308], mean=6.5 + 100 * 30 / 12),
    ("sliding", 3): dict(count=[1, 3, 4, 4], pos_loss=[1, 105, 207.25, 308.25], mean=6.5 + 100 * 23 / 12),
}


@pytest.mark.parametrize("mode,stride", list(HAND))
def test_score_stream_hand_computed(mode, stride):
    want = HAND[(mode, stride)]
    for batch in (4, 8, 1000):  # batching must not change anything
        r = score_stream(PositionStub(), np.arange(13), 4, mode, stride, tokens_per_batch=batch)
        assert r.tokens == 12
        assert r.loss == pytest.approx(want["mean"], abs=1e-9)
        assert r.ppl == pytest.approx(math.exp(want["mean"]))
        np.testing.assert_array_equal(r.position_count, want["count"])
        np.testing.assert_allclose(r.position_loss, want["pos_loss"])


def test_token_count_is_n_minus_1_at_every_length():
    tokens = np.arange(13)
    for lv in range(1, 16):
        assert score_stream(PositionStub(), tokens, lv).tokens == 12
        assert score_stream(PositionStub(), tokens, lv, "sliding", 1).tokens == 12
        assert score_stream(PositionStub(), tokens, lv, "sliding", lv).tokens == 12


def test_a_length_past_the_stream_is_one_window_of_the_stream_without_memory_for_lv():
    whole = score_stream(PositionStub(), np.arange(13), 12)
    for lv in (13, 10**12):  # 10**12: arrays sized by Lv would need terabytes
        r = score_stream(PositionStub(), np.arange(13), lv)
        assert r.tokens == 12 and r.loss == whole.loss and len(r.position_loss) == len(r.position_count) == 12
        np.testing.assert_array_equal(r.position_loss, whole.position_loss)


def tiny_model(position="alibi", seed=0, **options) -> TransformerLM:
    torch.manual_seed(seed)
    cfg = LMConfig(vocab_size=V, n_layer=2, n_head=2, d_model=16, position=position, position_options=options)
    return TransformerLM(cfg).eval()


def random_tokens(n, seed=0):
    return np.random.default_rng(seed).integers(0, V, n)


@pytest.mark.parametrize("position", ["alibi", "sinusoidal"])
def test_sliding_with_stride_lv_equals_nonoverlapping(position):
    model, tokens = tiny_model(position), random_tokens(4 * 16 + 1)  # N - 1 a multiple of Lv: same windows
    a = score_stream(model, tokens, 16)
    b = score_stream(model, tokens, 16, "sliding", 16)
    assert a.tokens == b.tokens == 64
    assert a.loss == pytest.approx(b.loss, rel=1e-6)


def test_sliding_stride_1_matches_brute_force():
    # Each target i >= Lv is scored with exactly the Lv tokens before it, the first Lv with all they have.
    model, tokens, lv = tiny_model("t5"), random_tokens(40, seed=3), 8
    with torch.no_grad():
        t = torch.from_numpy(tokens).long()
        nll = [model(t[None, max(0, i + 1 - lv) : i + 1], targets=t[None, max(0, i + 1 - lv) + 1 : i + 2])[0, -1].item()
               for i in range(len(tokens) - 1)]
    r = score_stream(model, tokens, lv, "sliding", 1, tokens_per_batch=24)
    assert r.tokens == 39
    assert r.loss == pytest.approx(float(np.mean(nll)), rel=1e-5)


# ---- evaluate_run on fake run folders ----


def make_run(tmp_path, position="alibi", L=16, seed=0, name="exp", **options):
    """A run folder as train.py writes it: config.yaml (resolved) and checkpoint.pt."""
    return write_run(tmp_path, tiny_model(position, seed, **options), L, seed, name, **options)


@pytest.fixture
def fake_data(monkeypatch):
    return fake_run_data(monkeypatch, V, 16 * 8 + 1)


def eval_cfg(**kw) -> EvalConfig:
    return EvalConfig(**{"multipliers": [1, 2], "tokens_per_batch": 256, **kw})


def test_learned_past_its_table_is_not_applicable(tmp_path, fake_data):
    run = make_run(tmp_path, "learned", L=16, max_len=16)
    rows = evaluation.evaluate_run(run, eval_cfg(lengths=[8]), tmp_path / "results", device="cpu", progress=False)
    by_len = {r["eval_len"]: r for r in rows}
    assert sorted(by_len) == [8, 16, 32]
    assert math.isfinite(by_len[16]["ppl"]) and by_len[16]["tokens"] == 128 and by_len[16]["note"] == ""
    assert math.isnan(by_len[32]["ppl"]) and by_len[32]["note"].startswith("not applicable")
    assert "max_len" in by_len[32]["note"]

    out = tmp_path / "results" / "exp"
    df = pd.read_csv(out / "extrapolation.csv")
    assert len(df) == 3 and set(df["run"]) == {str(run.resolve())} and set(df["step"]) == {7}
    assert df["device"].str.match(r"cpu: .+, \d+ cores, \d+ threads$").all() and df["command"].str.startswith("python ").all()
    assert df.loc[df["eval_len"] == 32, "ppl"].isna().all()
    assert df.loc[df["eval_len"] == 32, "tokens"].isna().all()
    table = (out / "extrapolation.md").read_text().split("## L = 16")[1]
    learned_row = next(line for line in table.splitlines() if line.startswith("| learned"))
    assert learned_row.rstrip().endswith("| n/a |")
    assert (out / "extrapolation.png").stat().st_size > 0
    pp = out / "per_position"
    assert sorted(p.name for p in pp.iterdir()) == [
        "learned-L16-seed0-nonoverlapping-Lv16.csv", "learned-L16-seed0-nonoverlapping-Lv8.csv",
        "learned-L16-seed0-nonoverlapping.png"]
    per = pd.read_csv(pp / "learned-L16-seed0-nonoverlapping-Lv16.csv")
    assert list(per.columns) == ["position_in_window", "mean_loss", "count"]
    assert per["count"].tolist() == [8] * 16  # 128 targets in 8 windows of 16


def test_a_length_whose_loss_is_not_finite_gets_a_row_that_says_so_and_the_table_takes_the_next(tmp_path, fake_data,
                                                                                               monkeypatch):
    run = make_run(tmp_path, "alibi", L=16)
    real = evaluation.score_stream

    def nan_at_32(model, tokens, eval_len, *args, **kwargs):
        r = real(model, tokens, eval_len, *args, **kwargs)
        return dataclasses.replace(r, loss=math.nan, ppl=math.nan) if eval_len == 32 else r

    monkeypatch.setattr(evaluation, "score_stream", nan_at_32)
    rows = evaluation.evaluate_run(run, eval_cfg(multipliers=[1, 2, 4]), tmp_path / "results", device="cpu",
                                   progress=False)
    by_len = {r["eval_len"]: r for r in rows}
    assert math.isnan(by_len[32]["ppl"]) and by_len[32]["note"] == "loss not finite (nan)"
    assert math.isfinite(by_len[16]["ppl"]) and math.isfinite(by_len[64]["ppl"])  # written after it
    df = pd.read_csv(tmp_path / "results" / "exp" / "extrapolation.csv")
    assert sorted(df["eval_len"]) == [16, 32, 64]


def test_reevaluating_replaces_rows_and_sliding_adds_them(tmp_path, fake_data):
    run = make_run(tmp_path, "alibi", L=16)
    results = tmp_path / "results"
    first = evaluation.evaluate_run(run, eval_cfg(), results, device="cpu", progress=False)
    evaluation.evaluate_run(run, eval_cfg(), results, device="cpu", progress=False)
    df = pd.read_csv(results / "exp" / "extrapolation.csv")
    assert len(df) == 2
    assert df.sort_values("eval_len")["ppl"].tolist() == pytest.approx([r["ppl"] for r in first])
    evaluation.evaluate_run(run, eval_cfg(mode="sliding", stride=4, max_tokens=40), results, device="cpu",
                          progress=False)
    df = pd.read_csv(results / "exp" / "extrapolation.csv")
    assert len(df) == 4
    sliding = df[df["mode"] == "sliding"]
    assert sliding["stride"].tolist() == [4, 4] and sliding["tokens"].tolist() == [40, 40]
    assert "sliding, stride 4" in (results / "exp" / "extrapolation.md").read_text()


def test_skip_done_skips_only_rows_of_the_same_weights(tmp_path, fake_data):
    """A folder that already holds rows (the committed tables, a run trained again with a longer budget) is
    evaluated again unless the rows came from bit-identical weights (provenance.weights_digest)."""
    from alibi_lm.provenance import weights_digest

    run, results = make_run(tmp_path, "alibi", L=16), tmp_path / "results"
    first = evaluation.evaluate_run(run, eval_cfg(), results, device="cpu", progress=False, skip_done=True)
    digest = weights_digest(tiny_model("alibi"))
    assert {r["weights"] for r in first} == {digest} and len(digest) == 16
    assert evaluation.evaluate_run(run, eval_cfg(), results, device="cpu", progress=False, skip_done=True) == []
    state = torch.load(run / "checkpoint.pt", weights_only=True)
    state["model"]["blocks.0.attn.qkv.weight"][0, 0] += 0.5  # the same run folder, other weights
    torch.save(state, run / "checkpoint.pt")
    again = evaluation.evaluate_run(run, eval_cfg(), results, device="cpu", progress=False, skip_done=True)
    assert len(again) == 2 and {r["weights"] for r in again} != {digest}
    df = pd.read_csv(results / "exp" / "extrapolation.csv")
    assert len(df) == 2 and set(df["weights"]) == {again[0]["weights"]}  # replaced, not added


def test_skip_done_redoes_rows_of_another_copy_of_the_data_or_without_its_checksum(tmp_path, fake_data):
    run, results = make_run(tmp_path, "alibi", L=16), tmp_path / "results"
    first = evaluation.evaluate_run(run, eval_cfg(), results, device="cpu", progress=False, skip_done=True)
    assert {r["data_sha"] for r in first} == {"0123456789abcdef"}
    fake_data.meta["data"]["valid"] = "fedcba9876543210" * 4  # the split file changed since
    again = evaluation.evaluate_run(run, eval_cfg(), results, device="cpu", progress=False, skip_done=True)
    assert len(again) == 2 and {r["data_sha"] for r in again} == {"fedcba9876543210"}
    csv = results / "exp" / "extrapolation.csv"
    df = pd.read_csv(csv)
    df.drop(columns=["data_sha"]).to_csv(csv, index=False)  # rows written before the column existed
    assert len(evaluation.evaluate_run(run, eval_cfg(), results, device="cpu", progress=False, skip_done=True)) == 2
    assert evaluation.evaluate_run(run, eval_cfg(), results, device="cpu", progress=False, skip_done=True) == []


def test_weights_digest_is_the_content_of_the_state_dict():
    from alibi_lm.provenance import weights_digest

    a, b = tiny_model("t5", seed=0), tiny_model("t5", seed=0)
    assert weights_digest(a) == weights_digest(b) != weights_digest(tiny_model("t5", seed=1))
    expected = __import__("hashlib").sha256()
    for name, t in a.state_dict().items():  # independently: names, dtype, shape, then the raw bytes
        expected.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode() + t.contiguous().numpy().tobytes())
    assert weights_digest(a) == expected.hexdigest()[:16]
    with torch.no_grad():
        b.position.bias_table.weight[0, 0] = 1e-30  # one element, far below any printed precision
    assert weights_digest(b) != weights_digest(a)


def test_eval_lengths():
    assert eval_lengths(64, [1, 2, 4, 8], [100, 128]) == [64, 100, 128, 256, 512]
    assert eval_lengths(10, [1.5], None) == [15]


def test_not_a_run_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="not a run folder: a run folder holds config.yaml and checkpoint.pt"):
        evaluation.evaluate_run(tmp_path / "empty", eval_cfg(), tmp_path / "results", device="cpu")
    with pytest.raises(UserError, match="does not exist"):
        evaluation.evaluate_run(tmp_path / "nowhere", eval_cfg(), tmp_path / "results", device="cpu")


def test_truncated_checkpoint(tmp_path, fake_data):
    run = make_run(tmp_path)
    blob = (run / "checkpoint.pt").read_bytes()
    (run / "checkpoint.pt").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(UserError, match="truncated or corrupt") as e:
        evaluation.evaluate_run(run, eval_cfg(), tmp_path / "results", device="cpu")
    assert "\n" not in str(e.value)


def test_checkpoint_not_matching_its_model_config(tmp_path, fake_data):
    run = make_run(tmp_path)
    state = torch.load(run / "checkpoint.pt", weights_only=True)
    state["model_config"]["d_model"] = 32
    torch.save(state, run / "checkpoint.pt")
    with pytest.raises(UserError, match="does not match the model config") as e:
        evaluation.evaluate_run(run, eval_cfg(), tmp_path / "results", device="cpu")
    assert "\n" not in str(e.value)


def test_vocab_size_mismatch(tmp_path, fake_data):
    fake_data.vocab_size = V + 1
    with pytest.raises(UserError, match="vocab_size=61"):
        evaluation.evaluate_run(make_run(tmp_path), eval_cfg(), tmp_path / "results", device="cpu")


class ConstantLoss:
    """A scorer as a Hugging Face model is seen (HFScorer's refusal of a RoPE extension): loss 2 nats on every target."""

    set_scaling = hf.HFScorer.set_scaling

    def check_positions(self, end):
        pass

    def __call__(self, idx, targets):
        return torch.full(targets.shape, 2.0)  # (B, T)


def test_a_hugging_face_like_subject_is_scored_and_refuses_a_rope_extension(tmp_path):
    tokens = random_tokens(41, seed=1)  # 40 targets
    model = HandMadeSubject(ConstantLoss(), tokens, dict(position="hf:toy", train_len=8, seed=None),
                            dict(run="hf:toy", step=None, weights="w"), tmp_path / "hf", words=21)  # 20 word targets
    with pytest.raises(UserError, match=r"the RoPE rescaling yarn \(extension=yarn, or position.scaling=yarn\) "
                                        r"applies to runs trained with position=rope, not a Hugging Face model"):
        evaluation.Evaluation(model, eval_cfg(), progress=False, position_cfg={"scaling": "yarn"})
    rows = evaluation.Evaluation(model, eval_cfg(), progress=False).run()
    assert [(r["eval_len"], r["tokens"], r["words"]) for r in rows] == [(8, 40, 20), (16, 40, 20)]
    assert all(r["ppl"] == pytest.approx(math.exp(2.0)) and r["word_ppl"] == pytest.approx(math.exp(4.0)) for r in rows)
    assert (tmp_path / "hf" / "per_position" / "hf-toy-L8-seedNA-nonoverlapping-Lv16.csv").is_file()


def test_sliding_stride_longer_than_a_length(tmp_path, fake_data):
    with pytest.raises(UserError, match="eval.stride=32"):
        evaluation.evaluate_run(make_run(tmp_path), eval_cfg(mode="sliding", stride=32), tmp_path / "r", device="cpu")


def test_cli_one_line_error(tmp_path):
    out = run_python(["-m", "alibi_lm.eval", f"run={tmp_path}"], cwd=Path(__file__).resolve().parent.parent, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and out.stderr.startswith("error: ")
    assert "not a run folder" in out.stderr


def test_blockwise_causal_attention_rows_sit_beside_full_attention(tmp_path, fake_data):
    """eval.attention=bca: at Lv <= 2L every query still sees every earlier key (its block and the one before), so
    the perplexity equals full attention's; past 2L it differs, and the rows carry attention=bca, shown as xpos+bca."""
    run = make_run(tmp_path, "xpos", L=16)
    results = tmp_path / "results"
    full = evaluation.evaluate_run(run, eval_cfg(multipliers=[1, 2, 4]), results, device="cpu", progress=False)
    bca = evaluation.evaluate_run(run, eval_cfg(multipliers=[1, 2, 4], attention="bca"), results, device="cpu",
                                  progress=False)
    assert [r["attention"] for r in bca] == ["bca"] * 3 and [r["attention"] for r in full] == ["full"] * 3
    assert [r["ppl"] for r in bca[:2]] == pytest.approx([r["ppl"] for r in full[:2]], rel=1e-6)
    assert bca[2]["ppl"] != pytest.approx(full[2]["ppl"], rel=1e-6)
    df = pd.read_csv(results / "exp" / "extrapolation.csv")
    assert len(df) == 6 and sorted(df["attention"].unique()) == ["bca", "full"]
    table = (results / "exp" / "extrapolation.md").read_text()
    assert "| xpos+bca |" in table and "| xpos |" in table


def test_blockwise_attention_hides_exactly_the_keys_before_the_previous_block():
    """A query in block b attends keys from the start of block b - 1: with one layer, the outputs of the last block
    equal those of the model run on the last two blocks alone (a relative scheme), query blocks and all."""
    from alibi_lm.model import AttentionWindow

    for position in ("alibi", "rope", "t5", "nope"):
        torch.manual_seed(0)
        model = TransformerLM(LMConfig(vocab_size=V, n_layer=1, n_head=2, d_model=16, position=position,
                                       attn_query_block=8)).eval()
        x = torch.from_numpy(random_tokens(2 * 48, seed=1).reshape(2, 48)).long()
        with torch.no_grad():
            full = model(x)
            model.attention_window = AttentionWindow("bca", 16)
            windowed = model(x)
            model.attention_window = None
            alone = model(x[:, 16:])
        torch.testing.assert_close(windowed[:, :32], full[:, :32], rtol=1e-5, atol=1e-5)  # blocks 0, 1: all keys
        torch.testing.assert_close(windowed[:, 32:], alone[:, 16:], rtol=1e-5, atol=1e-5)  # block 2: blocks 1, 2 only
        assert not torch.allclose(windowed[:, 32:], full[:, 32:], atol=1e-4), position


def test_blockwise_attention_needs_a_model_of_this_project_with_a_known_L():
    from alibi_lm.errors import UserError

    with pytest.raises(UserError, match="eval.attention=bca needs a model trained by alibi_lm"):
        evaluation.blockwise_attention(SimpleNamespace(), "bca", 64)  # a Hugging Face scorer has no window
    assert evaluation.blockwise_attention(SimpleNamespace(), "full", None) == "full"


def test_a_cell_scored_on_another_budget_is_not_replaced(tmp_path, fake_data):
    """A quick eval.max_tokens trial on a run whose rows are in the table: one line, nothing replaced; the same
    budget again replaces its rows as before."""
    from alibi_lm.errors import UserError

    run = make_run(tmp_path, "alibi", L=16)
    results = tmp_path / "results"
    evaluation.evaluate_run(run, eval_cfg(), results, device="cpu", progress=False)
    before = (results / "exp" / "extrapolation.csv").read_bytes()
    with pytest.raises(UserError, match="scored on 128 targets; this evaluation scores 40 .*paths.results="):
        evaluation.evaluate_run(run, eval_cfg(max_tokens=40), results, device="cpu", progress=False)
    assert (results / "exp" / "extrapolation.csv").read_bytes() == before
    evaluation.evaluate_run(run, eval_cfg(max_tokens=40), tmp_path / "trial", device="cpu", progress=False)
    evaluation.evaluate_run(run, eval_cfg(), results, device="cpu", progress=False)  # the same budget: replaced
    # with skip_done the other way round: the trial's rows are not taken for the whole split's, nor replaced
    trial = tmp_path / "trial" / "exp" / "extrapolation.csv"
    kept = trial.read_bytes()
    def opened(**ev):
        subject = evaluation.open_native(run, tmp_path / "trial", torch.device("cpu"), "auto", False)
        return evaluation.Evaluation(subject, eval_cfg(skip_done=True, **ev), progress=False)

    whole = opened()
    assert whole.pending() and whole.lengths_to_score() == whole.lengths()
    with pytest.raises(UserError, match="scored on 40 targets; this evaluation scores 128 "):
        whole.run()
    assert trial.read_bytes() == kept
    assert opened(max_tokens=40).lengths_to_score() == []  # its own budget: done


def test_evaluating_a_run_records_its_learned_values_and_the_report_shows_them(tmp_path, fake_data):
    """learned.csv gets the run's learned slopes beside the official ones; extrapolation.md a section on them."""
    from alibi_lm.results.learned_values import LEARNED_CSV, read_learned

    model = tiny_model("alibi", learn_slopes=True)
    with torch.no_grad():
        model.position.log_slopes.add_(torch.tensor([0.5, -0.25]))  # as if trained: away from the official slopes
    slopes = model.position.slopes.tolist()
    run = write_run(tmp_path, model, 16, 0, "exp", learn_slopes=True)
    evaluation.evaluate_run(run, eval_cfg(), tmp_path / "results", device="cpu", progress=False)
    rows = read_learned(tmp_path / "results" / "exp" / LEARNED_CSV)
    assert rows.sort_values("name")["value"].tolist() == pytest.approx(slopes)
    assert rows.sort_values("name")["initial"].tolist() == pytest.approx([2**-4, 2**-8])  # 2 heads
    assert set(rows["position"]) == {"alibi+learn_slopes"} and set(rows["seed"]) == {0}
    md = (tmp_path / "results" / "exp" / "extrapolation.md").read_text()
    assert "## Learned values" in md and "| alibi+learn_slopes | alibi_slope_0 | 0.0625 |" in md


@pytest.mark.parametrize("last_segment, config_precision, want", [
    (dict(device="cpu: AMD EPYC, 2 cores, 1 threads", precision="fp32"), "auto", "fp32"),  # fp32 on a GPU too
    (dict(device="cpu: AMD EPYC, 2 cores, 1 threads, bf16", precision="bf16"), "auto", "bf16"),
    (dict(device="NVIDIA H200, fp32", precision="fp32"), "bf16", "fp32"),  # resumed at fp32: the last segment's
    (dict(device="cpu: AMD EPYC, 2 cores, 1 threads"), "auto", "fp32"),  # a segment from before precision: CPU
    (dict(device="NVIDIA H200"), "auto", "auto"),  # ... and on a GPU: the evaluating device decides
    (None, "bf16", "bf16"),  # no status.json: the config's train.precision
])
def test_precision_auto_scores_a_run_as_its_last_training_segment_ran(tmp_path, last_segment, config_precision, want):
    import json

    from omegaconf import OmegaConf

    run = make_run(tmp_path)
    cfg = OmegaConf.load(run / "config.yaml")
    cfg.train.precision = config_precision
    if last_segment is not None:
        segments = [dict(device="NVIDIA H200, bf16", precision="bf16", steps=[0, 4]), dict(last_segment, steps=[4, 7])]
        (run / "status.json").write_text(json.dumps(dict(status="completed", train_segments=segments)))
    assert subject.trained_precision(run, cfg) == want


def test_a_task_runs_evaluation_refuses_another_precision(tmp_path):
    run = make_run(tmp_path)
    (run / "config.yaml").write_text((run / "config.yaml").read_text() + "task_name: passkey\n")
    with pytest.raises(UserError, match="precision=bf16 applies to language-model runs.*float32"):
        evaluation.evaluate_run(run, eval_cfg(), tmp_path / "results", device="cpu", precision="bf16")


def test_rows_go_where_the_runs_experiment_writes_unless_paths_results_says_otherwise(tmp_path, monkeypatch):
    """A run trained with paths.results=X (experiment=demo: runs/demo/results) is scored again into X, not into
    results/, so re-evaluating a trial run never touches committed results; an explicit paths.results wins."""
    from conftest import compose_job, make

    from alibi_lm.eval import app

    own = write_run(tmp_path / "own", make("alibi"))
    cfg = (own / "config.yaml").read_text()
    (own / "config.yaml").write_text(cfg + f"paths:\n  results: {tmp_path}/demo-results\n")
    bare = write_run(tmp_path / "bare", make("alibi"))  # a config.yaml without paths: beside its experiment's runs
    seen = []
    monkeypatch.setattr(app, "evaluate_run", lambda run_dir, eval_cfg, results_root, **kw: seen.append(results_root))
    app.evaluate(compose_job("evaluate", f"run={own}"))
    app.evaluate(compose_job("evaluate", f"run={own}", f"paths.results={tmp_path}/mine"))
    app.evaluate(compose_job("evaluate", f"run={bare}"))
    assert seen == [tmp_path / "demo-results", tmp_path / "mine", bare.parent / "results"]
    assert compose_job("evaluate", "run=hf:x").results_root() == Path("runs/hf/results")  # a Hugging Face model
    for damaged in ("paths: [unclosed", "paths:\n  results: [a, b]\n", "paths:\n  results: 5\n"):
        (own / "config.yaml").write_text(damaged)  # opening the run reports a damaged file, not this
        assert compose_job("evaluate", f"run={own}").results_root() == own.parent / "results"
