"""A new user's first hour: the messages, help texts, estimates, demo findings and headline plot they meet first."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import REPO
from forked_app import run_python

from alibi_lm.cli import describe
from alibi_lm.config import compose
from alibi_lm.costs import duration
from alibi_lm.errors import UserError
from alibi_lm.positions import POSITION_SCHEMES

FAIRSEQ = REPO.parent / "shared" / "fixtures" / "fairseq-alibi"


def composing_error(app: str, overrides: list[str]) -> str:
    with pytest.raises(Exception) as caught:
        compose(app, overrides)
    return describe(caught.value)


@pytest.mark.parametrize("app, override, key, suggestion", [
    ("train", "train.seqlen=128", "train.seqlen", "did you mean train.seq_len?"),
    ("train", "model.d_modle=64", "model.d_modle", "did you mean model.d_model?"),
    ("train", "trian.lr=1", "trian", "did you mean train?"),
    ("train", "positon=alibi", "positon", "did you mean position?"),
    ("evaluate", "eval.multiplier=[1]", "eval.multiplier", "did you mean eval.multipliers?"),
])
def test_a_misspelled_key_gets_the_closest_valid_key(app, override, key, suggestion):
    line = composing_error(app, [override])
    assert line.startswith(f"unknown config key '{key}' (misspelled?); {suggestion} `--cfg job`")
    assert "\n" not in line


@pytest.mark.parametrize("override, suggestion", [("position=alibj", "alibi"), ("model=tinyy", "tiny"),
                                                  ("experiment=quik", "quick"), ("data=books", None)])
def test_a_misspelled_group_choice_gets_the_closest_option(override, suggestion):
    line = composing_error("train", [override])
    group, option = override.split("=")
    hint = f"did you mean {suggestion}? " if suggestion else ""
    assert line.startswith(f"unknown {group} '{option}'; {hint}choose one of ")


def test_a_registered_scheme_without_its_yaml_file_is_told_to_add_it(monkeypatch):
    """A new scheme's module registers it (the listings show it), but without configs/position/<name>.yaml the
    train app said "unknown position ... choose one of" a list that does not name it."""
    class Unfiled(POSITION_SCHEMES["nope"]):
        pass

    monkeypatch.setitem(POSITION_SCHEMES, "unfiled", Unfiled)
    assert composing_error("train", ["position=unfiled"]) == (
        f"position 'unfiled' is registered ({__name__}) but has no configs/position/unfiled.yaml: add one "
        f"(docs/position-schemes.md, Adding a scheme, step 2)")


def test_an_option_a_scheme_does_not_have_added_with_plus_is_refused_with_the_closest():
    """+position.learn_slope=true composed, then failed where the options are built: "ConfigError raised while
    resolving interpolation: ... AlibiOptions.__init__() got an unexpected keyword argument"."""
    from alibi_lm.config import to_job

    with pytest.raises(Exception) as caught:
        to_job(compose("train", ["position=alibi", "+position.learn_slope=true"]))
    assert describe(caught.value, "train") == ("unknown config key 'position.learn_slope': AlibiOptions has no such "
                                               "setting, so it would be ignored; did you mean position.learn_slopes? "
                                               "`--cfg job` prints the valid keys")


@pytest.mark.parametrize("overrides, line", [
    (["hydra.launcher.timeout_min=5"], "unknown config key 'hydra.launcher.timeout_min': the launcher chosen has no "
     "such option; choose the launcher that has it first (hydra/launcher=submitit_slurm or submitit_local); `--cfg "
     "hydra` prints the chosen one's options"),  # not "did you mean hydra.launcher._target_?" nor `+key` advice
    (["hydra/launcher=submitit_local", "hydra.launcher.timeout_mn=1"], "unknown config key "
     "'hydra.launcher.timeout_mn': the launcher chosen has no such option; did you mean hydra.launcher.timeout_min? "),
    (["hydra.job.chdirr=true"], "unknown config key 'hydra.job.chdirr' (misspelled?); did you mean hydra.job.chdir? "
     "`--cfg hydra` prints Hydra's keys"),  # `--cfg job` prints no hydra key
])
def test_a_misspelled_hydra_key_points_at_hydras_own_keys(overrides, line):
    assert composing_error("train", overrides).startswith(line)


