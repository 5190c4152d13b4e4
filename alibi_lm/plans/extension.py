"""The extension comparison: every training-free method on every trained scheme it fits -> results/extension/.

    python scripts/extension.py                      # evaluate what is missing, then the report
    python scripts/extension.py --report-only        # rebuild comparison.md, the plots and README.md from the rows

The runs are the small models of `python -m alibi_lm.train experiment=demo name=extension position=<scheme>
seed=<s> train.max_steps=300` (runs/extension/<scheme>-L64-seed<s>/); fine-tunes of them at s L
(train.init_from, train.finetune_fraction) sit beside them and are scored as schemes of their own. Each run is
scored at L..16L with no method and with each method that fits its scheme (extension.check_scheme), with
key-token perplexity (eval.longppl), into results/extension/extrapolation.csv (skip_done: a killed sweep resumes).
The report: comparison.md (scheme x method x Lv, ppl and key-token ppl, mean ± sd over seeds), one plot per metric,
sinks.csv (attention mass on the first 4 tokens per layer and head, with and without streaming) and README.md with
the command, commits, hardware and wall time the rows record.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..checkpoint import read_status
from ..config import EvalConfig
from ..errors import ConfigError
from ..eval.evaluation import evaluate_run
from ..eval.sinks import first_token_mass
from ..extension import OPTIONS, REMAP_METHODS, build_extension, check_scheme, scheme_kind
from ..positions import POSITION_SCHEMES
from ..provenance import command_line, hardware
from ..results import store
from ..results.markdown import cell_text, markdown_table
from ..subjects import open_native

RESCALINGS_COMPARED = ("linear", "ntk", "yarn")  # RoPE's, beside the remaps
MULTIPLIERS = [1, 2, 4, 8, 16]
SINK_TOKENS = 4


def methods_for(scheme: str) -> list[str]:
    """The methods compared on a scheme: those check_scheme accepts (none for an absolute or content scheme)."""
    kind = scheme_kind(POSITION_SCHEMES[scheme])
    if kind in ("absolute", "content"):
        return []
    remaps = [name for name, cls in REMAP_METHODS.items() if kind != "none" or cls.hides_keys]
    return remaps + (list(RESCALINGS_COMPARED) if scheme == "rope" else [])


def scheme_of_run(run: Path) -> str:
    return run.name.split("-L")[0].split("+")[0]


def evaluate_all(runs: list[Path], results: Path, max_tokens: int) -> None:
    ev = EvalConfig(multipliers=MULTIPLIERS, max_tokens=max_tokens, longppl=True, skip_done=True, tokens_per_batch=8192)
    for run in runs:
        for method in [None, *methods_for(scheme_of_run(run))]:
            options = None if method is None else OPTIONS[method]()
            print(f"== {run.name} {method or 'no method'}", flush=True)
            evaluate_run(run, ev, results, device="cpu", progress=False, extension_cfg=options)


def sink_rows(runs: list[Path], results: Path, max_tokens: int) -> pd.DataFrame:
    """Attention mass on the first SINK_TOKENS tokens, per layer and head, at L and 16L, without a method and with
    streaming's sinks."""
    rows = []
    for run in runs:
        subject = open_native(run, results, torch.device("cpu"))
        model, L = subject.scorer.model, subject.identity["train_len"]
        tokens = subject.tokens("valid")[: max_tokens + 1]
        for method in (None, "streaming"):
            if method is not None:
                try:
                    model.set_extension(build_extension(method, {}, L))
                except ConfigError:
                    continue
            for lv in (L, 16 * L):
                mass = first_token_mass(model, tokens, lv, SINK_TOKENS, windows=2)
                rows += [dict(position=subject.identity["position"], seed=subject.identity["seed"], train_len=L,
                              eval_len=lv, extension=method or "none", layer=layer, head=head, mass=float(m))
                         for (layer, head), m in np.ndenumerate(mass)]
        model.set_extension(None)
    return pd.DataFrame(rows)


