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


def test_no_suggestion_where_nothing_is_close():
    assert "did you mean" not in composing_error("train", ["position=foo"])  # not fox: too far to be a typo
    assert "did you mean" not in composing_error("train", ["zzz=1"])


def test_estimates_read_as_english():
    assert duration(0.2) == "1 s" and f"about {duration(0.01)}" == "about 1 s"  # never "about under 1 s"
    assert duration(40) == "40 s" and duration(600) == "10 min"


def test_the_positions_module_answers_help():
    out = subprocess.run([sys.executable, "-m", "alibi_lm.positions", "--help"], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("usage: python -m alibi_lm.positions")
    listed = subprocess.run([sys.executable, "-m", "alibi_lm.positions"], capture_output=True, text=True, cwd=REPO,
                            timeout=120)
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
