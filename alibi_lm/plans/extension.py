"""The extension comparison: every training-free method on every trained scheme it fits -> results/extension/.

    python scripts/extension.py                      # evaluate what is missing, then the report
    python scripts/extension.py --report-only        # rebuild README.md, the plots and sinks' summary from the rows

The runs are the small models of `python -m alibi_lm.train experiment=demo name=extension position=<scheme>
seed=<s> train.max_steps=300` (runs/extension/<scheme>-L64-seed<s>/); fine-tunes of them at s L
(train.init_from, train.finetune_fraction) sit beside them and are scored as schemes of their own. Each run is
scored at L..16L with no method and with each method that fits its scheme (extension.check_scheme), with
key-token perplexity (eval.longppl), into results/extension/extrapolation.csv (skip_done: a killed sweep resumes).
The report, README.md: the command, commits, hardware and wall time the rows record; scheme x method x Lv tables of
ppl, key-token ppl and key-token count (mean ± sd over seeds); findings computed from them beside the published
claims; the refusals. One plot per metric (comparison-<metric>.png), and sinks.csv (attention mass on the first 4
tokens per layer and head at L and 16L, with and without streaming).
"""

from __future__ import annotations

import argparse
import json
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
from ..extension import METHODS, OPTIONS, REMAP_METHODS, build_extension, check_scheme, scheme_kind
from ..positions import POSITION_SCHEMES
from ..provenance import command_line, hardware
from ..results import store
from ..results.markdown import cell_text, markdown_table
from ..subjects import open_native
from ..subjects.native import FINETUNE_JSON

RESCALINGS_COMPARED = ("linear", "ntk", "yarn")  # RoPE's, beside the remaps
MULTIPLIERS = [1, 2, 4, 8, 16]
SINK_TOKENS = 4
METHOD_NAMES = {"none", *METHODS}


def methods_for(scheme: str) -> list[str]:
    """The methods compared on a scheme: those check_scheme accepts (none for an absolute or content scheme)."""
    kind = scheme_kind(POSITION_SCHEMES[scheme])
    if kind in ("absolute", "content"):
        return []
    remaps = [name for name, cls in REMAP_METHODS.items() if kind != "none" or cls.hides_keys]
    return remaps + (list(RESCALINGS_COMPARED) if scheme == "rope" else [])


def scheme_of_run(run: Path) -> str:
    return run.name.split("-L")[0].split("+")[0]


def train_len_of(run: Path) -> int:
    return int(run.name.split("-L")[1].split("-")[0])


def evaluate_all(runs: list[Path], results: Path, max_tokens: int) -> None:
    base = min(train_len_of(run) for run in runs)  # the L the comparison is at; longer runs are from-scratch references
    for run in runs:
        # a reference trained from scratch at s L is scored at the same lengths as the runs at L
        lengths = dict(multipliers=[], lengths=[m * base for m in MULTIPLIERS]) if train_len_of(run) != base else \
            dict(multipliers=MULTIPLIERS)
        ev = EvalConfig(**lengths, max_tokens=max_tokens, longppl=True, skip_done=True, tokens_per_batch=8192)
        tuned = (run / FINETUNE_JSON).is_file() or train_len_of(run) != base  # a column of its own: no method on top
        for method in [None, *([] if tuned else methods_for(scheme_of_run(run)))]:
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


