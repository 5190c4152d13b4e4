"""The probes' tables (passkey.csv, context_use.csv in results/<experiment>/) and the report built from them:
probes.md, probes/passkey-<scheme>-L<L>.png (heatmaps), probes/context_use.png (curves) and
probes/context_use_vs_L.png (the saturation context c* against L).

    python -m alibi_lm.probes.report results/<experiment>     # rebuild the report from the CSVs
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from ..checkpoint import atomic_write_text
from ..cli import one_line_errors
from ..errors import ArgumentParser, UserError
from ..results import store
from ..results.markdown import markdown_table
from ..results.store import key_text, row_keys
from ..results.tables import SCHEMAS, TableSchema, register_table
from . import context_use, plots

PASSKEY_CSV, CONTEXT_CSV, REPORT = "passkey.csv", "context_use.csv", "probes.md"
FIGURES = "probes"
MODEL_KEY = ["position", "train_len", "seed", "split"]
PASSKEY_SETTING = ["split", "filler", "key_tokens"]  # cells of one setting are averaged together in the tables
# rope_scaling: the extension's label (extension=<method>, as perplexity rows name it), empty for the plain model
PASSKEY_KEY = [*MODEL_KEY, "filler", "key_tokens", "eval_len", "depth", "rope_scaling"]
# Every column the probes write (passkey.py, context_use.py: their rows' keys, in any order; a row of a cell that
# does not apply holds some of them): a table's header holds only these (results/tables.py)
PROVENANCE = ("note", "wall_s", "timestamp", "run", "step", "weights", "model", "data", "commit", "device", "data_sha", "command",
              "settings")
PASSKEY_STATS = ("acc", "acc_se", "acc_nokey", "acc_other", "exact", "exact_nokey", "logp", "logp_nokey", "logp_other", "gain",
                 "gain_se", "copy_gain", "copy_gain_se", "key_at")
register_table(TableSchema(PASSKEY_CSV, (*PASSKEY_KEY, "trials", *PASSKEY_STATS, *PROVENANCE),
                           integers=("train_len", "seed", "key_tokens", "eval_len", "trials", "step"),
                           numbers=("depth", *PASSKEY_STATS, "wall_s"), filled=("position", "split", "eval_len", "depth")))
CONTEXT_STATS = ("context_lo", "context_hi", "context", "loss", "se", "count")
# a not-applicable curve (a model past its learned table) has no Lv: eval_len may be empty
register_table(TableSchema(CONTEXT_CSV, (*MODEL_KEY, "eval_len", "stride", "levels", "eps", "z", *CONTEXT_STATS, *PROVENANCE),
                           integers=("train_len", "seed", "eval_len", "stride", "levels", "context_lo", "context_hi", "count",
                                     "step"),
                           numbers=("eps", "z", "context", "loss", "se", "wall_s"), filled=("position", "split")))
PASSKEY_TABLES = [("acc", "Teacher-forced accuracy on the key tokens"),
                  ("gain", "Log-probability gain of the key over the no-key prompt, nats per key token"),
                  ("copy_gain", "Log-probability gain of the key over the same prompt with another key "
                                "(the part that needs the key itself), nats per key token")]


def read_table(path: Path) -> pd.DataFrame:
    return store.read_table(path, "run the probes again")


def replace_rows(path: Path, rows: list[dict], key: list[str]) -> None:
    """Add rows to the CSV at path, first dropping every old row whose `key` columns equal a new row's
    (store.replace_keyed: locked and atomic, like store.upsert_rows)."""
    columns = list(SCHEMAS[Path(path).name].columns)  # the table's whole header, whatever these rows hold
    store.replace_keyed(path, pd.DataFrame(rows).reindex(columns=columns), key, read_table)


def passkey_done(path: Path, weights: str, data_sha: str):
    """done(cell, trials): the cell's row is there, scored (or not applicable) from these weights
    (provenance.weights_digest) on this data (data_sha) with the same number of trials and the same settings
    (the cell's passkey.settings: the key seed and the texts)."""
    columns = [*PASSKEY_KEY, "settings", "trials", "weights", "data_sha"]
    done = set(row_keys(read_table(path), columns))

    def is_done(cell: dict, trials: int) -> bool:
        values = {**cell, "trials": trials, "weights": weights, "data_sha": data_sha}
        return tuple(key_text(values.get(k)) for k in columns) in done  # a cell without rope_scaling: no method

    return is_done


def context_done(path: Path, identity: dict, split: str, settings: str, weights: str, data_sha: str) -> bool:
    """The model's curve on this split is there, made from these weights on this data (data_sha) with these
    settings (context_use.settings)."""
    key = (identity["position"], identity["train_len"], identity["seed"], split, settings, weights, data_sha)
    return tuple(map(key_text, key)) in set(row_keys(read_table(path), [*MODEL_KEY, "settings", "weights", "data_sha"]))


def with_method(df: pd.DataFrame) -> pd.DataFrame:
    """Rows under an extension shown as a scheme of their own, <scheme>+<label> (alibi+streaming), as the
    perplexity report shows them."""
    if "rope_scaling" not in df:
        return df
    label = df["rope_scaling"].map(key_text)
    return df.assign(position=[p if not m else f"{p}+{m}" for p, m in zip(df["position"], label)])


def _runs(df: pd.DataFrame):
    """(position, train_len) groups in the paper's scheme order, then by L."""
    order = {s: i for i, s in enumerate(store.scheme_order(df["position"].unique()))}
    groups = df[["position", "train_len"]].drop_duplicates().itertuples(index=False, name=None)
    return sorted(groups, key=lambda g: (order[g[0]], g[1]))


def _fmt(v, signed=False) -> str:
    return "n/a" if not np.isfinite(v) else (f"{v:+.2f}" if signed else f"{v:.2f}")


def passkey_tables(df: pd.DataFrame) -> str:
    """Scheme (and L) x Lv: accuracy and log-prob gain, means over depths and seeds."""
    lengths = sorted(df["eval_len"].unique())
    header = ["scheme \\ Lv", *map(str, lengths)]
    parts = []
    for column, title in PASSKEY_TABLES:
        if column not in df:
            continue
        rows = []
        for position, L in _runs(df):
            means = df[(df["position"] == position) & (df["train_len"] == L)].groupby("eval_len")[column].mean()
            rows.append([f"{position} (L={L})"] + [_fmt(means.get(lv, np.nan), signed=column != "acc") for lv in lengths])
        parts.append(f"{title} (mean over depths):\n\n" + markdown_table(header, rows))
    return "\n".join(parts)


def context_summary(df: pd.DataFrame) -> pd.DataFrame:
    """One row per model: c*, c*/L, the loss at L and the gain from context beyond L."""
    rows = []
    for key, curve in df[df["loss"].notna()].groupby(MODEL_KEY, dropna=False, sort=False):
        ident = dict(zip(MODEL_KEY, key))
        eps, z = float(curve["eps"].iloc[0]), float(curve["z"].iloc[0]) if "z" in curve else 0.0
        s = context_use.summary(curve, int(ident["train_len"]), eps, z)
        rows.append(dict(ident, eval_len=int(curve["eval_len"].iloc[0]), eps=eps, z=z, **s))
    return pd.DataFrame(rows)


def context_table(summary: pd.DataFrame) -> str:
    rows = []
    for position, L in _runs(summary):
        for r in summary[(summary["position"] == position) & (summary["train_len"] == L)].itertuples():
            at_end = "≥ " if r.c_star >= r.last_context else ""
            rows.append([str(position), str(L), key_text(r.seed) or "-", str(r.split), str(r.eval_len),
                         f"{at_end}{r.c_star:.0f}", f"{r.c_star_over_L:.2f}", f"{r.loss_at_L:.3f}",
                         f"{r.loss_at_end:.3f}", f"{r.gain_beyond_L:+.3f} ± {r.gain_beyond_L_se:.3f}",
                         "yes" if r.c_star > L else "no"])
    return markdown_table(["scheme", "L", "seed", "split", "Lv", "c*", "c*/L", "loss at L", "loss at the last bin",
                              "gain beyond L (nats)", "uses context beyond L"], rows)


def passkey_section(scored: pd.DataFrame, figures: Path) -> tuple[list[str], list[Path]]:
    """Tables and heatmaps, one set per setting (split, filler, key tokens): cells of different settings are
    never averaged together."""
    parts, written = [], []
    settings = sorted(scored[PASSKEY_SETTING].drop_duplicates().itertuples(index=False, name=None),
                      key=lambda t: tuple(map(str, t)))
    for split, filler, key_tokens in settings:
        sub = scored[(scored["split"] == split) & (scored["filler"] == filler) & (scored["key_tokens"] == key_tokens)]
        trials = ", ".join(str(t) for t in sorted({int(t) for t in sub["trials"].dropna()}))
        suffix = f"-{split}-{filler}-k{int(key_tokens)}" if len(settings) > 1 else ""  # one setting: the plain name
        parts += [f"### Filler: {filler}, split: {split}, {int(key_tokens)} digit tokens per key, {trials} trials per "
                  f"cell\n", passkey_tables(sub)]
        for position, L in _runs(sub):
            slug = re.sub(r"[^\w.-]+", "-", str(position)).strip("-")
            path = figures / f"passkey-{slug}-L{L}{suffix}.png"
            plots.passkey_heatmap(sub[(sub["position"] == position) & (sub["train_len"] == L)], path,
                                  f"{position}, L = {L} ({filler} filler, {split})")
            parts.append(f"![passkey {position} L={L}]({FIGURES}/{path.name})\n")
            written.append(path)
    return parts, written


def build(results_dir: Path) -> list[Path]:
    """passkey.csv and context_use.csv -> probes.md and the figures; returns the files written."""
    results_dir = Path(results_dir)
    passkey, context = read_table(results_dir / PASSKEY_CSV), read_table(results_dir / CONTEXT_CSV)
    if passkey.empty and context.empty:
        raise UserError(f"no {PASSKEY_CSV} or {CONTEXT_CSV} in {results_dir}/; run python -m alibi_lm.probes first")
    figures, written = results_dir / FIGURES, []
    parts = [f"# {results_dir.name}: beyond perplexity\n",
             "Made by `python -m alibi_lm.probes` (`make context-probes`); the rows, with the command, commit, "
             "device and wall time of each, are in passkey.csv and context_use.csv. Method: docs/probes.md.\n"]
    if not passkey.empty and "acc" in passkey:
        section, figs = passkey_section(with_method(passkey[passkey["acc"].notna()]), figures)
        parts += ["## Passkey retrieval\n", *section]
        written += figs
    if not context.empty and "loss" in context and context["loss"].notna().any():
        summary = context_summary(context)
        eps, z = (", ".join(f"{e:g}" for e in sorted(summary[c].unique())) for c in ("eps", "z"))
        parts += [f"## Context use\n\nc*: the smallest context c (log-spaced bins) such that no longer context c' "
                  f"has loss(c') < loss(c) - eps - z·sqrt(se(c)² + se(c')²), eps = {eps} nats, z = {z}; ≥ marks "
                  f"the last bin (context still helped at Lv). Gain beyond L: the loss in the bin holding L minus "
                  f"the loss in the last bin (the longest contexts, near Lv), ± its standard error.\n", context_table(summary)]
        for name, draw in (("context_use.png", plots.context_curves), ("context_use_vs_L.png", plots.saturation_vs_L)):
            draw(context if name == "context_use.png" else summary, figures / name)
            parts.append(f"![{name}]({FIGURES}/{name})\n")
            written.append(figures / name)
    atomic_write_text(results_dir / REPORT, "\n".join(parts))
    return [results_dir / REPORT, *written]


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(prog="python -m alibi_lm.probes.report", description=__doc__.splitlines()[0])
    parser.add_argument("results_dir", nargs="+", help="results/<experiment> folder(s) holding the probes' CSVs")
    args = parser.parse_args(argv)
    with one_line_errors():
        for d in args.results_dir:
            for path in build(Path(d)):
                print(path)

if __name__ == "__main__":
    main()