def comparison(df: pd.DataFrame, metric: str) -> str:
    """A markdown table: one row per scheme and method, one column per Lv / L, mean ± sd (n seeds) of `metric`."""
    df = df[df["mode"] == "nonoverlapping"].assign(method=df["rope_scaling"].replace("", "none"))
    ratios = sorted({int(r) for r in (df["eval_len"] / df["train_len"]).round()})
    header = ["scheme", "method", *[f"{r}L" for r in ratios]]
    rows = []
    for (scheme, method), cell in df.groupby(["position", "method"], sort=False):
        by_ratio = {r: cell.loc[(cell["eval_len"] / cell["train_len"]).round() == r, metric] for r in ratios}
        rows.append([scheme, method, *[cell_text(by_ratio[r], 1) for r in ratios]])
    rows.sort(key=lambda r: (r[0], r[1] != "none", r[1]))
    return markdown_table(header, rows)


def plot(df: pd.DataFrame, metric: str, path: Path) -> None:
    import matplotlib  # import cost: only the report draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = df[df["mode"] == "nonoverlapping"].assign(method=df["rope_scaling"].replace("", "none"))
    schemes = list(dict.fromkeys(df["position"]))
    cols = min(4, len(schemes))
    fig, axes = plt.subplots(math.ceil(len(schemes) / cols), cols, figsize=(4 * cols, 3.2 * math.ceil(len(schemes) / cols)),
                             squeeze=False)
    for ax, scheme in zip(axes.flat, schemes):
        for method, cell in df[df["position"] == scheme].groupby("method"):
            mean = cell.groupby("eval_len")[metric].mean().dropna()
            ax.plot(mean.index, mean.values, marker="o", ms=3, label=method, lw=2.5 if method == "none" else 1.2)
        ax.set(title=scheme, xscale="log", yscale="log", xlabel="Lv")
        ax.legend(fontsize=6)
    for ax in axes.flat[len(schemes):]:
        ax.axis("off")
    fig.suptitle(f"{metric} by evaluation length, per scheme and extension (L = {int(df['train_len'].iloc[0])})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def refusals(schemes: list[str]) -> list[str]:
    """The one-line refusal of each method a scheme has no use for."""
    lines = []
    for scheme in schemes:
        for method in REMAP_METHODS:
            try:
                check_scheme(REMAP_METHODS[method], POSITION_SCHEMES[scheme.split("+")[0]], scheme)
            except ConfigError as e:
                lines.append(str(e))
    return lines


def report(results: Path, command: str, started: float | None) -> None:
    out = results / "extension"
    df = store.read_results(out / store.CSV_NAME)
    seeds = df.groupby("position")["seed"].nunique()
    sections = [f"# Training-free extension past L, every scheme it fits\n",
                f"Made by `{command}` (alibi_lm/plans/extension.py); {len(df)} rows from commits "
                f"{', '.join(sorted(set(df['commit'].dropna().astype(str))))}; hardware: {hardware()}; scoring wall time "
                f"{df['wall_s'].sum() / 60:.0f} min (the rows' wall_s)"
                + (f", this invocation {(time.time() - started) / 60:.0f} min" if started else "") + ".\n",
                "Seeds per scheme: " + ", ".join(f"{s} {n}" for s, n in seeds.items()) + ".\n",
                "## Perplexity\n", comparison(df, "ppl"),
                f"\n## Key-token perplexity (LongPPL, the model as its own evaluator, alpha = "
                f"{df['longppl_alpha'].dropna().unique().tolist()}, beta = {df['longppl_beta'].dropna().unique().tolist()})\n",
                comparison(df, "key_ppl"), "\n## Key tokens (count)\n", comparison(df, "key_tokens"),
                "\n## Refused\n", *[f"- {why}" for why in refusals(sorted(set(df["position"])))]]
    (out / "comparison.md").write_text("\n".join(sections))
    for metric in ("ppl", "key_ppl"):
        plot(df, metric, out / f"comparison-{metric}.png")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="runs/extension", help="the trained runs' folder")
    parser.add_argument("--results", default="results", help="results root: rows go to <results>/extension/")
    parser.add_argument("--max-tokens", type=int, default=16384, help="targets scored per length (eval.max_tokens)")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    started, results = time.time(), Path(args.results)
    runs = sorted(p for p in Path(args.runs).glob("*-L*-seed*") if read_status(p).get("status") == "completed")
    if not args.report_only:
        evaluate_all(runs, results, args.max_tokens)
        sink_rows(runs, results, 4096).to_csv(results / "extension" / "sinks.csv", index=False)
    report(results, command_line(), None if args.report_only else started)
