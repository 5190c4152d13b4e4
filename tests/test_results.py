"""The results CSV (replace-not-duplicate, atomic, locked) and the report built from it."""

from __future__ import annotations

import dataclasses
import math
import multiprocessing as mp
import re
import types

import numpy as np
import pandas as pd
import pytest

from alibi_lm.config.schemas import EvalConfig
from alibi_lm.errors import UserError
from alibi_lm.eval.evaluation import attention_label, temperature_tuning
from alibi_lm.extension import METHODS, OPTIONS, build_extension
from alibi_lm.metrics import perplexity
from alibi_lm.results import plots, report, store
from alibi_lm.results.__main__ import main as results_main
from alibi_lm.results.tables import TableDamaged


def row(position="alibi", L=16, lv=16, ppl=20.0, mode="nonoverlapping", stride=None, seed=0, split="valid", **kw):
    return {**dict(position=position, train_len=L, eval_len=lv, mode=mode, stride=stride, seed=seed, split=split,
                   ppl=ppl, loss=math.log(ppl) if math.isfinite(ppl) else math.nan, tokens=1000, run="runs/x",
                   commit="abc1234", note="", wall_s=1.0, device="cpu", timestamp="2024-01-01T00:00:00+00:00"), **kw}


def test_upsert_replaces_the_same_cell(tmp_path):
    csv = tmp_path / "extrapolation.csv"
    store.upsert_rows(csv, [row(ppl=20.0)])
    store.upsert_rows(csv, [row(ppl=19.0)])
    df = pd.read_csv(csv)
    assert len(df) == 1 and df["ppl"].item() == 19.0
    store.upsert_rows(csv, [row(mode="sliding", stride=4, ppl=18.0)])
    store.upsert_rows(csv, [row(mode="sliding", stride=8, ppl=17.0)])
    store.upsert_rows(csv, [row(mode="sliding", stride=4, ppl=16.0)])  # read back as 4, not "4.0"
    df = pd.read_csv(csv)
    assert len(df) == 3
    assert sorted(df["stride"].dropna().astype(int)) == [4, 8]
    assert df.loc[df["stride"] == 4, "ppl"].item() == 16.0
    for other in (dict(seed=1), dict(split="test"), dict(lv=32), dict(L=32), dict(position="rope")):
        store.upsert_rows(csv, [row(**other)])
    assert len(pd.read_csv(csv)) == 8
    assert "4.0" not in csv.read_text().split("\n")[1:][0]


def test_killed_writer_leaves_nothing_corrupt(tmp_path):
    csv = tmp_path / "extrapolation.csv"
    store.upsert_rows(csv, [row(ppl=20.0)])
    stray = tmp_path / ".extrapolation.csv.abc123.tmp"  # what atomic_write leaves if killed mid-write
    stray.write_text("position,train_len\nalibi,1")
    store.upsert_rows(csv, [row(lv=32, ppl=19.0)])
    df = pd.read_csv(csv)
    assert sorted(df["eval_len"]) == [16, 32] and list(df.columns[: len(store.KEY)]) == store.KEY
    assert not stray.exists()  # removed under the lock: no writer can be using it


def _writer(csv, seed):
    for lv in (16, 32, 64):
        store.upsert_rows(csv, [row(seed=seed, lv=lv)])