def test_a_list_of_schemes_says_how_to_sweep_them():
    """position=[alibi,rope] ended in Hydra's "Merge error: RopeOptions is not a subclass of AlibiOptions"; a list
    of one choice, or of experiments, still composes as Hydra merges it."""
    assert composing_error("train", ["position=[alibi,rope]"]) == (
        "a config group given a list merges its choices, and RopeOptions does not merge into AlibiOptions: a run takes "
        "one scheme (or task); to sweep them, write -m <group>=a,b, without brackets")
    compose("train", ["position=[alibi]"])
    compose("train", ["experiment=[smoke,quick]"])


@pytest.mark.parametrize("app, overrides, line", [
    ("evaluate", ["+eval.max_tokns=2048"], "unknown config key 'eval.max_tokns': EvalConfig has no such setting, so it "
     "would be ignored; did you mean eval.max_tokens? `--cfg job` prints the valid keys"),
    ("evaluate", ["extension=self_extend", "+extension.windw=16"], "unknown config key 'extension.windw': "
     "SelfExtendOptions has no such setting, so it would be ignored; did you mean extension.window?"),
    ("train", ["+train.lrr=1"], "unknown config key 'train.lrr': TrainConfig has no such setting"),
])
def test_a_key_added_with_plus_that_a_typed_section_lacks_is_refused_not_dropped(app, overrides, line):
    """The old hint "`+key=...` adds a new one" led to runs with the default: the typed job drops such a key."""
    from alibi_lm.config import to_job

    with pytest.raises(Exception) as caught:
        to_job(compose(app, overrides))
    assert describe(caught.value, app).startswith(line)
    assert "adds a new one" not in composing_error(app, [overrides[-1].lstrip("+")])


QUOTE_IT = "a value with braces, brackets, spaces or quotes goes in quotes within the argument: 'key=\"a {b} c\"'"


@pytest.mark.parametrize("override, reason, hint", [
    ("passkey.note=The pass key is {key}.", "mismatched input '{' expecting <EOF>", QUOTE_IT),
    ("eval.lengths=[1,2", "no viable alternative at input '[1,2'", "close its list: key=[a,b]"),
])
def test_an_override_hydra_cannot_parse_is_named_with_how_to_write_it(override, reason, hint):
    line = composing_error("evaluate", [override])
    assert line == f"cannot read the override {override!r} ({reason}); {hint}"


@pytest.mark.parametrize("app, override, group", [("eval", "task=mqar", "task"), ("eval", "+task=mqar", "task"),
                                                   ("eval", "position=alibi", "position"), ("eval", "model=tiny", "model")])
def test_a_group_the_app_reads_from_the_run_names_run(app, override, group):
    with pytest.raises(Exception) as caught:
        compose(app, [override])
    assert describe(caught.value, app) == (
        f"alibi_lm.{app} has no config group '{group}': `python -m alibi_lm.{app} --help` lists the groups it takes; "
        f"a trained run's {group} comes from its folder: choose the run with run=<run folder> (runs/<experiment>/<run>), "
        f"or train one with {group}=...")


def test_a_key_an_experiment_misspells_is_not_taken_for_a_missing_group(tmp_path):
    """An experiment file of the user's that sets a key the schema lacks: the key is named, not the group."""
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "typo.yaml").write_text("# @package _global_\ntrain:\n  lrr: 1\n")
    with pytest.raises(Exception) as caught:
        compose("train", ["experiment=typo", f"hydra.searchpath=[file://{tmp_path}]"])
    assert describe(caught.value, "train") == ("unknown config key 'train.lrr' in experiment/typo.yaml (misspelled?); "
                                               "`--cfg job` prints the valid keys")


def test_no_suggestion_where_nothing_is_close():
    assert "did you mean" not in composing_error("train", ["position=foo"])  # not fox: too far to be a typo
    assert "did you mean" not in composing_error("train", ["zzz=1"])


def test_estimates_read_as_english():
    assert duration(0.2) == "1 s" and f"about {duration(0.01)}" == "about 1 s"  # never "about under 1 s"
    assert duration(40) == "40 s" and duration(600) == "10 min"


