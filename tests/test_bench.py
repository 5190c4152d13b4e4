"""The benchmark package (scripts/bench, make bench), without timed assertions: the interval math on
synthetic ratios, the round harness on a fake clock, the FLOP model against hand-computed values,
the scheme list from the registry, the report from hand-made rows, a tiny run of the training
section, and (slow) the whole command in --quick mode."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from alibi_lm.bench import harness
from alibi_lm.bench.common import registered_schemes
from alibi_lm.bench.flops import flops_per_token, weights_per_token
from alibi_lm.bench.harness import RoundPlan, run_rounds
from alibi_lm.bench.options import Options
from alibi_lm.bench.report import markdown
from alibi_lm.bench.rows import MemoryRow, Peak, PeerRatioRow, Results, TrainRow
from alibi_lm.bench.stats import Ratio, Timings, ratio_interval, t_quantile
from alibi_lm.bench.targets import TARGETS, scheme_cost, verdict
from alibi_lm.model import LMConfig
from alibi_lm.positions import POSITION_SCHEMES, PositionScheme

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")

# ---------------------------------------------------------------------------------------------
# Interval math


@pytest.mark.parametrize("df, exact", [(1, 12.7062), (2, 4.30265), (3, 3.18245), (4, 2.77645), (5, 2.57058),
                                       (9, 2.26216), (29, 2.04523), (100, 1.98397)])
def test_t_quantile_matches_the_table(df, exact):
    assert t_quantile(0.975, df) == pytest.approx(exact, abs=0.004 if df == 3 else 0.001)


def test_ratio_interval_by_hand():
    rounds = [0.9, 1.0, 1.1, 1.05, 0.95]
    logs = np.log(rounds)
    mean, sd = logs.mean(), logs.std(ddof=1)
    half = 2.776445 * sd / math.sqrt(5)
    r = ratio_interval(rounds)
    assert r.estimate == pytest.approx(math.exp(mean), rel=1e-12)  # the geometric mean
    assert r.low == pytest.approx(math.exp(mean - half), rel=1e-3)
    assert r.high == pytest.approx(math.exp(mean + half), rel=1e-3)
    assert (r.rounds, r.round_min, r.round_max) == (5, 0.9, 1.1)
    assert r.half_width == pytest.approx(math.exp(half) - 1, rel=1e-3)
    assert not r.within(0.10) and r.within(0.11)


def test_ratio_interval_is_mirrored_for_the_reciprocal_and_exact_without_noise():
    rounds = [1.3, 1.2, 1.25, 1.4, 1.1, 1.3]
    a, b = ratio_interval(rounds), ratio_interval([1 / x for x in rounds])
    assert a.estimate * b.estimate == pytest.approx(1.0)
    assert a.low * b.high == pytest.approx(1.0) and a.high * b.low == pytest.approx(1.0)
    flat = ratio_interval([1.25] * 4)
    assert flat.estimate == flat.low == flat.high == pytest.approx(1.25) and flat.within(0.0)
    one = ratio_interval([2.0])
    assert one.high == math.inf and not one.within(1.0) and "one round" in one.text()


def test_verdict_reads_the_interval():
    assert verdict(Ratio(1.0, 0.98, 1.02, 10, 0.9, 1.1), 0.97) == "met"
    assert verdict(Ratio(0.9, 0.88, 0.92, 10, 0.8, 1.0), 0.97) == "NOT met"
    assert verdict(Ratio(0.99, 0.95, 1.03, 10, 0.9, 1.1), 0.97).startswith("undecided")
    assert "estimate <" in verdict(Ratio(0.96, 0.93, 0.99, 10, 0.9, 1.1), 0.97)


# ---------------------------------------------------------------------------------------------
# Paired rounds, on a fake clock: each "model" advances it by a scripted number of seconds


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def model(self, seconds):
        """A model whose call takes seconds(call index) on this clock."""
        calls = iter(range(10**6))

        def fn():
            self.now += seconds(next(calls))

        return fn


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(harness, "time", SimpleNamespace(perf_counter=fake))
    return fake


class ScriptedMeter:
    """Other processes' share of the cores in round r: shares[r]."""

    def __init__(self, shares):
        self.shares, self.round = shares, -1

    def __call__(self):
        self.round += 1
        share = self.shares[self.round]
        return SimpleNamespace(others_share=lambda: share)