def test_concurrent_writers_lose_no_row(tmp_path):
    csv = tmp_path / "extrapolation.csv"
    procs = [mp.get_context("fork").Process(target=_writer, args=(csv, s)) for s in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert len(pd.read_csv(csv)) == 12


def test_unreadable_csv_is_a_user_error(tmp_path):
    (tmp_path / "extrapolation.csv").write_text("just,a\nbad,file\n")
    with pytest.raises(UserError, match="extrapolation.csv, line 1: the header has column.s. this table never has: just, a"):
        store.upsert_rows(tmp_path / "extrapolation.csv", [row()])
    with pytest.raises(UserError, match="no extrapolation.csv"):
        report.build_report(tmp_path / "missing")


def table_lines(md: str, heading: str) -> list[str]:
    section = md.split(heading, 1)[1].split("\n## ", 1)[0].split("\nRatios to Lv = L", 1)[0]  # not the ratio table
    return [line for line in section.splitlines() if line.startswith("|")]


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_report_tables(tmp_path):
    rows = []
    for lv, s, a in [(16, 30.0, 31.0), (32, 80.0, 29.5), (64, 400.0, 29.0)]:
        rows += [row("sinusoidal", lv=lv, ppl=s), row("alibi", lv=lv, ppl=a)]
    rows += [row("learned", lv=16, ppl=32.0), row("learned", lv=32, ppl=math.nan, note="not applicable: x")]
    rows += [row("rope", lv=16, ppl=p, seed=k) for k, p in enumerate([10.0, 11.0, 12.0])]
    rows += [row("alibi", L=32, lv=lv, ppl=p) for lv, p in [(32, 28.0), (64, 27.5)]]  # for the Table 5 shape
    rows += [row("sinusoidal", L=32, lv=32, ppl=28.5)]
    store.upsert_rows(tmp_path / "extrapolation.csv", rows)
    written = report.build_report(tmp_path)
    md = (tmp_path / "extrapolation.md").read_text()

    lines = table_lines(md, "## L = 16 (nonoverlapping, valid, 1,000 targets scored)")
    assert cells(lines[0]) == ["scheme \\ Lv", "16", "32", "64"]
    body = {cells(x)[0]: cells(x)[1:] for x in lines[2:]}
    assert list(body) == ["sinusoidal", "learned", "rope", "alibi"]  # the paper's order
    assert body["sinusoidal"] == ["**30.00**", "80.00", "400.00"]  # bold = the row minimum
    assert body["alibi"] == ["31.00", "29.50", "**29.00**"]
    assert body["learned"] == ["**32.00**", "n/a", ""]  # n/a: not applicable; blank: not evaluated
    assert body["rope"] == ["**11.00 ± 1.00 (n=3)**", "", ""]

    lines = table_lines(md, "## alibi: training length x evaluation length")
    assert cells(lines[0]) == ["L \\ Lv", "16", "32", "64"]
    assert [cells(x) for x in lines[2:]] == [
        ["L = 16", "31.00", "29.50", "29.00"],
        ["L = 32", "", "28.00", "27.50"],
        ["sinusoidal (Lv = L)", "30.00", "28.50", ""],
    ]
    assert "## sinusoidal: training length" in md and "## rope: training length" not in md
    names = {p.name for p in written}
    assert {"extrapolation.md", "extrapolation.png", "extrapolation-L16.png", "extrapolation-L32.png"} <= names
    assert (tmp_path / "extrapolation.png").read_bytes() == (tmp_path / "extrapolation-L16.png").read_bytes()


def test_report_sliding_section_and_cli(tmp_path, capsys):
    rows = [row("alibi", lv=lv, ppl=20.0 - lv / 100) for lv in (16, 32)]
    rows += [row("alibi", lv=lv, ppl=19.0, mode="sliding", stride=1, tokens=300) for lv in (16, 32)]  # a subset
    store.upsert_rows(tmp_path / "extrapolation.csv", rows)
    pp = tmp_path / "per_position"
    pp.mkdir()
    loss = np.linspace(5, 3, 32)
    pd.DataFrame({"position_in_window": np.arange(32), "mean_loss": loss, "count": np.full(32, 4)}).to_csv(
        pp / "alibi-L16-seed0-nonoverlapping-Lv32.csv", index=False)
    results_main([str(tmp_path)])
    md = (tmp_path / "extrapolation.md").read_text()
    assert md.index("## L = 16 (nonoverlapping, valid, 1,000 targets scored)") < md.index(
        "## L = 16 (sliding, stride 1, valid, 300 targets scored)")  # the targets: a sliding subset says so
    assert (pp / "alibi-L16-seed0-nonoverlapping.png").is_file()
    assert "extrapolation.md" in capsys.readouterr().out


def test_position_bins_are_log_spaced_and_hold_enough_tokens():
    from alibi_lm.results.plots import position_bins

    pos = np.arange(1024)
    # 100 windows: every position has 100 tokens; with 4 bins per octave and 1000 tokens a bin
    few = position_bins(pos, np.full(1024, 100), per_octave=4, min_tokens=1000)
    tokens = np.bincount(few, weights=np.full(1024, 100))
    assert (tokens >= 1000).all() and (np.diff(few) >= 0).all() and few[0] == 0
    assert (np.diff(few) <= 1).all()  # consecutive bins
    # positions 0..9 (10 x 100 tokens) fill the first bin exactly at the log-bin edge after position 9?
    # log2(p + 1) * 4 floors: p=9 -> 13, p=10 -> 13 (same log bin), p=11 -> 14; so the first bin ends at 10
    assert (few[:11] == 0).all() and few[11] == 1
    # with plenty of tokens the bins are the plain log bins: p and p' share a bin iff floor(4 log2(p+1)) agree
    many = position_bins(pos, np.full(1024, 10**6), per_octave=4, min_tokens=1000)
    log_bin = np.floor(np.log2(pos + 1) * 4 + 1e-9).astype(int)
    assert len(np.unique(many)) == len(np.unique(log_bin))
    assert ((many[1:] == many[:-1]) == (log_bin[1:] == log_bin[:-1])).all()
    # a short tail joins its left neighbour
    tail = position_bins(np.arange(3), np.array([1000, 1000, 10]), per_octave=4, min_tokens=1000)
    assert tail.tolist() == [0, 1, 1]


def test_ratio_table_sets_mean_per_seed_ratios_beside_the_published_ones():
    from alibi_lm.results.report import ratio_table

    rows = [dict(position="alibi", train_len=64, eval_len=lv, seed=seed, ppl=ppl)
            for seed, (p1, p8) in enumerate([(100.0, 90.0), (200.0, 190.0)]) for lv, ppl in ((64, p1), (512, p8))]
    table = ratio_table(pd.DataFrame(rows))
    line = next(ln for ln in table.splitlines() if ln.startswith("| alibi | 8L"))
    ours = (90 / 100 + 190 / 200) / 2
    std = float(np.std([0.9, 0.95], ddof=1))
    assert f"{ours:.3f} ± {std:.3f} (n=2)" in line
    assert f"{17.96 / 18.66:.3g} (Lv = {8024 / 1024:.3g} L)" in line  # Press et al. Table 3
    assert f"{22.3 / 23.9:.3g} (Lv = 16 L)" not in line and f"{22.2 / 23.9:.3g} (Lv = 8 L)" in line  # KERPLE
    assert "| alibi | 2L" not in table  # not evaluated: no row


def test_findings_check_each_criterion_on_mean_seed_ratios():
    from alibi_lm.results.findings import ratio_findings, train_length_finding

    rows = [row("sinusoidal", L=16, lv=lv, ppl=p, seed=s) for s, (p1, p8) in enumerate([(10.0, 19.0), (20.0, 44.0)])
            for lv, p in ((16, p1), (128, p8))]  # 8L ratios 1.9 and 2.2: their mean 2.05 >= 2 (ratio of means 1.05)
    rows += [row("t5", L=16, lv=lv, ppl=p) for lv, p in ((16, 10.0), (32, 10.0))]  # 1.0 is not < 1
    rows += [row("alibi", L=16, lv=lv, ppl=p) for lv, p in ((16, 10.0), (32, 9.0), (64, 9.5), (128, 9.9))]  # no 16L
    rows += [row("alibi", L=16, lv=lv, ppl=10.0, mode="sliding", stride=s) for s in (1, 4) for lv in (16, 32, 64, 128)]
    rows += [row("alibi", L=16, lv=256, ppl=10.6, mode="sliding", stride=4)]  # a coarser stride: left out
    rows += [row("alibi", L=16, lv=256, ppl=10.4, mode="sliding", stride=1)]
    by_finding = {r[0]: r for r in ratio_findings(pd.DataFrame(rows), 16)}
    sinusoidal = by_finding["sinusoidal breaks down past L"]
    assert sinusoidal[3] == f"8L: 2.050 ± {np.std([1.9, 2.2], ddof=1):.3f} (n=2)" and sinusoidal[4] == "holds"
    assert sinusoidal[2] == f"8L: {284.88 / 19.34:.3g} (Table 3, L = 1024)"
    assert by_finding["T5 improves from L to 2L"][4] == "does not hold"
    assert by_finding["ALiBi flat or falling to 16L"][3:] == ["2L: 0.900; 4L: 0.950; 8L: 0.990", "incomplete"]
    sliding = by_finding["ALiBi flat with sliding windows"]
    assert sliding[4] == "holds" and sliding[3].endswith("16L: 1.040 (stride 1, 1,000 targets)")  # stride 1 only
    rows += [row("alibi", L=16, lv=32, ppl=12.0, split="test"), row("alibi", L=32, lv=64, ppl=99.0)]  # other split, L
    assert ratio_findings(pd.DataFrame(rows), 16)[2][3] == "2L: 0.900; 4L: 0.950; 8L: 0.990"
    rows = [r for r in rows if not (r["position"] == "alibi" and r["eval_len"] == 64)] + [row("alibi", lv=64, ppl=10.5)]
    alibi = {r[0]: r for r in ratio_findings(pd.DataFrame(rows), 16)}["ALiBi flat or falling to 16L"]
    assert alibi[4] == "does not hold"  # 4L above 1: a measured failure, though 16L is missing

    lengths = [row("alibi", L=L, lv=lv, ppl=100.0 / L + lv / 1000) for L in (16, 32) for lv in (16, 32, 64, 128)]
    holds = ["falls with L at 2 of 2 Lv (64, 128; seed 0)", "holds"]
    assert train_length_finding(pd.DataFrame(lengths), "alibi")[3:] == holds
    # seeds 1 and 2 at L = 32 only, far worse: left out, as L = 16 has seed 0 alone (no 3-seed mean against one seed)
    more = [row("alibi", L=32, lv=lv, ppl=500.0, seed=s) for s in (1, 2) for lv in (16, 32, 64, 128)]
    assert train_length_finding(pd.DataFrame(lengths + more), "alibi")[3:] == holds
    lengths[-1]["ppl"] = 99.0  # L = 32 worse than L = 16 at Lv = 128
    assert train_length_finding(pd.DataFrame(lengths), "alibi")[4] == "does not hold"
    assert train_length_finding(pd.DataFrame([row("alibi", L=16, lv=64)]), "alibi") is None  # one L
    sinusoidal = [dict(r, position="sinusoidal") for r in lengths]
    assert train_length_finding(pd.DataFrame(sinusoidal), "sinusoidal") is None  # Table 5 trains ALiBi only


def test_the_report_warns_of_rows_from_other_weights_of_one_run():
    rows = [dict(row("alibi", lv=lv), run="runs/x/alibi-L16-seed0", weights=w) for lv, w in ((16, "a"), (32, "b"))]
    rows += [dict(row("t5", lv=lv), run="runs/x/t5-L16-seed0", weights="c") for lv in (16, 32)]
    text = report.report_markdown(store._typed(pd.DataFrame(rows)), "x")
    assert "**Warning: rows of these runs come from different weights**" in text
    assert text.count("runs/x/alibi-L16-seed0") == 1 and "runs/x/t5-L16-seed0" not in text
    rows[1]["weights"] = "a"
    assert "Warning" not in report.report_markdown(store._typed(pd.DataFrame(rows)), "x")


def test_the_report_names_only_the_provenance_every_row_has():
    rows = [dict(row("alibi", lv=lv), command="python -m alibi_lm.eval", commit="abc1234", device="cpu", wall_s=1.5)
            for lv in (16, 32)]
    header = report.report_markdown(store._typed(pd.DataFrame(rows)), "x").splitlines()[2]
    assert header.endswith("whose every row carries the command, commit, device and wall time that made it.")
    rows[1]["command"] = ""  # one row without its command: the header no longer claims it
    header = report.report_markdown(store._typed(pd.DataFrame(rows)), "x").splitlines()[2]
    assert header.endswith("whose every row carries the commit, device and wall time that made it.")
    bare = [{k: v for k, v in r.items() if k not in report.PROVENANCE} for r in rows]
    assert report.report_markdown(store._typed(pd.DataFrame(bare)), "x").splitlines()[2].endswith(
        f"from {store.CSV_NAME}.")


def test_findings_use_the_reports_main_training_length():
    tie = pd.DataFrame([row("alibi", L=L, lv=lv, ppl=p) for L in (32, 16) for lv, p in ((L, 20.0), (2 * L, 19.0))])
    assert "## Press et al.'s findings on these rows (L = 16)" in report.findings_section(tie)  # a tie: the smaller
    assert report.findings_section(pd.DataFrame([row("nope")])) == ""  # nothing to check


def test_every_registered_scheme_has_its_own_colour_and_extensions_share_it():
    from alibi_lm.positions import POSITION_SCHEMES

    colours = [plots.scheme_color(s) for s in POSITION_SCHEMES]
    assert len(set(colours)) == len(colours)  # 11 schemes: tab10 alone would repeat the first
    assert plots.scheme_color("rope+yarn") == plots.scheme_color("rope")


def test_every_line_of_a_plot_has_its_own_colour_and_marker_hugging_face_models_included(tmp_path, monkeypatch):
    """Fifteen subjects in one plot (the registry's schemes and four hf: models): no two lines look alike."""
    from alibi_lm.positions import POSITION_SCHEMES

    names = [*POSITION_SCHEMES, "hf:gpt2", "hf:bloom", "hf:llama", "hf:opt"]
    df = pd.DataFrame([row(n, lv=lv, ppl=20.0 + i) for i, n in enumerate(names) for lv in (16, 32)])
    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: figures.append(fig))
    plots.plot_extrapolation(df, 16, tmp_path / "x.png", "t")
    lines = [ln for ln in figures[0].axes[0].get_lines() if ln.get_label() in names]
    assert len(lines) == len(names)
    assert len({(ln.get_color() if isinstance(ln.get_color(), str) else tuple(ln.get_color()), ln.get_marker())
                for ln in lines}) == len(names)
    hf_colours = {plots.scheme_color(n, names[-4:]) for n in names[-4:]}
    assert len(hf_colours) == 4 and not hf_colours & {plots.scheme_color(s) for s in POSITION_SCHEMES}


