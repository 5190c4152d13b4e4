"""make reproduce's plan (scripts/reproduce.py --dry-run): every registered scheme, the RoPE extensions and the
context probes are steps of the committed reproduction."""

import subprocess
import sys
from pathlib import Path

from alibi_lm.positions.rope import ROPE_SCALINGS

ROOT = Path(__file__).resolve().parent.parent



def plan(*args: str) -> list[str]:
    out = subprocess.run([sys.executable, "scripts/reproduce.py", "--dry-run", *args], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    return out.splitlines()


def test_the_plan_covers_every_scheme_rope_extension_and_probe():
    steps = plan()
    registered = subprocess.run([sys.executable, "-m", "alibi_lm.positions"], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.strip()  # the package's registry (tests add a scheme to theirs)
    assert len(registered.split(",")) >= 11
    assert steps[0].startswith("all schemes at L:") and f"position={registered} " in steps[0]
    for seed in (0, 1, 2):
        for method in ROPE_SCALINGS:
            assert any(s.startswith(f"RoPE extension {method} rope-L128-seed{seed}:") and f"position.scaling={method}" in s
                       for s in steps)
    for scheme in registered.split(","):
        assert any(s.startswith(f"context probes {scheme}-L128-seed0:") for s in steps)
        assert any(s.startswith(f"sliding eval {scheme}-L128-seed0:") and "eval.mode=sliding" in s for s in steps)
    assert steps[-1].startswith("report:")
    # what the one-seed report needs comes first; the extra seeds (and their rope runs' extensions) last
    first = {name: min(i for i, s in enumerate(steps) if s.startswith(name))
             for name in ("training-length sweep", "sliding eval", "context probes", "more seeds")}
    assert first["training-length sweep"] < first["sliding eval"] < first["context probes"] < first["more seeds"]
    assert all(i > first["more seeds"] for i, s in enumerate(steps) if "seed1" in s or "seed2" in s)


def test_the_plan_leaves_out_what_is_switched_off():
    steps = plan("--rope-scalings=", "--no-context-probes", "--more-seeds=", "--other-lengths=")
    assert not any(s.startswith(("RoPE extension", "context probes", "more seeds", "training-length")) for s in steps)
    steps = plan("--more-seeds=")  # the rope run at L alone gets the extensions
    assert sum(s.startswith("RoPE extension") for s in steps) == 4 and not any("seed1" in s for s in steps)


def test_empty_entries_in_comma_lists_are_dropped():
    steps = plan("--seeds=0,", "--rope-scalings=linear,", "--schemes=alibi,rope,", "--more-seeds=,")
    assert not any("seed " in s or s.endswith("seed:") or "-seed:" in s for s in steps)
    assert [s.split(":")[0] for s in steps if s.startswith("RoPE")] == ["RoPE extension linear rope-L128-seed0"]
    assert all("position.scaling=" not in s or "position.scaling=linear" in s for s in steps)
    assert steps[0].startswith("all schemes at L:") and "position=alibi,rope seed=0 " in steps[0]


def test_a_plan_without_schemes_is_refused():
    out = subprocess.run([sys.executable, "scripts/reproduce.py", "--dry-run", "--schemes=,"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 2 and "--schemes, --seeds and --multipliers need at least one entry" in out.stderr


def test_run_info_covers_every_invocation_and_every_cost(tmp_path):
    """Two sessions: the first killed during a training, the second finishing it; RUN_INFO.md lists both, the
    stopped step, the work done (not the steps that found their cells done), and each run's total cost."""
    import json

    from scripts import reproduce

    results, runs = tmp_path / "results" / "exp", tmp_path / "runs" / "exp"
    log = results / reproduce.RUN_LOG
    start = dict(hardware="CPU X, 2 cores", head="aaaaaaa", data="wikitext2, local copy (...)", omp="1", argv="python")
    reproduce.log_event(log, event="start", **start)
    reproduce.log_event(log, event="begin", step="all schemes at L", command="python -m alibi_lm.train -m ...",
                        commit="aaaaaaa")
    reproduce.log_event(log, event="start", **dict(start, head="bbbbbbb"))
    for step, seconds in (("all schemes at L", 600.0), ("sliding eval alibi-L16-seed0", 3.0)):
        reproduce.log_event(log, event="begin", step=step, command=f"python {step}", commit="bbbbbbb")
        reproduce.log_event(log, event="end", step=step, seconds=seconds, status=0)
    run = runs / "alibi-L16-seed0"
    run.mkdir(parents=True)
    segments = [dict(commit="aaaaaaa", steps=[0, 250], seconds=120.0), dict(commit="bbbbbbb", steps=[250, 500], seconds=60.0)]
    (run / "status.json").write_text(json.dumps(dict(status="completed", step=500, train_commits=["aaaaaaa", "bbbbbbb"],
                                                     train_segments=segments, train_seconds=180.0)))
    old = runs / "t5-L16-seed0"  # trained before segments were recorded: its time is a lower bound
    old.mkdir()
    (old / "status.json").write_text(json.dumps(dict(status="completed", step=500, train_seconds=90.0)))
    results.joinpath("extrapolation.csv").write_text(
        "run,mode,wall_s,commit,rope_scaling\nruns/exp/alibi-L16-seed0,nonoverlapping,30,bbbbbbb,\n"
        "runs/exp/alibi-L16-seed0,sliding,60,bbbbbbb,\nruns/exp/alibi-L16-seed0,nonoverlapping,90,bbbbbbb,yarn\n")
    results.joinpath("passkey.csv").write_text("run,wall_s\nruns/exp/alibi-L16-seed0,60\nruns/exp/alibi-L16-seed0,60\n")
    results.joinpath("context_use.csv").write_text("run,split,wall_s\n" + "runs/exp/alibi-L16-seed0,valid,300\n" * 5)
    text = reproduce.run_info("exp", log, runs)
    assert "2 invocation(s)" in text and "| 2 | " in text and "bbbbbbb" in text
    assert "| 1 | all schemes at L | `python -m alibi_lm.train -m ...` | aaaaaaa | - | stopped: the session ended |" in text
    assert "| 2 | all schemes at L | `python all schemes at L` | bbbbbbb | 600 s | done |" in text
    assert "sliding eval alibi-L16-seed0" not in text and "found their cells done: 1" in text
    assert "| alibi-L16-seed0 | 500 | aaaaaaa, bbbbbbb | 3.0 min | 0.5 / 1.0 / 1.5 min | 2.0 / 5.0 min | bbbbbbb |" in text
    assert "| t5-L16-seed0 | 500 | not recorded | ≥ 1.5 min |" in text


def test_budget_probes_share_the_reproductions_runs_only_in_its_folder_and_report_their_costs(tmp_path):
    import json

    from scripts import budget_probes as bp

    assert bp.experiment_name("sinusoidal-L128-8M") == "cpu-wt2" and bp.experiment_name("t5-L128-16M") == "probes/t5-L128-16M"
    assert bp.experiment_name("sinusoidal-L128-8M", "elsewhere") == "probes/sinusoidal-L128-8M"  # never overwrite
    assert "name=probes/alibi-L128-8M" in bp.command("alibi-L128-8M", "elsewhere")
    results, runs = tmp_path / "results" / "probes", tmp_path / "runs"
    csv = tmp_path / "results" / "probes" / "t5-L128-16M" / "extrapolation.csv"
    csv.parent.mkdir(parents=True)
    body = "".join(f"t5,128,{128 * k},nonoverlapping,,0,valid,,{10.0 * k},abc1234,30\n" for k in bp.MULTIPLES)
    csv.write_text("position,train_len,eval_len,mode,stride,seed,split,rope_scaling,ppl,commit,wall_s\n" + body)
    run = runs / "probes" / "t5-L128-16M" / "t5-L128-seed0"
    run.mkdir(parents=True)
    segments = [dict(commit="abc1234", steps=[0, 10], seconds=60.0), dict(commit="def5678", steps=[10, 20], seconds=120.0)]
    (run / "status.json").write_text(json.dumps(dict(train_segments=segments, train_commits=["abc1234", "def5678"])))
    text = bp.summary(results, runs, "runs")
    line = next(x for x in text.splitlines() if x.startswith("| t5-L128-16M |"))
    assert line.endswith("| 2.000 | 8.000 | 16.000 | 3.0 | abc1234, def5678 | 2.5 | abc1234 |")
    (run / "status.json").write_text(json.dumps(dict(train_seconds=90.0)))  # before segments were recorded
    assert "| ≥ 1.5 |  | 2.5 |" in bp.summary(results, runs, "runs")