def test_rounds_stop_at_the_minimum_when_ratios_are_exact(clock):
    fns = {"a": clock.model(lambda i: 1.0), "b": clock.model(lambda i: 2.0)}
    t = run_rounds(fns, [("a", "b")], RoundPlan(min_rounds=4, max_rounds=50, warmup=1, quiet=None), CPU)
    assert t.rounds == 4 and len(t.seconds["a"]) == 4
    r = t.ratio("a", "b")  # a is twice as fast: throughput ratio 2
    assert r.estimate == pytest.approx(2.0) and r.low == pytest.approx(2.0) and r.high == pytest.approx(2.0)


def test_rounds_go_on_while_a_ratio_is_noisy_and_stop_at_the_cap(clock):
    noisy = clock.model(lambda i: 2.0 * (1.3 if i % 2 else 0.7))  # +/-30% around 2 s
    fns = {"a": clock.model(lambda i: 1.0), "b": noisy, "c": clock.model(lambda i: 1.0), "d": clock.model(lambda i: 1.0)}
    plan = RoundPlan(min_rounds=3, max_rounds=12, tolerance=0.05, warmup=1, quiet=None)
    t = run_rounds(fns, [("a", "b"), ("c", "d")], plan, CPU)
    assert t.rounds == 12
    assert len(t.seconds["a"]) == len(t.seconds["b"]) == 12  # in an open pair: timed every round
    assert len(t.seconds["c"]) == len(t.seconds["d"]) == 3  # converged at the minimum: dropped out
    assert not t.ratio("a", "b").within(0.05) and t.ratio("c", "d").within(0.05)


def test_rounds_stop_at_the_time_budget(clock):
    fns = {"a": clock.model(lambda i: 1.0), "b": clock.model(lambda i: 2.0 * (1.5 if i % 2 else 0.5))}
    t = run_rounds(fns, [("a", "b")], RoundPlan(min_rounds=2, max_rounds=100, warmup=0, budget_s=20.0, quiet=None), CPU)
    assert 2 < t.rounds < 100 and clock.now < 30


def test_a_model_that_raises_is_reported_not_fatal(clock):
    def broken():
        raise RuntimeError("no kernel for this\nsecond line")

    t = run_rounds({"a": clock.model(lambda i: 1.0), "x": broken}, [("a", "x")], RoundPlan(2, 5, warmup=1, quiet=None), CPU)
    assert t.failed == {"x": "failed: RuntimeError: no kernel for this"} and "x" not in t.seconds
    assert t.rounds == 2 and t.ratio("a", "x") is None and isinstance(t, Timings)


def test_disturbed_rounds_are_left_out_and_the_rounds_go_on(clock):
    slow_when_busy = {1, 3}  # rounds where another process took the cores: b's step took 3x as long
    b = clock.model(lambda i: 6.0 if i - 1 in slow_when_busy else 2.0)  # call 0 is the warm-up
    fns = {"a": clock.model(lambda i: 1.0), "b": b}
    meter = ScriptedMeter([0.0, 0.5, 0.01, 0.3] + [0.0] * 20)
    t = run_rounds(fns, [("a", "b")], RoundPlan(min_rounds=4, max_rounds=20, warmup=1), CPU, meter=meter)
    assert t.disturbed_rounds() == {1, 3} and t.rounds == 4  # two quiet rounds agree exactly: done
    r = t.ratio("a", "b")
    assert r.estimate == pytest.approx(2.0) and r.rounds == 2 and r.dropped == 2 and not r.disturbed
    assert t.median("b") == 2.0 and t.samples("b") == [2.0, 2.0]


def test_without_two_quiet_rounds_every_round_is_used_and_flagged(clock):
    fns = {"a": clock.model(lambda i: 1.0), "b": clock.model(lambda i: 2.0)}
    meter = ScriptedMeter([0.5, 0.5, 0.0])
    t = run_rounds(fns, [("a", "b")], RoundPlan(min_rounds=3, max_rounds=3, warmup=0), CPU, meter=meter)
    r = t.ratio("a", "b")
    assert r.rounds == 3 and r.dropped == 0 and r.disturbed and r.text().endswith("‡")


def test_rounds_alternate_direction(clock):
    order = []
    fns = {n: (lambda n=n: order.append(n)) for n in "abc"}
    run_rounds(fns, [], RoundPlan(3, 3, warmup=0, quiet=None), CPU)
    assert "".join(order) == "abccbaabc"


# ---------------------------------------------------------------------------------------------
# FLOP model


def tiny(**kw) -> LMConfig:
    return LMConfig(**{**dict(vocab_size=33278, n_layer=4, n_head=4, d_model=128, d_ff=512), **kw})