def test_each_rope_extension_has_its_own_line_style_in_its_schemes_colour():
    from alibi_lm.positions.rope import ROPE_SCALINGS

    styles = [plots.line_style(f"rope+{m}") for m in ROPE_SCALINGS]
    assert len({(str(s["ls"]), s["marker"]) for s in styles}) == len(ROPE_SCALINGS)
    assert plots.line_style("rope") == dict(ls="-", marker="o")
    assert plots.line_style("rope+yarn-x4") == plots.line_style("rope+yarn")  # a fixed factor: same method


def test_the_variants_of_one_scheme_each_have_their_own_line_style():
    """A scheme's extensions, evaluation settings and variants share its colour, so each needs its own dash and
    marker: rope's five extensions, rope+qk_norm, rope+nope4, rope+nope4-w64 and rope+fraction0.25 in one plot."""
    from alibi_lm.positions.rope import ROPE_SCALINGS

    names = [f"rope+{m}" for m in ROPE_SCALINGS] + ["rope+qk_norm", "rope+nope4", "rope+nope4-w64", "rope+nope4-c64",
                                                   "rope+fraction0.25", "rope+bca", "rope+temperature",
                                                   "rope+bca+temperature", "alibi+ssmax", "alibi+learn_slopes"]
    styles = [plots.line_style(n) for n in names]
    assert len({(str(s["ls"]), s["marker"], s.get("fillstyle")) for s in styles}) == len(names)
    assert plots.line_style("alibi+temperature-a0.3-f64") == plots.line_style("alibi+temperature")
    tuned = plots.line_style("rope+nope4+temperature")  # iRoPE scored with temperature tuning: hollow markers
    assert tuned["fillstyle"] == "none" and tuned != plots.line_style("rope+nope4")
    assert plots.line_style("rope+nope4+bca+temperature")["fillstyle"] == "right"
    assert plots.scheme_color("rope+nope4-w64") == plots.scheme_color("rope")


