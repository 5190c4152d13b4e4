"""The results table of an experiment and the report built from it.

results/<experiment>/extrapolation.csv holds one row per evaluated cell (KEY); re-evaluating a cell replaces its
row. rope_scaling is empty but for a rope run evaluated with an inference-time extension (position.scaling=yarn,
...); the report shows such rows as their own scheme, e.g. "rope+yarn". build_report() turns it into
extrapolation.md (paper-style tables) and extrapolation.png (perplexity vs evaluation length, Figure 1).

    python -m alibi_lm.results results/<experiment>      # rebuild the report (make report)
"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from .checkpoint import atomic_file, atomic_write_text, folder_lock, remove_stale_temporaries
from .errors import UserError
from .positions import POSITION_SCHEMES
from .positions.rope import ROPE_SCALINGS

CSV_NAME = "extrapolation.csv"
KEY = ["position", "train_len", "eval_len", "mode", "stride", "seed", "split", "rope_scaling"]
OPTIONAL_KEY = {"rope_scaling": ""}  # key columns a CSV written before they existed may lack, with their value
COLUMNS = [*KEY, "ppl", "loss", "tokens", "run", "step", "weights", "data", "data_sha", "commit", "note", "wall_s",
           "device", "timestamp", "command"]  # weights: provenance.weights_digest of the model scored; data_sha: the
# scored split's sha256 (first 16 hex digits); command: the command that made the row (provenance.command_line)
# Nullable integers: a missing stride (nonoverlapping) or token count (not applicable) stays <NA>.
_DTYPES = {"train_len": "Int64", "eval_len": "Int64", "stride": "Int64", "seed": "Int64", "tokens": "Int64",
           "step": "Int64", "ppl": "float64", "loss": "float64", "wall_s": "float64"}


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    # The same dtypes whether a row came from a dict or from the CSV, so that keys compare equal
    # (stride 16 vs 16.0, missing stride as <NA>) and integers are written without ".0"; a missing column is NaN.
    df = df.reindex(columns=[*COLUMNS, *(c for c in df.columns if c not in COLUMNS)])
    for col, missing in OPTIONAL_KEY.items():
        df[col] = df[col].astype(object).fillna(missing)
    for col in ("position", "mode", "split", *OPTIONAL_KEY):
        df[col] = df[col].astype(str)
    for col, dtype in _DTYPES.items():
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(dtype)
    return df


def has_row(csv_path: Path, key: dict, weights: str, data_sha: str) -> bool:
    """Whether the CSV already holds a row for this key (a scored or a not-applicable cell) computed from these
    weights (provenance.weights_digest) on this data (data_sha: the scored split's sha256, 16 hex digits); a row
    from other weights or data, or from before those columns existed, is not. Keys compare as replace_keyed's do."""
    columns = [*KEY, "weights", "data_sha"]
    wanted = {**OPTIONAL_KEY, **key, "weights": weights, "data_sha": data_sha}
    return tuple(key_text(wanted[k]) for k in columns) in set(row_keys(read_results(csv_path), columns))


def key_text(v) -> str:
    """A key value as text that compares equal whether it came from a row dict or from the CSV (16, 16.0, "16")."""
    if pd.isna(v):  # None, pd.NA, NaN
        return ""
    integral = isinstance(v, np.integer) or (isinstance(v, (float, np.floating)) and float(v).is_integer())
    return str(int(v)) if integral else str(v)


def row_keys(df: pd.DataFrame, cols: list[str]) -> pd.Series:
    """Each row's key as a tuple of key_text; a column the CSV lacks (written before it existed) reads as empty."""
    if df.empty:
        return pd.Series([], dtype=object)
    return df.reindex(columns=cols).apply(lambda r: tuple(key_text(v) for v in r), axis=1)


def read_table(path: Path, remedy: str, what: str = "table", columns: list[str] = ()) -> pd.DataFrame:
    """The CSV at path as written; no rows (with these columns) when it is missing or empty; a damaged one is a
    one-line UserError ("... fix or delete it and <remedy>")."""
    path = Path(path)
    try:
        return pd.read_csv(path) if path.is_file() else pd.DataFrame(columns=columns)
    except pd.errors.EmptyDataError:
        return pd.DataFrame(columns=columns)
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not a readable {what} ({str(e).splitlines()[0]}); fix or delete it and "
                        f"{remedy}") from None