def test_flops_plain_softmax_by_hand():
    count = flops_per_token(tiny(adaptive_cutoffs=None), 128, np.zeros(10, dtype=np.int64))
    layers = 4 * (4 * 128**2 + 2 * 128 * 512)  # 786432
    assert count.n_weights == layers + 128 * 33278 == 5_046_016
    assert count.attention == 12 * 4 * 128 * 128 == 786_432
    assert count.per_token == 6 * 5_046_016 + 786_432 == 31_062_528


def test_flops_adaptive_softmax_weights_tails_by_their_share_of_targets():
    cfg = tiny(adaptive_cutoffs=[2000, 10000], adaptive_factor=4)
    targets = np.array([5, 7, 3000, 9999, 3000, 2000, 20000, 33277])  # 2 head, 4 in tail 1, 2 in tail 2
    head = 128 * (2000 + 2)  # 256256: the head's words and one logit per tail
    tail1 = 0.5 * (128 * 32 + 32 * 8000)  # 130048: d -> d/4, then the band's 8000 words
    tail2 = 0.25 * (128 * 8 + 8 * 23278)  # 46812
    assert weights_per_token(cfg, targets) == pytest.approx(786_432 + head + tail1 + tail2)


# ---------------------------------------------------------------------------------------------
# Schemes come from the registry; targets and notes cover schemes nobody listed


def test_schemes_come_from_the_registry_with_the_baseline_last(monkeypatch):
    assert set(registered_schemes()) == set(POSITION_SCHEMES) and registered_schemes()[-1] == "nope"

    class Newcomer(PositionScheme):
        static_bias = True

        def score_bias(self, q_pos, k_pos):
            return None

    monkeypatch.setitem(POSITION_SCHEMES, "zz_newcomer", Newcomer)
    assert "zz_newcomer" in registered_schemes() and registered_schemes()[-1] == "nope"
    assert TARGETS.ratio_goal("zz_newcomer") == 0.90 and TARGETS.ratio_goal("alibi") == 0.97
    assert scheme_cost("zz_newcomer") == "an (H, L, L) score bias, fixed and cached across steps"


def test_the_variants_are_benchmarked_beside_the_schemes_with_their_own_settings():
    """make bench measures alibi_lm/plans/variants.py's variants by default, each built with its overrides (iRoPE's NoPE
    layer and window at the bench's L), nope still last."""
    from alibi_lm.bench.common import benchmarked_schemes, lm_config
    from alibi_lm.plans.variants import VARIANTS

    every = benchmarked_schemes()
    assert every[-1] == "nope" and set(every) == set(POSITION_SCHEMES) | set(VARIANTS)
    model, _ = lm_config("tiny", "irope-window", 128)
    assert (model.position, model.nope_every, model.local_window) == ("rope", 4, 64)
    model, _ = lm_config("tiny", "alibi+ssmax", 64)
    assert model.position == "alibi" and model.ssmax


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_is_resolved_by_the_package_with_a_one_line_error(capsys):
    from alibi_lm.bench.cli import parse_args, resolve

    for device, message in (("cuda", "error: --device=cuda but no CUDA device is visible; use --device=auto"),
                            ("tpu", "error: --device must be one of auto, cpu, cuda, got 'tpu'")):
        with pytest.raises(SystemExit) as stop:
            resolve(parse_args(["--device", device]), ["--device", device])
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith(message) and len(err.strip().splitlines()) == 1
    assert resolve(parse_args(["--device", "auto", "--quick"]), ["--quick"]).device == torch.device("cpu")


# ---------------------------------------------------------------------------------------------
# The report from hand-made rows, and a tiny real run of the training section


def options(tmp_path, **kw) -> Options:
    base = dict(device=CPU, model="tiny", lengths=[16], eval_length=16, tokens_per_step=32, schemes=["alibi", "nope"],
                mem_schemes=["alibi"], mem_multipliers=[8, 16], train_plan=RoundPlan(2, 2, warmup=1),
                eval_plan=RoundPlan(1, 1, warmup=1), peers=False, sections={"train"}, out=tmp_path, quick=True,
                argv=["--quick"], overrides=("model.n_layer=1", "model.d_model=32", "model.n_head=2", "model.d_ff=64"))
    return Options(**{**base, **kw})


