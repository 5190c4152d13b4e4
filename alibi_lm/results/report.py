"""The report of an experiment's extrapolation.csv: extrapolation.md (paper-style tables, Press et al.'s
findings checked on the rows, ratios beside the published ones) and its figures (plots.py). An
inference-time extension shows as a scheme of its own, e.g. "rope+yarn".

    python -m alibi_lm.results results/<experiment>      # rebuild the report (make report)
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd

from ..checkpoint import atomic_write_text, folder_lock
from ..errors import UserError
from .findings import ratio_findings, ratio_text, seed_ratios, spread_ranking, train_length_finding
from .learned_values import learned_section
from .markdown import markdown_table
from .plots import PER_POSITION_FILE, plot_extrapolation, plot_per_position
from .published import KERPLE_SMALL, PRESS_SLIDING, PRESS_TABLE3, published_ratio
from .store import CSV_NAME, cell_stats, protocol_name, protocols, read_results, scheme_order


def _num(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.2f}"


def _fmt(mean: float, std: float, n: int) -> str:
    if n == 0 or not math.isfinite(mean):
        return "n/a"
    return _num(mean) if n == 1 else f"{_num(mean)} ± {_num(std)} (n={n})"


def _cells(df: pd.DataFrame, by: str, bold_min: bool = False) -> pd.DataFrame:
    """The text of each cell, (value of by, eval_len): blank where not evaluated, n/a where evaluated and not
    applicable (learned past its table); bold_min: the lowest perplexity of each row in bold."""
    stats = cell_stats(df, [by, "eval_len"]).set_index([by, "eval_len"])
    text = pd.Series([_fmt(*cell) for cell in stats.itertuples(index=False)], index=stats.index, dtype=object)
    if bold_min:  # a mean equal to its row's lowest: never an n/a cell (a NaN mean)
        best = stats["mean"] == stats.groupby(level=0)["mean"].transform("min")
        text[best] = "**" + text[best] + "**"
    return text.unstack(fill_value="")


def extrapolation_table(df: pd.DataFrame) -> str:
    """Schemes x eval lengths for one (mode, stride, split, train_len): the shape of Tables 2-3."""
    cells = _cells(df, "position", bold_min=True)
    rows = [[scheme, *cells.loc[scheme]] for scheme in scheme_order(cells.index)]
    return markdown_table(["scheme \\ Lv", *map(str, cells.columns)], rows)


def train_length_table(df: pd.DataFrame, scheme: str) -> str:
    """Rows = training lengths L, columns = eval lengths, for one scheme; plus sinusoidal at Lv = L
    (the shape of the paper's Table 5: does a short-trained model extrapolated beat a long-trained one?)."""
    cells = _cells(df[df["position"] == scheme], "train_len")
    rows = [[f"L = {L}", *cells.loc[L]] for L in cells.index]
    sin = df[(df["position"] == "sinusoidal") & (df["train_len"] == df["eval_len"])]
    if scheme != "sinusoidal" and not sin.empty:
        sin_cells = _cells(sin, "position").iloc[0].reindex(cells.columns, fill_value="")  # this scheme's columns
        rows.append(["sinusoidal (Lv = L)", *sin_cells])
    return markdown_table(["L \\ Lv", *map(str, cells.columns)], rows)


def ratio_table(df: pd.DataFrame, sliding: bool = False) -> str:
    """ppl(kL) / ppl(L) per scheme (mean over seeds of each seed's ratio) beside the published ratios:
    the size of each effect, not only its direction, at a glance."""
    published = [(PRESS_SLIDING, "Press et al. Tables 13-15 (L = 512, stride 1)")] if sliding else [
        (PRESS_TABLE3, "Press et al. Table 3 (L = 1024)"), (KERPLE_SMALL, "KERPLE 162M (L = 512)")]
    rows = []
    for scheme in scheme_order(df["position"]):
        mine = df[df["position"] == scheme]
        for k in (2, 4, 8, 16):
            ratios = seed_ratios(mine, k)
            if ratios.empty:
                continue
            pub = [published_ratio(table, scheme, k) for table, _ in published]
            pub_cells = [f"{r[0]:.3g} (Lv = {r[1]:.3g} L)" if r else "-" for r in pub]
            rows.append([scheme, f"{k}L", ratio_text(ratios), *pub_cells])
    header = ["scheme", "Lv", "ours: ppl(Lv) / ppl(L)", *(source for _, source in published)]
    return markdown_table(header, rows) if rows else ""


def findings_section(df: pd.DataFrame) -> str:
    """Press et al.'s findings checked on these rows (alibi_lm/results/findings.py), at the most common L."""
    counts = df["train_len"].dropna().value_counts()
    if counts.empty:
        return ""
    main_L = int(min(counts.index, key=lambda L: (-counts[L], L)))  # as build_report picks its main plot
    rows = ratio_findings(df, main_L)
    rows += [row for scheme in scheme_order(df["position"]) if (row := train_length_finding(df, scheme))]
    if not rows:
        return ""
    return (f"## Press et al.'s findings on these rows (L = {main_L})\n\nRatios are the mean over seeds of each "
            f"seed's ppl(kL) / ppl(L); criteria: alibi_lm/results/findings.py, the paper's values: "
            f"alibi_lm/results/published.py.\n\n"
            + markdown_table(["finding", "criterion", "paper", "ours", "verdict"], rows))


def length_section(at_L: pd.DataFrame, L, protocol: str, ratios: bool = False, sliding: bool = False) -> list[str]:
    """The table of one training length L (and its ratios to Lv = L when asked); L None: rows of a model whose
    L is not known (a Hugging Face model whose config names none), which have no ratios."""
    tokens = sorted({int(t) for t in at_L["tokens"].dropna()})
    scored = f", {' / '.join(f'{t:,}' for t in tokens)} targets scored" if tokens else ""
    if L is None:
        return [f"## L unknown ({protocol}{scored})\n", extrapolation_table(at_L),
                "The training length of these models is not known (their config names none and hf.train_len was "
                "not set): no ratios to L are given.\n"]
    parts = [f"## L = {L} ({protocol}{scored})\n", extrapolation_table(at_L)]
    if ratios and (table := ratio_table(at_L, sliding=sliding)):
        parts += [f"Ratios to Lv = L beside the published ones (L = {L}):\n", table]
    return parts


def spread_section(df: pd.DataFrame) -> list[str]:
    """Per protocol of the valid split, at the most common L and the longest Lv, the schemes ranked by mean perplexity
    and, for each, whether it differs from the one ranked before it by more than the seed spread."""
    counts = df["train_len"].dropna().value_counts()
    if counts.empty:
        return []
    main_L = int(min(counts.index, key=lambda L: (-counts[L], L)))
    parts = []
    for (mode, stride, split), sub in protocols(df[(df["split"] == "valid") & (df["train_len"] == main_L)]):
        lv = int(sub["eval_len"].max())
        if ranked := spread_ranking(sub[sub["eval_len"] == lv]):
            parts += [f"## Differences beyond the seed spread ({protocol_name(mode, stride, split)}, L = {main_L}, "
                      f"Lv = {lv})\n",
                      "Schemes with two seeds or more, by mean perplexity. *yes*: its mean ± std interval lies wholly "
                      "above the one of the scheme ranked before it (the two differ by more than their seed spread); "
                      "*no*: the two intervals overlap.\n",
                      markdown_table(["scheme", "ppl", "apart from the one above"], ranked)]
    return parts


PROVENANCE = {"command": "command", "commit": "commit", "device": "device", "wall_s": "wall time"}


def provenance_note(df: pd.DataFrame) -> str:
    """Which of a row's provenance fields every row has: older tables lack some (no command column)."""
    kept = [name for col, name in PROVENANCE.items()
            if col in df and not (df[col].isna() | (df[col].astype(str) == "")).any()]
    if not kept:
        return ""
    listed = kept[0] if len(kept) == 1 else ", ".join(kept[:-1]) + " and " + kept[-1]
    return f", whose every row carries the {listed} that made it"


def report_markdown(df: pd.DataFrame, title: str) -> str:
    parts = [f"# {title}: perplexity at evaluation length Lv\n",
             "Rows are position schemes, columns evaluation lengths Lv; L is the training length. "
             "Bold: the lowest perplexity in the row. n/a: not applicable (a learned table shorter than Lv); "
             "blank: not evaluated. Several seeds: mean ± std (n). This file and the extrapolation*.png plots are "
             f"generated by `python -m alibi_lm.results <folder>` from {CSV_NAME}{provenance_note(df)}.\n"]
    # runs whose rows come from more than one set of weights (a row without one counts as its own): rows left
    # from an earlier training of the same folder, which a report must not mix unnoticed
    n_weights = df["weights"].groupby(df["run"].astype(str)).nunique(dropna=False)
    if mixed := sorted(n_weights[n_weights > 1].index):
        parts.append("**Warning: rows of these runs come from different weights** (an earlier training of the same "
                     "folder; evaluate them again, e.g. `eval.skip_done=true`): " + ", ".join(mixed) + "\n")
    if findings := findings_section(df):
        parts.append(findings)
    parts += spread_section(df)
    for (mode, stride, split), sub in protocols(df):
        protocol = protocol_name(mode, stride, split)
        for L, at_L in sub.groupby("train_len"):
            parts += length_section(at_L, L, protocol, ratios=split == "valid", sliding=mode == "sliding")
        if not (unknown := sub[sub["train_len"].isna()]).empty:  # groupby leaves them out
            parts += length_section(unknown, None, protocol)
        for scheme in scheme_order(sub["position"]):
            if sub.loc[sub["position"] == scheme, "train_len"].nunique() >= 2:
                parts += [f"## {scheme}: training length x evaluation length ({protocol})\n",
                          train_length_table(sub, scheme)]
    return "\n".join(parts)


def build_report(results_dir: Path, per_position: bool = True) -> list[Path]:
    """extrapolation.csv -> extrapolation.md and extrapolation[-L<L>].png (and per-position plots)."""
    results_dir = Path(results_dir)
    csv_path = results_dir / CSV_NAME
    if not csv_path.is_file():
        raise UserError(f"no {CSV_NAME} in {results_dir}/; run `python -m alibi_lm.eval run=<run folder>` first")
    written = []
    with folder_lock(results_dir):  # read and write under the lock, so the last report holds every row
        df = read_results(csv_path)
        if df.empty:
            raise UserError(f"{csv_path} has no rows; evaluate a run first")
        extended = df["rope_scaling"] != ""  # rope + an inference-time extension: a scheme of its own here
        df.loc[extended, "position"] = df["position"] + "+" + df["rope_scaling"]
        blockwise = df["attention"] != "full"  # so is a scheme evaluated with blockwise causal attention: xpos+bca
        df.loc[blockwise, "position"] = df["position"] + "+" + df["attention"]
        title = results_dir.name
        text = "\n".join([report_markdown(df, title), *learned_section(results_dir)])
        atomic_write_text(results_dir / "extrapolation.md", text)
        written.append(results_dir / "extrapolation.md")
        counts = df["train_len"].value_counts()
        lengths = sorted(counts.index, key=lambda L: (-counts[L], L))  # the most common L first
        lengths += [None] if df["train_len"].isna().any() else []  # models whose L is not known: last
        plots = [(lengths[0], "extrapolation.png")]  # the main figure, and one per L when there are several
        if len(lengths) > 1:
            plots += [(L, f"extrapolation-L{'unknown' if L is None else L}.png") for L in lengths]
        for L, name in plots:
            plot_extrapolation(df, None if L is None else int(L), results_dir / name, title)
            written.append(results_dir / name)
    if per_position:
        pp = results_dir / "per_position"
        prefixes = {m["prefix"] for p in pp.glob("*-Lv*.csv") if (m := PER_POSITION_FILE.match(p.name))}
        for prefix in sorted(prefixes):
            m = re.search(r"-L(\d+)-seed", prefix)
            if m and (out := plot_per_position(pp, prefix, int(m[1]))):
                written.append(out)
    return written