def test_rows_without_a_training_length_get_a_table_and_no_ratios(tmp_path):
    """A Hugging Face model whose config names no L (BLOOM) evaluated at eval.lengths: its rows keep an empty
    train_len; the report shows them under "L unknown", without ratios to L, beside the other rows."""
    rows = [row("alibi", L=16, lv=lv, ppl=20.0 - lv / 16) for lv in (16, 32)]
    rows += [row("hf:bloom", L=None, lv=lv, ppl=30.0, seed=None, weights="w", data_sha="d") for lv in (16, 48)]
    store.upsert_rows(tmp_path / "extrapolation.csv", rows)
    key = dict(position="hf:bloom", train_len=None, eval_len=48, mode="nonoverlapping", stride=None, seed=None,
               split="valid", rope_scaling="")
    assert store.has_row(tmp_path / "extrapolation.csv", key, "w", "d")  # an empty L is a key value like any other
    assert not store.has_row(tmp_path / "extrapolation.csv", dict(key, train_len=48), "w", "d")
    written = {p.name for p in report.build_report(tmp_path)}
    text = (tmp_path / "extrapolation.md").read_text()
    assert "## L = 16 (nonoverlapping, valid" in text and "## L unknown (nonoverlapping, valid" in text
    assert text.count("Ratios to Lv = L") == 1 and "no ratios to L are given" in text
    assert {"extrapolation.png", "extrapolation-L16.png", "extrapolation-Lunknown.png"} <= written