def test_report_prints_every_ratio_with_its_interval(tmp_path):
    r = Ratio(0.95, 0.93, 0.965, 8, 0.9, 1.0)
    train = [TrainRow("train", "alibi", "alibi-lm", "adaptive", "sdpa", 16, 2, tiny(), step_ms=10.0, tokens_per_s=3200,
                      ratio=r, ratio_to="nope", n_params_flops=1e6, attention_flops_per_token=1e5, flops_per_token=7e6),
             TrainRow("train", "nope", "alibi-lm", "adaptive", "sdpa", 16, 2, tiny(), step_ms=9.5, tokens_per_s=3368),
             TrainRow("train", "t5", "alibi-lm", "", "", 16, 2, note="failed: ValueError: boom")]
    peer = [PeerRatioRow(16, "alibi-lm, plain softmax", "x-transformers", "like for like", Ratio(1.2, 1.1, 1.29, 9, 1, 1.4))]
    memory = [MemoryRow("alibi", 16, 8, 300.0, 250.0), MemoryRow("alibi", 16, 16, 340.0, 250.0)]
    res = Results(train, peer, [], memory, Peak(1e11, "a matmul", 1.2e11), 61.0, "now", "abc1234",
                  others_cpu={"train": 0.31})
    text = markdown(options(tmp_path, schemes=["alibi", "t5", "nope"], overrides=()), res)
    assert "| 1. alibi training tokens/s ≥ 0.97 × nope, L=16 | 0.950 [0.930–0.965] | NOT met |" in text
    assert "| 1. t5 trains, L=16 | failed: ValueError: boom | NOT met |" in text
    assert "| 2. alibi-lm (plain softmax) ≥ 1.3x x-transformers training tokens/s, L=16 | 1.20 [1.10–1.29]† | NOT" in text
    assert "| alibi | sdpa | 3200 | 0.950 [0.930–0.965] |" in text
    assert "| 3. alibi: peak memory at 16L ≤ 2.2 × 8L, no OOM | 1.80x" in text
    assert "| alibi | 16 | 1.00 | 0.10 | 7.0 | 0.0224 | 22.4% |" in text  # 7e6 FLOPs x 3200 tok/s / 1e11
    assert "while each section ran: train 31%; **the machine was not quiet**" in text
    assert "- commit: abc1234\n" in text
    records = res.records()
    assert {r["section"] for r in records} == {"train", "peer_ratio", "eval_memory"}
    assert records[0]["ratio_low"] == 0.93 and records[0]["mfu"] == pytest.approx(0.224)


def test_training_section_runs_end_to_end_on_a_tiny_batch(tmp_path):
    from alibi_lm.bench.training import section_training

    logs = []
    rows, peer = section_training(options(tmp_path), logs.append)
    by = {r.name: r for r in rows}
    assert set(by) == {"alibi", "nope"} and peer == []
    assert by["alibi"].tokens_per_s > 0 and by["alibi"].rounds == 2 and by["alibi"].ratio.rounds == 2
    assert by["alibi"].ratio_to == "nope" and by["nope"].ratio is None
    assert by["alibi"].flops_per_token > 6 * by["alibi"].n_params_flops
    assert any("2 rounds" in line for line in logs)


def test_cuda_adds_the_dropout_0_rows_unless_told_not_to(tmp_path, monkeypatch):
    """On CUDA each of alibi, t5, kerple_log, fire, fox and nope gets a "(dropout 0)" row (FlexAttention) beside it, paired
    with "nope (dropout 0)"; --no-dropout-rows (the compiled MFU stage of scripts/gpu_check.sh) leaves them out."""
    import dataclasses

    from alibi_lm.bench import training
    from alibi_lm.bench.cli import parse_args, resolve

    def fake_ours(opts, scheme, x, y, overrides=(), label=None, section="train", baseline=None):
        return training.Candidate(label or scheme, section, "alibi-lm", "", "", None, baseline=baseline), None, None

    monkeypatch.setattr(training, "ours", fake_ours)
    cuda = dataclasses.replace(options(tmp_path), device=torch.device("cuda"), schemes=["alibi", "t5", "fire", "rope", "nope"])
    names = {c.name: c.baseline for c in training.scheme_candidates(cuda, None, None)}
    assert names == {"alibi": "nope", "t5": "nope", "fire": "nope", "rope": "nope", "nope": None,
                     "alibi (dropout 0)": "nope (dropout 0)", "t5 (dropout 0)": "nope (dropout 0)",
                     "fire (dropout 0)": "nope (dropout 0)", "nope (dropout 0)": None}
    assert resolve(parse_args(["--no-dropout-rows"]), ["--no-dropout-rows"]).dropout_rows is False
    without = dataclasses.replace(cuda, dropout_rows=False)
    assert [c.name for c in training.scheme_candidates(without, None, None)] == ["alibi", "t5", "fire", "rope", "nope"]