def test_the_positions_module_answers_help():
    out = run_python(["-m", "alibi_lm.positions", "--help"], cwd=REPO, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("usage: python -m alibi_lm.positions")
    listed = run_python(["-m", "alibi_lm.positions"], cwd=REPO, timeout=120)
    assert listed.stdout.strip().startswith("sinusoidal,learned,t5,rope,alibi,")  # the registry's (tests add theirs)


def test_the_fairseq_importer_names_its_own_flags():
    from alibi_lm.fairseq_import import in_flags

    said = in_flags(UserError("no local copy; set data.root=<folder that holds wikitext-2/> or ALIBI_LM_DATA=<that "
                              "folder>; cannot read x: set data.root=...; configs/data has data=wikitext2"))
    assert str(said) == ("no local copy; pass --data-root <folder that holds wikitext-2/> or ALIBI_LM_DATA=<that "
                         "folder>; cannot read x: pass --data-root ...; configs/data has --data wikitext2")
    assert isinstance(said, UserError)


@pytest.mark.skipif(not FAIRSEQ.is_dir(), reason=f"the fairseq fixtures are not at {FAIRSEQ}")
def test_the_fairseq_importer_without_data_says_which_flag_to_pass(tmp_path, capsys, monkeypatch):
    from alibi_lm.fairseq_import import main

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # no hub: the missing local copy is the whole story
    with pytest.raises(SystemExit) as stop:
        main([str(FAIRSEQ / "alibi-h4" / "checkpoint.pt"), "--dict", str(FAIRSEQ / "dict.txt"), "--data", "wikitext2",
              "--data-root", str(tmp_path / "nowhere"), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "--data-root" in err and "data.root=" not in err
    assert not (tmp_path / "run").exists()


def lm_row(position, L, lv, ppl, run):
    return dict(position=position, train_len=L, eval_len=lv, mode="nonoverlapping", stride=np.nan, seed=0,
                split="valid", ppl=ppl, run=run)


def test_a_demos_findings_say_what_it_shows():
    """The demo scores to 8L after a few hundred steps: its sinusoidal rises short of the reproduction's 2x and ALiBi
    has no 16L row. Its table says that it shows the effect, not "does not hold" and "incomplete"."""
    from alibi_lm.results.findings import ratio_findings

    ratios = {"sinusoidal": (1.0, 1.3, 1.5, 1.6), "alibi": (1.0, 0.98, 0.97, 0.97)}
    for runs, verdicts in (("runs/demo", ["shown in direction; the reproduction's criterion asks more",
                                          "shown to 8L, the longest scored"]),
                           ("runs/cpu-wt2", ["does not hold", "incomplete"])):
        df = pd.DataFrame([lm_row(s, 64, 64 * k, 100 * r, f"{runs}/{s}-L64-seed0")
                           for s, rs in ratios.items() for k, r in zip((1, 2, 4, 8), rs)])
        assert [row[4] for row in ratio_findings(df, 64)] == verdicts
    rising = pd.DataFrame([lm_row("alibi", 64, 64 * k, 100 * r, "runs/smoke/alibi-L64-seed0")
                           for k, r in zip((1, 2), (1.0, 1.1))])
    assert ratio_findings(rising, 64)[0][4] == "not shown at this budget"


def test_the_headline_plot_with_twenty_schemes_adds_labelled_small_multiples(tmp_path, monkeypatch):
    """Twenty schemes: the overview keeps every line, and small multiples of at most GROUP_SIZE alike ratio curves
    follow, each line labelled once at its end with its ppl(L), labels inside the panel and apart."""
    from alibi_lm.results import plots

    names = [*POSITION_SCHEMES, "alibi+learn_slopes", "rope+qk_norm", "nope+ssmax", "rope+nope4", "fox+rope",
             "alibi+ssmax", "rope+nope4-w64"][:20]
    slopes = np.linspace(0.97, 1.4, len(names))
    df = pd.DataFrame([lm_row(n, 16, 16 * k, (100 + i) * slopes[i] ** math.log2(k), "runs/x/r")
                       for i, n in enumerate(names) for k in (1, 2, 4, 8, 16)])
    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: figures.append(fig))
    plots.plot_extrapolation(df, 16, tmp_path / "x.png", "t")
    fig = figures[0]
    assert {ln.get_label() for ln in fig.axes[0].get_lines()} >= set(names)  # the overview
    small = [ax for ax in fig.axes[1:] if ax.get_visible()]
    assert len(small) == math.ceil(len(names) / plots.GROUP_SIZE)
    labels = [t.get_text() for ax in small for t in ax.texts if "(" in t.get_text()]
    assert sorted(label.split(" (")[0] for label in labels) == sorted(names)
    assert all(len(ax.get_lines()) <= plots.GROUP_SIZE + 2 for ax in small)  # its curves, the 1.0 line and L's
    assert f"alibi ({100 + names.index('alibi'):.1f})" in labels
    for ax in small:
        low, high = ax.get_ylim()
        ys = sorted(t.xyann[1] for t in ax.texts if "(" in t.get_text())
        assert all(low <= y <= high for y in ys)
        scale = np.log if ax.get_yscale() == "log" else np.asarray
        assert np.all(np.diff(scale(np.array(ys))) >= (scale(high) - scale(low)) / 14 - 1e-9)  # no two overlap


def test_few_schemes_keep_the_single_panel(tmp_path, monkeypatch):
    from alibi_lm.results import plots

    df = pd.DataFrame([lm_row(n, 16, 16 * k, 100.0 * k ** (0.1 * i), "runs/x/r")
                       for i, n in enumerate(["alibi", "sinusoidal"]) for k in (1, 2, 4)])
    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: figures.append(fig))
    plots.plot_extrapolation(df, 16, tmp_path / "x.png", "t")
    assert len(figures[0].axes) == 1


def test_spread_keeps_order_and_gap():
    from alibi_lm.results.plots import spread

    placed = spread(np.array([1.0, 1.01, 0.99, 2.0]), 0.1, 0.0, 3.0)
    order = np.argsort(placed)
    assert list(order) == [2, 0, 1, 3] and np.all(np.diff(np.sort(placed)) >= 0.1 - 1e-12)
    assert np.all(spread(np.array([2.95, 2.96]), 0.1, 0.0, 3.0) <= 3.0)


def test_repo_path():
    assert Path(REPO, "configs", "experiment", "smoke.yaml").is_file()


HEAVY = ("pandas", "matplotlib", "datasets", "transformers", "wandb")
LOADED = """
import runpy, sys
sys.argv = ["alibi_lm.train", *sys.argv[1:]]
try:
    runpy.run_module("alibi_lm.train", run_name="__main__")
except SystemExit as e:
    status = e.code
print("LOADED", status, sorted({m.split(".")[0] for m in sys.modules} & set(HEAVY)), file=sys.stderr)
""".replace("HEAVY", repr(HEAVY))


@pytest.mark.parametrize("args, status", [(["--help"], 0), (["train.lr=abc"], 2), (["position=alibj"], 2)])
def test_help_and_config_errors_load_no_heavy_library(args, status):
    """`--help` and a one-line config error start in about the time of `import torch`: pandas, matplotlib, datasets,
    transformers and wandb are imported where they are used, never on the way to these."""
    out = subprocess.run([sys.executable, "-c", LOADED, *args], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert f"LOADED {status} []" in out.stderr, out.stderr[-2000:]


# ---- threads that fit the moment -------------------------------------------------------------------------------

def fake_cores(monkeypatch, busy_share: dict[int, float]):
    """core_times as /proc/stat would give it across BUSY_SAMPLE_S with each core busy by that share."""
    from alibi_lm.config import device

    calls = []

    def times(cores):
        calls.append(1)
        t = 100 * (len(calls) - 1)  # 100 jiffies pass between the two readings
        return {c: (t, t - round(100 * busy_share[c]) * (len(calls) - 1)) for c in cores if c in busy_share}

    monkeypatch.setattr(device, "core_times", times)
    monkeypatch.setattr(device, "allowed_cores", lambda: set(busy_share))
    monkeypatch.setattr(device.time, "sleep", lambda s: None)


@pytest.mark.parametrize("busy, threads", [({0: 0.0, 1: 0.05}, 2), ({0: 0.02, 1: 1.0}, 1), ({0: 1.0, 1: 1.0}, 1),
                                           ({0: 0.3, 1: 0.3, 2: 0.0, 3: 1.0}, 2)])
def test_the_default_threads_leave_out_the_cores_other_processes_keep_busy(monkeypatch, busy, threads):
    from alibi_lm.config.device import default_threads

    fake_cores(monkeypatch, busy)
    count, why = default_threads()
    assert count == threads and why.startswith(f"{threads} CPU thread") and f"{sum(busy.values()):.1f} of them" in why


def test_without_proc_stat_the_load_average_decides(monkeypatch):
    from alibi_lm.config import device

    monkeypatch.setattr(device, "core_times", lambda cores: None)
    monkeypatch.setattr(device, "allowed_cores", lambda: {0, 1})
    monkeypatch.setattr(device.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(device.os, "getloadavg", lambda: (1.1, 0.0, 0.0), raising=False)
    assert device.default_threads()[0] == 1
    monkeypatch.setattr(device.os, "getloadavg", lambda: (0.2, 0.0, 0.0), raising=False)
    assert device.default_threads()[0] == 2


def test_a_setting_wins_and_the_plan_line_says_the_threads(monkeypatch):
    import torch

    from alibi_lm.config.device import apply_cpu_threads
    from alibi_lm.costs import train_plan, trainer_plan

    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        fake_cores(monkeypatch, {0: 0.0, 1: 0.9})
        n, why = apply_cpu_threads(None)
        assert n == 1 == torch.get_num_threads() and "0.9 of them kept busy" in why
        assert apply_cpu_threads(2) == (2, "2 CPU thread(s): train.threads")
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        assert apply_cpu_threads(None)[1].endswith("OMP_NUM_THREADS")
    finally:
        torch.set_num_threads(before)
    from types import SimpleNamespace

    tc = SimpleNamespace(eval_every=4, eval_tokens=256, seq_len=16)
    stream = SimpleNamespace(train_tokens=range(1001), valid_tokens=range(3000))
    trainer = SimpleNamespace(tc=tc, step=0, steps=8, tokens_per_step=64, stream=stream, threads_why=why,
                              device=torch.device("cpu"))
    assert trainer_plan(trainer) == train_plan(8, 64, 16, 1001, 2, 256) + f"; {why}"


def test_wandb_is_quiet_unless_asked(tmp_path, monkeypatch, capsys):
    import types

    from alibi_lm.training.trainer import Trainer

    calls = []
    fake = types.SimpleNamespace(init=lambda **kw: calls.append(kw) or "run", Settings=lambda **kw: kw)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    settings = types.SimpleNamespace(mode="offline", project="p", entity=None)
    job = types.SimpleNamespace(logger=types.SimpleNamespace(wandb=settings), name="x")
    trainer = types.SimpleNamespace(job=job, run_dir=tmp_path / "run", tc=None)
    (tmp_path / "run").mkdir()
    monkeypatch.setattr("dataclasses.asdict", lambda job: {})
    monkeypatch.delenv("WANDB_SILENT", raising=False)
    assert Trainer.start_wandb(trainer) == "run" and calls[-1]["settings"] == {"silent": True}
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "wandb sync" in out
    monkeypatch.setenv("WANDB_SILENT", "false")
    Trainer.start_wandb(trainer)
    assert calls[-1]["settings"] == {"silent": False} and capsys.readouterr().out == ""


# ---- where results go --------------------------------------------------------------------------------------------

def test_trials_write_their_results_beside_their_runs_and_committed_experiments_into_results():
    from conftest import compose_job

    from alibi_lm.config import DataConfig, TrainJob

    assert compose_job("train").paths.results == "runs/default/results"
    assert compose_job("train", "experiment=quick").paths.results == "runs/quick/results"
    assert compose_job("train", "experiment=cpu-wt2").paths.results == "results"
    assert compose_job("train", "experiment=tasks").paths.results == "results"
    assert compose_job("train", "experiment=smoke").paths.results == "runs/smoke/results"
    assert compose_job("train", "paths.runs=/tmp/r", "name=n").paths.results == "/tmp/r/n/results"
    assert compose_job("train", "paths.results=elsewhere").paths.results == "elsewhere"  # an explicit one wins
    python = TrainJob(data=DataConfig(name="wikitext2", folder="wikitext-2"))
    assert python.paths.results == "runs/default/results"  # the Python API too


def test_a_custom_setting_of_a_committed_experiment_writes_beside_its_runs():
    from alibi_lm.naming import custom_name
    from alibi_lm.training.reuse import NOT_MODEL_KEYS

    args = custom_name(["experiment=cpu-wt2", "train.lr=1e-3"], NOT_MODEL_KEYS)
    assert args[2].startswith("name=cpu-wt2-custom-") and args[3] == "paths.results=${paths.runs}/${name}/results"
    kept = custom_name(["experiment=cpu-wt2", "train.lr=1e-3", "paths.results=mine"], NOT_MODEL_KEYS)
    assert "paths.results=${paths.runs}/${name}/results" not in kept  # an explicit one wins
    assert custom_name(["experiment=cpu-wt2"], NOT_MODEL_KEYS) == ["experiment=cpu-wt2"]  # the experiment's own


def test_evaluating_without_a_recorded_results_folder_stays_under_runs(tmp_path):
    from alibi_lm.config import EvalJob, SubjectPathsConfig

    run = tmp_path / "runs" / "mine" / "alibi-L64-seed0"
    run.mkdir(parents=True)
    assert EvalJob(run=str(run)).results_root() == run.parent / "results"  # no config.yaml
    (run / "config.yaml").write_text("paths:\n  results: somewhere\n")
    assert EvalJob(run=str(run)).results_root() == Path("somewhere")  # the run's own
    assert EvalJob(run="hf:/models/gpt2").results_root() == Path("runs/hf/results")  # a Hugging Face model
    assert EvalJob(run="hf:/models/gpt2", paths=SubjectPathsConfig(results="x")).results_root() == Path("x")


def test_report_without_a_folder_lists_what_there_is_to_report(tmp_path, monkeypatch, capsys):
    from alibi_lm.results.__main__ import main, report_folders

    for folder, table in (("results/cpu-wt2", "extrapolation.csv"), ("results/probes/a", "extrapolation.csv"),
                          ("results/tasks", "tasks.csv"), ("runs/demo/results/demo", "extrapolation.csv"),
                          ("results/figures", "x.png")):
        Path(tmp_path, folder).mkdir(parents=True)
        Path(tmp_path, folder, table).write_text("")
    committed, trials = report_folders(tmp_path)
    assert committed == [Path("results/cpu-wt2"), Path("results/probes/a"), Path("results/tasks")]
    assert trials == [Path("runs/demo/results/demo")]
    monkeypatch.chdir(tmp_path)
    main([])
    out = capsys.readouterr().out
    assert "  results/cpu-wt2\n" in out and "  runs/demo/results/demo" in out and "figures" not in out


def test_make_report_reports_a_named_folder_or_lists_them():
    def dry(*args):
        return subprocess.run(["make", "--no-print-directory", "-n", "report", *args], capture_output=True, text=True, cwd=REPO,
                              timeout=60).stdout.strip().splitlines()[-1].split()

    assert dry()[-1] == "alibi_lm.results"  # no folder: the list
    assert dry("EXPERIMENT=cpu-wt2")[-1] == "results/cpu-wt2"
    assert dry("EXPERIMENT=quick")[-1] == "runs/quick/results/quick"  # no committed folder: its trials'
    tasks = "results/tasks" if (REPO / "results" / "tasks").is_dir() else "runs/tasks/results/tasks"
    assert dry("TASK=copy")[-1] == tasks


# ---- make bench's new ratios -------------------------------------------------------------------------------------

def test_bench_ratios_of_the_default_threads_and_of_start_up():
    from alibi_lm.bench.rows import StartupRow, ThreadRow, default_over_best, thread_ratio
    from alibi_lm.bench.startup import startup_ratio

    def cell(threads, busy, tokens, default=False):
        return ThreadRow(threads, busy, 64, 32, tokens, 10, 1.0, 2, default=default)

    rows = [cell(1, True, 1900.0), cell(2, True, 300.0), cell(1, True, 1800.0, default=True),
            cell(1, False, 2000.0), cell(2, False, 3600.0), cell(2, False, 3500.0, default=True)]
    assert default_over_best(rows, True) == 1800 / 1900 and default_over_best(rows, False) == 3500 / 3600
    assert thread_ratio(rows, (2, True), (1, True)) == 300 / 1900  # the fixed cells, not the default's
    assert rows[2].name == "default (1 thread) + busy loop"
    startup = [StartupRow("import torch", "python -c 'import torch'", 3.0, 5),
               StartupRow("train --help", "python -m alibi_lm.train --help", 3.9, 5)]
    assert startup_ratio(startup, "train --help") == pytest.approx(1.3) and startup_ratio(startup, "x") is None


def test_the_printed_table_shows_token_counts_as_integers():
    from alibi_lm.eval.evaluation import rows_text

    rows = [dict(eval_len=16, ppl=20.0, loss=3.0, tokens=2048, wall_s=1.0, note=""),
            dict(eval_len=64, ppl=math.nan, loss=math.nan, tokens=None, wall_s=0.1, note="n/a")]  # past a table
    text = rows_text(rows, ["eval_len", "ppl", "loss", "tokens", "wall_s", "note"])
    assert " 2048 " in text and "2048.000" not in text and "20.000" in text


def test_reproduce_status_counts_the_committed_runs_as_finished(tmp_path, capsys, monkeypatch):
    """A fresh clone has no run folders but the committed results/cpu-wt2/: its runs are finished, not "0 of 154"."""
    import re

    from alibi_lm.plans import reproduce

    (tmp_path / "results").symlink_to(REPO / "results")  # a checkout with the committed results and no runs/
    monkeypatch.setattr(reproduce, "ROOT", tmp_path)
    reproduce.main(["--status"])
    first = capsys.readouterr().out.splitlines()[0]
    found = re.match(r"(\d+) of (\d+) runs finished by their committed rows in results/cpu-wt2/", first)
    assert found and 0 < int(found[1]) <= int(found[2]), first


def test_help_skips_hydras_group_listings_only_where_the_template_uses_none(monkeypatch):
    from hydra._internal.hydra import Hydra

    from alibi_lm.cli import skip_group_listings

    original = Hydra.format_config_groups
    monkeypatch.setattr(Hydra, "format_config_groups", original)  # restored after the test
    skip_group_listings("${hydra.help.header}\n$APP_CONFIG_GROUPS\n$CONFIG")
    assert Hydra.format_config_groups is original  # a template that lists them keeps them
    skip_group_listings("${hydra.help.header}\n${config_groups:position,task}\n$CONFIG")
    assert Hydra.format_config_groups is not original and Hydra.format_config_groups(None, None) == ""


def test_a_thread_target_on_a_crowded_machine_is_undecided():
    from types import SimpleNamespace

    from alibi_lm.bench.rows import ThreadRow
    from alibi_lm.bench.targets import thread_targets

    def cell(threads, busy, tokens, others, default=False):
        return ThreadRow(threads, busy, 64, 32, tokens, 10, 1.0, 2, others_share=others, default=default)

    quiet = [cell(1, False, 2000.0, 0.02), cell(2, False, 3600.0, 0.03), cell(2, False, 3500.0, 0.02, default=True)]
    assert [r.verdict for r in thread_targets(SimpleNamespace(threads=quiet))] == ["met"]
    crowded = [dict(vars(r), others_share=0.9) for r in quiet]
    verdicts = [r.verdict for r in thread_targets(SimpleNamespace(threads=[ThreadRow(**r) for r in crowded]))]
    assert verdicts == ["undecided (other processes used 90% of the cores)"]


def test_a_null_group_choice_is_no_choice_where_the_app_goes_without_and_one_line_where_it_needs_one():
    """extension=null, data=null, model=null ended in Hydra's ValueError traceback."""
    from alibi_lm.cli import null_group_choices

    assert null_group_choices("eval", ["run=r", "extension=null", "data=null", "eval.lengths=null"]) == [
        "run=r", "~extension", "~data", "eval.lengths=null"]
    assert null_group_choices("probes", ["extension=null"]) == ["~extension"]
    assert null_group_choices("train", ["experiment=null", "seed=1"]) == ["~experiment", "seed=1"]
    with pytest.raises(UserError, match=r"^model=null: alibi_lm.train needs a model; choose one of paper, small, "):
        null_group_choices("train", ["model=null"])
    # an option of a group not chosen: a misleading `+extension.window=...` hint, Hydra's AssertionError for data.root
    for option, group in (("extension.window=3", "extension"), ("data.root=/x", "data")):
        with pytest.raises(UserError, match=rf"^{option.split('=')[0]} sets an option of the chosen {group}, and none is "
                                            rf"chosen: choose one first, {group}=<one of "):
            null_group_choices("eval", [option])
    assert null_group_choices("eval", ["extension=streaming", "extension.window=3"])[1] == "extension.window=3"
    with pytest.raises(UserError, match=r"^alibi_lm.eval has no config group 'position': "):  # not "needs a position"
        null_group_choices("eval", ["position=null"])
    swept = run_python(["-m", "alibi_lm.eval", "-m", "extension=streaming,null"], cwd=REPO)
    assert swept.returncode == 2 and swept.stderr.strip() == (
        "error: a config group's choice cannot be null in a sweep (extension=streaming,null); run the cell without the "
        "group apart, or drop null")