def columns_of(df: pd.DataFrame) -> pd.DataFrame:
    """The nonoverlapping rows with a method column: the extension's label, a fine-tune's (+ft<s>x<f>, from the
    position label), scratch<s>x for a reference trained at s L (scored at the same lengths, so at L = the base)."""
    df = df[df["mode"] == "nonoverlapping"].copy()
    base = int(df["train_len"].min())
    method = df["rope_scaling"].replace("", "none")
    tuned = df["position"].str.contains(r"\+ft", regex=True)
    method[tuned] = df.loc[tuned, "position"].str.split("+").str[-1]
    scratch = df["train_len"] != base
    method[scratch] = "scratch" + (df.loc[scratch, "train_len"] // base).astype(str) + "x"
    return df.assign(method=method, position=df["position"].str.split("+").str[0], train_len=base)


def comparison(df: pd.DataFrame, metric: str) -> str:
    """A markdown table: one row per scheme and method, one column per Lv / L, mean ± sd (n seeds) of `metric`."""
    df = columns_of(df)
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

    df = columns_of(df)
    schemes = list(dict.fromkeys(df["position"]))
    cols = min(4, len(schemes))
    fig, axes = plt.subplots(math.ceil(len(schemes) / cols), cols, figsize=(4 * cols, 3.2 * math.ceil(len(schemes) / cols)),
                             squeeze=False)
    for ax, scheme in zip(axes.flat, schemes):
        ax.set_prop_cycle(color=plt.cm.tab20.colors)  # up to 20 columns told apart
        for method, cell in df[df["position"] == scheme].groupby("method"):
            mean = cell.groupby("eval_len")[metric].mean().dropna()
            if len(mean):  # key-token ppl is empty where no target is key
                ax.plot(mean.index, mean.values, marker="o", ms=3, label=method, lw=2.5 if method == "none" else 1.2)
        ax.set(title=scheme, xscale="log", xlabel="Lv")
        if ax.lines:
            ax.set_yscale("log")
            ax.legend(fontsize=6)
        else:
            ax.text(0.5, 0.5, f"no {metric} values", ha="center", transform=ax.transAxes)
    for ax in axes.flat[len(schemes):]:
        ax.axis("off")
    fig.suptitle(f"{metric} by evaluation length, per scheme and extension (L = {int(df['train_len'].iloc[0])})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


PUBLISHED = [
    "ReRoPE (bojone/rerope README, Llama-2-7B, L = 4k): loss 1.497 at 4k; plain RoPE 8.86 at 8k, NTK 1.54, ReRoPE "
    "(w = 1024) 1.427 at 8k and 1.400 at 16k: a RoPE model keeps improving past L under ReRoPE.",
    "Self-Extend (datamllab/LongLM README): passkey answered at 5k tokens by Llama-2 (L = 4k) and 10k by Mistral, where "
    "the base model fails.",
    "LM-Infinite (Han et al., NAACL 2024): zero-shot to 128k tokens with stable perplexity, on RoPE models and on MPT "
    "(ALiBi), whose far keys get ALiBi's bias at the distance limit.",
    "StreamingLLM (Xiao et al., ICLR 2024): stable perplexity to 4M tokens with 4 sinks; window attention without the "
    "sinks collapses once the first tokens are evicted; the authors say it does not extend the context window.",
    "LCEG (Lu et al. 2024): exact-attention fine-tuning works within its range, approximate attention (LM-Infinite, "
    "Landmark) underperforms it, and perplexity tracks downstream scores only for exact attention.",
]


def findings(df: pd.DataFrame) -> list[str]:
    """Per scheme, at the longest length: no method, the best training-free method and the best other column."""
    df = columns_of(df)
    longest = int((df["eval_len"] / df["train_len"]).max())
    at = df[(df["eval_len"] / df["train_len"]).round() == longest].groupby(["position", "method"])["ppl"].mean()
    lines = []
    for scheme in dict.fromkeys(at.index.get_level_values(0)):
        cells = at[scheme].dropna()
        if "none" not in cells:
            continue
        free = cells[[m for m in cells.index if m in METHOD_NAMES and m != "none"]]
        other = cells[[m for m in cells.index if m not in METHOD_NAMES]]
        line = f"{scheme} at {longest}L: no method {cells['none']:.1f}"
        if len(free):
            line += f"; best training-free {free.idxmin()} {free.min():.1f}, worst {free.idxmax()} {free.max():.1f}"
        if len(other):
            line += f"; best fine-tune / reference {other.idxmin()} {other.min():.1f}"
        lines.append(line + ".")
    return lines


def sinks_table(path: Path) -> str:
    """Attention mass on the first SINK_TOKENS tokens: mean over layers and heads, and the largest head's."""
    if not path.is_file():
        return "(sinks.csv not computed yet)\n"
    sinks = pd.read_csv(path)
    # the runs trained at the base L (not fine-tunes, nor the references from scratch at s L)
    sinks = sinks[~sinks["position"].str.contains("+", regex=False) & (sinks["train_len"] == sinks["train_len"].min())]
    cells = sinks.groupby(["position", "extension", "eval_len"])["mass"].agg(["mean", "max"]).reset_index()
    return markdown_table(["scheme", "method", "Lv", "mean over heads", "largest head"],
                          [[r.position, r.extension, str(r.eval_len), f"{r.mean:.3f}", f"{r.max:.3f}"]
                           for r in cells.itertuples()])


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


# how the runs under runs/extension/ were trained (seed 0; <p> each scheme, <s> 2 or 4, <f> 0.01, 0.05 or 0.125)
TRAINING_COMMANDS = [
    "python -m alibi_lm.train experiment=demo name=extension position=<p> seed=0 train.max_steps=300 "
    "train.eval_every=300 train.checkpoint_every=100 train.device=cpu train.threads=1",
    "python -m alibi_lm.train experiment=demo name=extension position=<p> seed=0 train.seq_len=$((64*<s>)) "
    "train.batch_size=$((32/<s>)) train.init_from=runs/extension/<p>-L64-seed0 train.finetune_fraction=<f> "
    "train.max_steps=null train.max_tokens=null train.warmup_steps=0 train.lr=5e-4 train.eval_tokens=8192 "
    "hydra.run.dir=runs/extension/<p>-L64-seed0-ft<s>x<f>",
    "python -m alibi_lm.train experiment=demo name=extension position=<p> seed=0 train.seq_len=256 train.batch_size=8 "
    "train.max_steps=null train.max_tokens=691200 train.eval_tokens=16384   # from scratch at 4L: the parent's "
    "614,400 tokens plus the largest fine-tune's 12.5%",
]


def runs_table(runs_dir: Path) -> str:
    """Each run: its training time, commits and validation perplexity at its L; a fine-tune's parent and budget."""
    rows = []
    for run in sorted(p for p in runs_dir.glob("*-L*-seed*") if read_status(p).get("status") == "completed"):
        status = read_status(run)
        tuned = json.loads((run / FINETUNE_JSON).read_text()) if (run / FINETUNE_JSON).is_file() else {}
        budget = f"{tuned['fraction']:g} of {tuned['parent_tokens']:,} tokens: {tuned['steps']} steps" if tuned else ""
        rows.append([run.name, f"{status.get('train_seconds', math.nan) / 60:.1f}", f"{status.get('val_ppl', math.nan):.1f}",
                     ", ".join(status.get("train_commits", [])), budget])
    return markdown_table(["run", "train min", "val ppl at its L", "commits", "fine-tune budget"], rows)


def report(results: Path, command: str, started: float | None, runs_dir: Path = Path("runs/extension")) -> None:
    out = results / "extension"
    df = store.read_results(out / store.CSV_NAME)
    seeds = df.groupby("position")["seed"].nunique()
    sections = ["# Training-free extension past L, every scheme it fits\n",
                f"Rows made by `python scripts/extension.py` (alibi_lm/plans/extension.py), this page by `{command}`; "
                f"{len(df)} rows from commits "
                f"{', '.join(sorted(set(df['commit'].dropna().astype(str))))}; hardware: {hardware()}; scoring wall time "
                f"{df['wall_s'].sum() / 60:.0f} min (the rows' wall_s)"
                + (f", this invocation {(time.time() - started) / 60:.0f} min" if started else "") + ".\n",
                "Seeds per scheme: " + ", ".join(f"{s} {n}" for s, n in seeds.items()) + " (one seed each: the CPU "
                "budget of this session; no intervals).\n",
                "## Runs\n", "Trained by:\n", *[f"    {c}" for c in TRAINING_COMMANDS], "",
                runs_table(runs_dir) if runs_dir.is_dir() else "(run folders not on this machine)\n",
                "## Perplexity\n", comparison(df, "ppl"),
                f"\n## Key-token perplexity (LongPPL, the model as its own evaluator, alpha = "
                f"{df['longppl_alpha'].dropna().unique().tolist()}, beta = {df['longppl_beta'].dropna().unique().tolist()})\n",
                comparison(df, "key_ppl"), "\n## Key tokens (count)\n", comparison(df, "key_tokens"),
                f"\n## Attention on the first {SINK_TOKENS} tokens (sinks.csv: per layer and head)\n",
                sinks_table(out / "sinks.csv"),
                "\n## Findings (perplexity, mean over seeds; computed from the rows above)\n",
                *[f"- {line}" for line in findings(df)],
                "\n## Published claims these rows stand beside (quoted, not reproduced at this scale)\n",
                *[f"- {claim}" for claim in PUBLISHED],
                "\n## Refused\n",
                *([f"- {why}" for why in refusals(sorted(set(df["position"].str.split("+").str[0])))]
                  or ["- nothing: every scored scheme takes every method"])]
    (out / "README.md").write_text("\n".join(sections))
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
    report(results, command_line(), None if args.report_only else started, Path(args.runs))