def test_threads_section_measures_four_cells_side_by_side_and_reports_their_ratios(tmp_path):
    from alibi_lm.bench.threads import section_threads

    before, logs = torch.get_num_threads(), []
    opts = options(tmp_path, sections={"threads"}, thread_seconds=0.05, thread_reps=2)
    rows = section_threads(opts, logs.append)
    assert torch.get_num_threads() == before  # put back as it was
    assert [(r.busy, r.default) for r in rows] == [(False, False)] * 2 + [(False, True), (True, False), (True, False),
                                                                           (True, True)]
    assert [r.threads for r in rows if not r.default] == [1, 2, 1, 2]  # then the default's own count, idle and busy
    assert all(r.tokens_per_s > 0 and r.reps == 2 and r.steps >= 2 and r.L == 16 and r.batch == 2 for r in rows)
    assert all(0 <= r.others_share for r in rows)  # no timing target: only that it was measured
    res = Results([], [], [], [], Peak(1e11, "a matmul"), 1.0, "now", threads=rows)
    assert [r["section"] for r in res.records()] == ["threads"] * 6
    text = markdown(opts, res)
    assert "## 5. Threads on a shared machine" in text and "| 2 threads / 1 thread, beside the busy loop |" in text
    assert "| 1 thread |" in text and "| 2 threads + busy loop |" in text


@pytest.mark.slow
def test_benchmark_quick_writes_its_tables(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "alibi_lm.bench", "--quick", "--lengths", "32", "--threads", "1", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (csv,) = tmp_path.glob("cpu-*core.csv")
    (md,) = tmp_path.glob("cpu-*core.md")
    import pandas as pd

    df = pd.read_csv(csv)
    assert set(df.section) == {"train", "peers", "internal", "peer_ratio", "eval", "eval_memory", "threads", "startup"}
    built_in = {s for s, cls in POSITION_SCHEMES.items() if cls.__module__.startswith("alibi_lm.")}  # not conftest's
    from alibi_lm.plans.variants import VARIANTS

    assert set(df[df.section == "train"].name) == built_in | set(VARIANTS)
    assert {"naive", "x-transformers", "alibi-lm, plain softmax"} <= set(df[df.section == "peers"].name)
    ratios = df[df.ratio.notna()]
    assert (ratios.ratio_low <= ratios.ratio).all() and (ratios.ratio <= ratios.ratio_high).all()
    assert df[df.section == "eval"].tokens_per_s.gt(0).all()
    assert df[df.section == "eval_memory"].peak_mem_mb.gt(0).all()
    (ext_csv,) = tmp_path.glob("cpu-*core-extension.csv")  # section 6: both kinds of method, at 16L only
    ext = pd.read_csv(ext_csv)
    assert set(zip(ext.scheme, ext.method)) == {(s, m) for s in ("alibi", "rope") for m in ("none", "streaming", "self_extend")}
    assert set(ext.Lv) == {16 * 32} and ext.tokens_per_s.gt(0).all() and ext.memory_mb.gt(0).all()
    text = md.read_text()
    for heading in ("## Targets", "## 1. Training throughput", "## 2. ALiBi against peer", "## 3. Evaluation",
                    "## 4. Model FLOPs utilisation", "## 5. Threads on a shared machine", "- commit:", "- hardware:",
                    "wall time"):
        assert heading in text


def test_cpu_meter_counts_only_other_processes(monkeypatch):
    from alibi_lm.bench import common

    clock = {"t": 0.0, "busy": 100.0, "own": 10.0}
    monkeypatch.setattr(common.time, "perf_counter", lambda: clock["t"])
    monkeypatch.setattr(common, "_busy_cpu_seconds", lambda: clock["busy"])
    monkeypatch.setattr(common, "_own_cpu_seconds", lambda: clock["own"])
    monkeypatch.setattr(common.os, "cpu_count", lambda: 2)
    meter = common.CpuMeter.start()
    clock.update(t=10.0, busy=118.0, own=26.0)  # 18 s busy on 2 cores in 10 s, 16 of them ours
    assert meter.others_share() == pytest.approx(2 / 20)


@pytest.mark.parametrize("args, message", [(["--sections", "evaluation"], "unknown section(s) evaluation; choose from"),
                                           (["--schemes", "nosuch"], "unknown scheme(s) nosuch")])
def test_a_bad_section_or_scheme_is_one_line_and_exit_2(args, message, tmp_path):
    """A misspelled section must not run nothing silently: one line, exit 2, nothing written."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "alibi_lm.bench", *args, "--no-peers", "--out", str(tmp_path / "b")],
                         cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [f"error: {out.stderr.strip()[7:]}"]
    assert message in out.stderr and not (tmp_path / "b").exists()