def replace_keyed(path: Path, new: pd.DataFrame, key: list[str], read, sort_by: list[str] | None = None) -> pd.DataFrame:
    """Write the CSV at path (read(path): its rows) with every old row whose `key` columns equal a row of `new`'s
    dropped and `new` appended (several new rows may share a key: a curve); sorted by sort_by if given.
    Locked and atomic; the one writer of extrapolation.csv, passkey.csv and context_use.csv."""
    path = Path(path)
    with folder_lock(path.parent):  # jobs of several runs at once take turns at the CSV
        remove_stale_temporaries(path.parent, path.name)  # a killed writer's: no one else writes now
        old = read(path)
        old = old[~row_keys(old, key).isin(set(row_keys(new, key)))]
        df = pd.concat([old, new], ignore_index=True) if not old.empty else new
        if sort_by:
            df = df.sort_values(sort_by, na_position="first")
        atomic_write_text(path, df.to_csv(index=False))
    return df


def read_results(csv_path: Path) -> pd.DataFrame:
    df = read_table(csv_path, "re-run the evaluation", what="results table", columns=COLUMNS)
    if missing := [k for k in KEY if k not in df and k not in OPTIONAL_KEY]:
        raise UserError(f"{csv_path} lacks the columns {missing}; it was not written by alibi_lm.evaluate")
    return _typed(df)


def upsert_rows(csv_path: Path, rows: list[dict]) -> pd.DataFrame:
    """Add rows to the CSV, replacing any row with the same KEY (the newest wins); atomic and locked."""
    new = _typed(pd.DataFrame(rows)).drop_duplicates(subset=KEY, keep="last")
    sort_by = ["mode", "stride", "split", "position", "rope_scaling", "train_len", "seed", "eval_len"]
    return replace_keyed(csv_path, new, KEY, read_results, sort_by)


def scheme_order(names) -> list[str]:
    """The registry's order (the paper's, for its schemes), an inference-time extension ("rope+yarn") right after
    its scheme; names the registry does not know last."""
    def key(name):
        base = name.split("+")[0]
        return [*POSITION_SCHEMES, base].index(base), base, name  # an unknown scheme: len(POSITION_SCHEMES)

    return sorted(set(names), key=key)


def scheme_color(name: str) -> tuple:
    """The same colour for a scheme in every plot: its place in the registry picks from tab10, then Dark2
    (18 distinct colours: an eleventh scheme must not share the first one's); an extension such as
    rope+yarn takes its scheme's colour, dashed."""
    import matplotlib

    palette = [*matplotlib.colormaps["tab10"].colors, *matplotlib.colormaps["Dark2"].colors]
    base = name.split("+")[0]
    return palette[[*POSITION_SCHEMES, base].index(base) % len(palette)]


EXTENSION_STYLES = [dict(ls="--", marker="s"), dict(ls=":", marker="^"), dict(ls="-.", marker="v"),
                    dict(ls=(0, (5, 1, 1, 1, 1, 1)), marker="D")]


def line_style(name: str) -> dict:
    """A trained scheme: solid with dots; an inference-time extension (rope+yarn): its scheme's colour with
    its own dash and marker, so that the four RoPE extensions stay apart in one plot."""
    if "+" not in name:
        return dict(ls="-", marker="o")
    method = name.split("+", 1)[1].split("-")[0]  # yarn-x4 (a fixed factor) styles as yarn
    return EXTENSION_STYLES[[*ROPE_SCALINGS, method].index(method) % len(EXTENSION_STYLES)]


def _num(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.2f}"