def test_hashes_that_look_like_numbers_are_read_back_as_the_text_written(tmp_path):
    """A commit of digits around one e (7836e86) and digests of digits alone (leading zero) stay text when a table
    is read back: the row is found again for those weights and data, and the commit reads as written."""
    weights, data_sha = "0123456789012345", "1234567890123456"
    store.upsert_rows(tmp_path / "extrapolation.csv", [row("alibi", L=16, lv=16, ppl=20.0, weights=weights,
                                                           data_sha=data_sha, commit="7836e86")])
    df = store.read_results(tmp_path / "extrapolation.csv")
    assert (df["commit"].tolist(), df["weights"].tolist(), df["data_sha"].tolist()) == (["7836e86"], [weights],
                                                                                         [data_sha])
    key = dict(position="alibi", train_len=16, eval_len=16, mode="nonoverlapping", stride=None, seed=0,
               split="valid", rope_scaling="")
    assert store.has_row(tmp_path / "extrapolation.csv", key, weights, data_sha)


def test_schemes_are_ranked_with_whether_each_differs_from_the_one_above_by_more_than_the_seed_spread():
    from alibi_lm.results.findings import spread_ranking

    ppl = {"alibi": [149.0, 149.5, 148.6], "kerple_power": [145.0, 147.0, 149.0], "t5": [190.0, 193.0, 187.9],
           "fire": [151.0]}  # one seed: no spread, left out
    rows = pd.DataFrame([dict(position=p, seed=i, ppl=v) for p, values in ppl.items() for i, v in enumerate(values)])
    ranked = spread_ranking(rows)
    assert [r[0] for r in ranked] == ["kerple_power", "alibi", "t5"]
    assert ranked[0] == ["kerple_power", "147.00 ± 2.00 (n=3)", ""]
    assert ranked[1][2] == "no" and ranked[2][2] == "yes"  # 147 ± 2 overlaps 149.03 ± 0.45; 190.3 is far above