def _cell_stats(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Mean, std and n of finite perplexities per cell; n = 0 marks an evaluated, not applicable cell."""
    finite = df.assign(ppl=df["ppl"].where(np.isfinite(df["ppl"])))
    return finite.groupby(by)["ppl"].agg(mean="mean", std="std", n="count").reset_index()


def _fmt(mean: float, std: float, n: int) -> str:
    if n == 0 or not math.isfinite(mean):
        return "n/a"
    return _num(mean) if n == 1 else f"{_num(mean)} ± {_num(std)} (n={n})"


def _cells(df: pd.DataFrame, by: str, bold_min: bool = False) -> pd.DataFrame:
    """The text of each cell, (value of by, eval_len): blank where not evaluated, n/a where evaluated and not
    applicable (learned past its table); bold_min: the lowest perplexity of each row in bold."""
    stats = _cell_stats(df, [by, "eval_len"]).set_index([by, "eval_len"])
    text = pd.Series([_fmt(*cell) for cell in stats.itertuples(index=False)], index=stats.index, dtype=object)
    if bold_min:  # a mean equal to its row's lowest: never an n/a cell (a NaN mean)
        best = stats["mean"] == stats.groupby(level=0)["mean"].transform("min")
        text[best] = "**" + text[best] + "**"
    return text.unstack(fill_value="")


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def extrapolation_table(df: pd.DataFrame) -> str:
    """Schemes x eval lengths for one (mode, stride, split, train_len): the shape of Tables 2-3."""
    cells = _cells(df, "position", bold_min=True)
    rows = [[scheme, *cells.loc[scheme]] for scheme in scheme_order(cells.index)]
    return _markdown(["scheme \\ Lv", *map(str, cells.columns)], rows)


def train_length_table(df: pd.DataFrame, scheme: str) -> str:
    """Rows = training lengths L, columns = eval lengths, for one scheme; plus sinusoidal at Lv = L
    (the shape of the paper's Table 5: does a short-trained model extrapolated beat a long-trained one?)."""
    cells = _cells(df[df["position"] == scheme], "train_len")
    rows = [[f"L = {L}", *cells.loc[L]] for L in cells.index]
    sin = df[(df["position"] == "sinusoidal") & (df["train_len"] == df["eval_len"])]
    if scheme != "sinusoidal" and not sin.empty:
        sin_cells = _cells(sin, "position").iloc[0].reindex(cells.columns, fill_value="")  # this scheme's columns
        rows.append(["sinusoidal (Lv = L)", *sin_cells])
    return _markdown(["L \\ Lv", *map(str, cells.columns)], rows)


def _protocols(df: pd.DataFrame) -> list[tuple[tuple[str, object, str], pd.DataFrame]]:
    """((mode, stride, split), its rows) per protocol present, the paper's main one (nonoverlapping, valid) first."""
    groups = df.groupby(["mode", "stride", "split"], dropna=False, sort=False)  # a missing stride is a protocol
    return sorted(groups, key=lambda g: (g[0][0] != "nonoverlapping", g[0][2] != "valid", g[0][2],
                                        -1 if pd.isna(g[0][1]) else int(g[0][1])))


def _protocol_name(mode: str, stride, split: str) -> str:
    return (mode if pd.isna(stride) else f"{mode}, stride {int(stride)}") + f", {split}"


def ratio_table(df: pd.DataFrame, sliding: bool = False) -> str:
    """ppl(kL) / ppl(L) per scheme (mean over seeds of each seed's ratio) beside the published ratios:
    the size of each effect, not only its direction, at a glance."""
    from .findings import ratio_text, seed_ratios
    from .paper_results import KERPLE_SMALL, PRESS_SLIDING, PRESS_TABLE3, published_ratio

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
    return _markdown(header, rows) if rows else ""


def findings_section(df: pd.DataFrame) -> str:
    """Press et al.'s findings checked on these rows (alibi_lm/findings.py), at the most common L."""
    from .findings import ratio_findings, train_length_finding

    counts = df["train_len"].dropna().value_counts()
    if counts.empty:
        return ""
    main_L = int(min(counts.index, key=lambda L: (-counts[L], L)))  # as build_report picks its main plot
    rows = ratio_findings(df, main_L)
    rows += [row for scheme in scheme_order(df["position"]) if (row := train_length_finding(df, scheme))]
    if not rows:
        return ""
    return (f"## Press et al.'s findings on these rows (L = {main_L})\n\nRatios are the mean over seeds of each "
            f"seed's ppl(kL) / ppl(L); criteria: alibi_lm/findings.py, the paper's values: alibi_lm/paper_results.py.\n\n"
            + _markdown(["finding", "criterion", "paper", "ours", "verdict"], rows))


def report_markdown(df: pd.DataFrame, title: str) -> str:
    parts = [f"# {title}: perplexity at evaluation length Lv\n",
             "Rows are position schemes, columns evaluation lengths Lv; L is the training length. "
             "Bold: the lowest perplexity in the row. n/a: not applicable (a learned table shorter than Lv); "
             "blank: not evaluated. Several seeds: mean ± std (n). Generated by `python -m alibi_lm.results`.\n"]
    # runs whose rows come from more than one set of weights (a row without one counts as its own): rows left
    # from an earlier training of the same folder, which a report must not mix unnoticed
    n_weights = df["weights"].groupby(df["run"].astype(str)).nunique(dropna=False)
    if mixed := sorted(n_weights[n_weights > 1].index):
        parts.append("**Warning: rows of these runs come from different weights** (an earlier training of the same "
                     "folder; evaluate them again, e.g. `eval.skip_done=true`): " + ", ".join(mixed) + "\n")
    if findings := findings_section(df):
        parts.append(findings)
    for (mode, stride, split), sub in _protocols(df):
        protocol = _protocol_name(mode, stride, split)
        for L, at_L in sub.groupby("train_len"):
            tokens = sorted({int(t) for t in at_L["tokens"].dropna()})
            scored = f", {' / '.join(f'{t:,}' for t in tokens)} targets scored" if tokens else ""
            parts += [f"## L = {L} ({protocol}{scored})\n", extrapolation_table(at_L)]
            if split == "valid" and (ratios := ratio_table(at_L, sliding=mode == "sliding")):
                parts += [f"Ratios to Lv = L beside the published ones (L = {L}):\n", ratios]
        for scheme in scheme_order(sub["position"]):
            if sub.loc[sub["position"] == scheme, "train_len"].nunique() >= 2:
                parts += [f"## {scheme}: training length x evaluation length ({protocol})\n",
                          train_length_table(sub, scheme)]
    return "\n".join(parts)


def pyplot():
    """matplotlib.pyplot, drawing to files only (the Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> None:
    """Lay out fig, write it to path as a PNG (atomically, as every table) and close it."""
    fig.tight_layout()
    with atomic_file(path) as f:
        fig.savefig(f, format="png", dpi=130, bbox_inches="tight")
    pyplot().close(fig)


def _length_axis(ax, lengths) -> None:
    """A tick at every eval length (log2 axis when they span 4x or more); labels that would overlap are
    left out (512, 612, 712 -> 512, 712)."""
    lengths = sorted(set(int(x) for x in lengths))
    log = bool(lengths) and lengths[-1] >= 4 * lengths[0]
    if log:
        ax.set_xscale("log", base=2)
    where = np.log2(lengths) if log else np.array(lengths, dtype=float)
    gap = (where[-1] - where[0]) / 16 if len(lengths) > 1 else 0
    labels, last = [], -np.inf
    for x, w in zip(lengths, where):
        labels.append(str(x) if w - last >= gap else "")
        last = w if labels[-1] else last
    ax.set_xticks(lengths, labels)
    ax.minorticks_off()


def _log_y(ax, values) -> None:
    """Log y labelled with plain numbers, about ten of them (matplotlib's default labels only 10^k, which a range
    of one or two decades may not hold)."""
    from matplotlib.ticker import LogLocator

    decades = math.log10(float(np.max(values)) / float(np.min(values)))
    subs = (1, 1.5, 2, 3, 5, 7) if decades < 1.6 else (1, 2, 5) if decades < 3.3 else (1,)
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=subs))
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:g}")  # matplotlib wraps it in a FuncFormatter
    ax.minorticks_off()


def plot_extrapolation(df: pd.DataFrame, L: int, path: Path, title: str) -> None:
    """Perplexity vs Lv at training length L: one line per scheme; one panel per protocol."""
    plt = pyplot()
    df = df[df["train_len"] == L]
    split = "valid" if (df["split"] == "valid").any() else sorted(df["split"].unique())[0]
    panels = [(p, sub) for p, sub in _protocols(df) if p[2] == split]
    fig, axes = plt.subplots(1, len(panels), figsize=(7.6 * len(panels), 4.6), squeeze=False)
    for ax, ((mode, stride, _), sub) in zip(axes[0], panels):
        stats = _cell_stats(sub, ["position", "eval_len"]).sort_values("eval_len")
        for scheme in scheme_order(stats["position"]):
            s = stats[stats["position"] == scheme]
            x, y, std = (s[c].to_numpy(dtype=float, na_value=np.nan) for c in ("eval_len", "mean", "std"))
            ax.plot(x, y, ms=4, lw=1.8, label=scheme, color=scheme_color(scheme), **line_style(scheme))
            if (s["n"] > 1).any():
                ax.fill_between(x, y - std, y + std, alpha=0.15, color=scheme_color(scheme), lw=0)
        finite = stats["mean"][np.isfinite(stats["mean"])]
        if len(finite) and finite.max() > 10 * finite.min():  # Figure 1: sinusoidal blows up by orders
            _log_y(ax, finite)
        ax.axvline(L, color="k", ls="--", lw=1, alpha=0.6)
        ax.text(L, 1.0, f" L = {L}", transform=ax.get_xaxis_transform(), va="top", ha="left", fontsize=9)
        _length_axis(ax, stats["eval_len"])
        ax.set(xlabel="evaluation length Lv (tokens)", ylabel=f"perplexity ({split})",
               title=_protocol_name(mode, stride, split))
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside: lines stay visible
    fig.suptitle(f"{title}: trained at L = {L}", fontsize=11)
    save_figure(fig, path)


PER_POSITION_FILE = re.compile(r"^(?P<prefix>.+)-Lv(?P<lv>\d+)\.csv$")
PER_POSITION_MIN_TOKENS = 8192  # scored tokens per bin: a standard error of about 0.03 nats at a loss std of 2.5


def position_bins(positions: np.ndarray, counts: np.ndarray, per_octave: int = 4,
                  min_tokens: int = PER_POSITION_MIN_TOKENS) -> np.ndarray:
    """Bin index of each position in the window: log-spaced bins (per_octave of them per doubling of
    position + 1), then neighbours merged until each bin holds min_tokens scored tokens (the last one
    joins its left neighbour when short). At Lv = 16L there are only a few hundred windows, so single
    positions are noise; the bins trade early-position detail for a mean that can be read."""
    log_bin = np.floor(np.log2(positions + 1) * per_octave + 1e-9).astype(int)  # (n,) per_octave bins per doubling
    bins, b, start, total = np.zeros(len(positions), dtype=int), 0, 0, 0
    for i in range(len(positions)):
        total += counts[i]
        end_of_log_bin = i + 1 == len(positions) or log_bin[i + 1] != log_bin[i]
        bins[i] = b
        if end_of_log_bin and total >= min_tokens:
            b, total, start = b + 1, 0, i + 1
    if start < len(positions) and b > 0:  # a short tail bin joins the one before it
        bins[start:] = b - 1
    return bins


def plot_per_position(per_position_dir: Path, prefix: str, L: int) -> Path | None:
    """Mean loss by position inside the window, one line per Lv, from <prefix>-Lv*.csv -> <prefix>.png,
    averaged over log-spaced position bins of at least PER_POSITION_MIN_TOKENS tokens (position_bins):
    they show the first tokens' high loss (the early-token curse) and an absolute scheme breaking past L."""
    plt = pyplot()
    per_position_dir = Path(per_position_dir)
    files = sorted((int(m["lv"]), p) for p in per_position_dir.glob(f"{prefix}-Lv*.csv")
                   if (m := PER_POSITION_FILE.match(p.name)) and m["prefix"] == prefix)
    if not files:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    cmap = plt.get_cmap("viridis")
    for i, (lv, p) in enumerate(files):
        d = pd.read_csv(p).dropna(subset=["mean_loss"])
        d = d[d["count"] > 0].sort_values("position_in_window")
        pos, w = d["position_in_window"].to_numpy(), d["count"].to_numpy(dtype=float)  # (n,), (n,)
        bins = position_bins(pos, w)
        den = np.bincount(bins, weights=w)
        loss = np.bincount(bins, weights=d["mean_loss"].to_numpy() * w) / den
        x = np.bincount(bins, weights=(pos + 1) * w) / den  # token-weighted mean position of the bin
        ax.plot(x, loss, lw=1.5, marker=".", ms=4, label=f"Lv = {lv}", color=cmap(i / max(len(files) - 1, 1) * 0.9))
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(lambda v, _: f"{v:g}")  # matplotlib wraps it in a FuncFormatter
    ax.axvline(L, color="k", ls="--", lw=1, alpha=0.6)
    ax.text(L, 1.0, f" L = {L}", transform=ax.get_xaxis_transform(), va="top", ha="left", fontsize=9)
    ax.set(xlabel="position in the evaluation window (1 = first target, log scale)", ylabel="mean loss (nats)",
           title=f"{prefix}: loss by position in the window\n"
                 f"(log-spaced bins of >= {PER_POSITION_MIN_TOKENS:,} scored tokens)")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=9, frameon=False)
    out = per_position_dir / f"{prefix}.png"
    save_figure(fig, out)
    return out


def build_report(results_dir: Path, per_position: bool = True) -> list[Path]:
    """extrapolation.csv -> extrapolation.md and extrapolation[-L<L>].png (and per-position plots)."""
    results_dir = Path(results_dir)
    csv_path = results_dir / CSV_NAME
    if not csv_path.is_file():
        raise UserError(f"no {CSV_NAME} in {results_dir}/; run `python -m alibi_lm.evaluate run=<run folder>` first")
    written = []
    with folder_lock(results_dir):  # read and write under the lock, so the last report holds every row
        df = read_results(csv_path)
        if df.empty:
            raise UserError(f"{csv_path} has no rows; evaluate a run first")
        extended = df["rope_scaling"] != ""  # rope + an inference-time extension: a scheme of its own here
        df.loc[extended, "position"] = df["position"] + "+" + df["rope_scaling"]
        title = results_dir.name
        atomic_write_text(results_dir / "extrapolation.md", report_markdown(df, title))
        written.append(results_dir / "extrapolation.md")
        counts = df["train_len"].value_counts()
        lengths = sorted(counts.index, key=lambda L: (-counts[L], L))  # the most common L first
        plots = [(lengths[0], "extrapolation.png")]  # the main figure, and one per L when there are several
        if len(lengths) > 1:
            plots += [(L, f"extrapolation-L{L}.png") for L in lengths]
        for L, name in plots:
            plot_extrapolation(df, int(L), results_dir / name, title)
            written.append(results_dir / name)
    if per_position:
        pp = results_dir / "per_position"
        prefixes = {m["prefix"] for p in pp.glob("*-Lv*.csv") if (m := PER_POSITION_FILE.match(p.name))}
        for prefix in sorted(prefixes):
            m = re.search(r"-L(\d+)-seed", prefix)
            if m and (out := plot_per_position(pp, prefix, int(m[1]))):
                written.append(out)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m alibi_lm.results", description=__doc__.splitlines()[0])
    parser.add_argument("results_dir", nargs="+", help="results/<experiment> folder(s) holding extrapolation.csv")
    parser.add_argument("--no-per-position", action="store_true", help="skip the per-position loss plots")
    args = parser.parse_args(argv)
    from .cli import one_line_errors

    with one_line_errors():
        for d in args.results_dir:
            for path in build_report(Path(d), per_position=not args.no_per_position):
                print(path)


if __name__ == "__main__":
    main()