def extension_labels() -> list[str]:
    """Each extension's rows' rope_scaling label, as its method writes it: its defaults, and each option given."""
    labels = []
    for name in METHODS:
        labels.append(build_extension(name, {}, 64).label())
        for option in dataclasses.fields(OPTIONS[name]):
            value = next(v for v in (2, 16) if _builds(name, {option.name: v}))  # dca's chunk: above its local window
            labels.append(build_extension(name, {option.name: value}, 64).label())
    return labels


def _builds(name: str, options: dict) -> bool:
    try:
        build_extension(name, options, 64)
    except UserError:
        return False
    return True


def test_the_labels_the_evaluation_writes_pass_the_tables_check_and_no_other(tmp_path):
    # every label from the writers' own code (extension labels, attention_label, EvalConfig's choices), and an exp of
    # a loss past a float's range, are read back; each refused value gets a one-line refusal naming it
    labels = extension_labels()
    assert {"yarn-x2", "self_extend-group2", "lm_infinite-n_global2", "dca-chunk16"} <= set(labels)
    scorer = types.SimpleNamespace(set_temperature_tuning=lambda floor_scale, attn_scale: None)
    tuned = [temperature_tuning(scorer, EvalConfig(temperature_tuning=t, **kw), 16)
             for t, kw in [(False, {}), (True, {}), (True, dict(attn_scale=0.2, floor_scale=32))]]
    attention = [attention_label(w, t) for w in ("full", "bca") for t in tuned]
    assert "bca+temperature-a0.2-f32" in attention
    rows = [row(lv=16 * (i + 1), rope_scaling=label) for i, label in enumerate(labels)]
    rows += [row(lv=16, attention=a, mode=m, stride=4 if m == "sliding" else None, split=s)
             for a in attention for m in ("nonoverlapping", "sliding") for s in ("valid", "test")]
    rows += [row(lv=32, ppl=perplexity(710.5), loss=710.5)]  # a diverged run: finite loss, ppl past a float's range
    csv = tmp_path / "extrapolation.csv"
    store.upsert_rows(csv, rows)
    assert len(store.read_results(csv)) == len(rows)
    for column, value in [("rope_scaling", "yarn-factor2"), ("attention", "full+temperature"), ("mode", "strided"),
                          ("split", "train")]:
        bad = tmp_path / column / "extrapolation.csv"
        bad.parent.mkdir()
        pd.DataFrame([row(**{column: value})]).to_csv(bad, index=False)
        with pytest.raises(TableDamaged, match=re.escape(f"{bad}, line 2: {column} is '{value}', a value the code never writes")):
            store.read_results(bad)
