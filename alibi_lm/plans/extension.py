"""The extension comparison: every training-free method on every trained scheme it fits -> results/extension/.

    python scripts/extension.py --seeds 0,1,2 --dry-run   # what is missing and an estimate of its time
    python scripts/extension.py --seeds 0,1,2             # train what is missing, score it, then the report
    python scripts/extension.py --report-only             # rebuild README.md, the plots and sinks' summary from the rows

The runs are the small models of `python -m alibi_lm.train experiment=demo name=extension position=<scheme>
seed=<s> train.max_steps=300` (runs/extension/<scheme>-L64-seed<s>/), trained here when missing (a fresh process
each, one at a time, resumable: a killed run resumes from its last checkpoint), the paper's schemes first; fine-tunes
of them at s L (train.init_from, train.finetune_fraction) sit beside them and are scored as schemes of their own. Each
run is scored at L..16L with no method and with each method that fits its scheme (extension.check_scheme), with
key-token perplexity (eval.longppl), into results/extension/extrapolation.csv, and by the passkey probe with the
same methods into results/extension/passkey.csv (skip_done both: a killed sweep resumes). The report, README.md: the
command, commits, hardware and wall time the rows record; scheme x method x Lv tables of ppl, key-token ppl and
key-token count (mean ± sd over seeds), passkey accuracy and its relative effective length (NoLiMa); findings
computed from them (95% intervals over seeds) beside the published claims; the refusals. One plot per metric
(comparison-<metric>.png), and sinks.csv (attention mass on the first 4 tokens per layer and head at L and 16L,
with and without streaming).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..checkpoint import read_status
from ..cli import one_line_errors
from ..config import EvalConfig
from ..errors import ConfigError, UserError
from ..eval.evaluation import evaluate_run
from ..eval.sinks import first_token_mass
from ..extension import METHODS, OPTIONS, REMAP_METHODS, build_extension, check_scheme, scheme_kind
from ..positions import POSITION_SCHEMES
from ..probes import app as probes_app
from ..probes import report as probes_report
from ..probes.config import PasskeyConfig, ProbesJob
from ..provenance import command_line, hardware, weights_digest
from ..results import store
from ..results.markdown import cell_text, markdown_table
from ..results.task_learning import T95, Z95, effective_length
from ..subjects import open_native
from ..subjects.native import FINETUNE_JSON, load_run

RESCALINGS_COMPARED = ("linear", "ntk", "yarn")  # RoPE's, beside the remaps
MULTIPLIERS = [1, 2, 4, 8, 16]
SINK_TOKENS = 4
METHOD_NAMES = {"none", *METHODS}
PAPER_SCHEMES = ("alibi", "rope", "t5", "nope", "sinusoidal")  # trained and scored first: whole groups early
SCHEMES = (*PAPER_SCHEMES, "kerple_power", "sandwich", "xpos", "kerple_log", "fire")  # then the new ones
BASE_L, TRAIN_STEPS = 64, 300
# the passkey grid of the comparison: the probe's defaults (5 digits, the paper's filler) on fewer depths and trials
PASSKEY = dict(multipliers=MULTIPLIERS, depths=[0.0, 0.5, 1.0], trials=5)
PASSKEY_TOKENS_PER_BATCH = 8192


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


def training_command(scheme: str, seed: int, runs_dir: Path) -> list[str]:
    """The command that trains runs_dir/<scheme>-L64-seed<seed> (TRAINING_COMMANDS[0] with its values)."""
    return [sys.executable, "-m", "alibi_lm.train", "experiment=demo", f"name={runs_dir.name}", f"position={scheme}",
            f"seed={seed}", f"train.max_steps={TRAIN_STEPS}", f"train.eval_every={TRAIN_STEPS}",
            "train.checkpoint_every=100", "train.device=cpu", "train.threads=1", "train.evaluate_after=false",
            f"paths.runs={runs_dir.parent}"]


def completed(run: Path) -> bool:
    return read_status(run).get("status") == "completed"


def train(run: Path, scheme: str, seed: int) -> None:
    """Train a missing base run in a fresh process (resume: auto picks up a killed one at its last checkpoint)."""
    print(f"== train {run.name}: {' '.join(training_command(scheme, seed, run.parent)[1:])}", flush=True)
    if subprocess.run(training_command(scheme, seed, run.parent)).returncode != 0 or not completed(run):
        raise UserError(f"training {run} failed (its cli.log says why); fix it and run the comparison again")


def eval_config(run: Path, base: int, max_tokens: int) -> EvalConfig:
    """L..16L of the base L; a reference trained from scratch at s L is scored at the same lengths."""
    lengths = dict(multipliers=[], lengths=[m * base for m in MULTIPLIERS]) if train_len_of(run) != base else \
        dict(multipliers=MULTIPLIERS)
    return EvalConfig(**lengths, max_tokens=max_tokens, longppl=True, skip_done=True, tokens_per_batch=8192)


def methods_of_run(run: Path, base: int) -> list[str | None]:
    """None (no method) and each method the run's scheme takes; a fine-tune or a reference: no method on top."""
    tuned = (run / FINETUNE_JSON).is_file() or train_len_of(run) != base  # a column of its own
    return [None, *([] if tuned else methods_for(scheme_of_run(run)))]


def dirty_labels(csv: Path, weights: str) -> set[str]:
    """The method labels ('' none) whose rows from these weights were scored from a working tree with uncommitted
    changes: scored again (a retrained run with bit-identical weights would otherwise keep them)."""
    df = store.read_results(csv)
    if df.empty:
        return set()
    mine = df[(df["weights"].map(store.key_text) == weights) & df["commit"].astype(str).str.contains("uncommitted")]
    return set(mine["rope_scaling"].map(store.key_text))


def evaluate(run: Path, base: int, results: Path, max_tokens: int) -> None:
    """Perplexity rows of one run with every method (skip_done: what is there from these weights is kept, unless a
    working tree with uncommitted changes scored it)."""
    dirty = dirty_labels(results / "extension" / store.CSV_NAME, weights_digest(load_run(run)[0]))
    for method in methods_of_run(run, base):
        label = "" if method is None else build_extension(method, {}, base).label()
        print(f"== {run.name} {method or 'no method'}" + (" (again: its rows are from a dirty tree)" if label in dirty
                                                          else ""), flush=True)
        evaluate_run(run, eval_config(run, base, max_tokens), results, device="cpu", progress=False,
                     skip_done=label not in dirty, extension_cfg=None if method is None else OPTIONS[method]())


def passkey(run: Path, base: int, results: Path) -> None:
    """Passkey rows of one base run with every method into results/extension/passkey.csv (the probes app's
    run_passkey: skip_done by weights, data, trials and texts)."""
    if train_len_of(run) != base or (run / FINETUNE_JSON).is_file():
        return
    for method in methods_of_run(run, base):
        subject = open_native(run, results, torch.device("cpu"))  # a fresh model: no method left from the last one
        extra = dict(subject.provenance, data_sha=subject.split_sha("valid"), command=command_line())
        options = None if method is None else OPTIONS[method]()
        job = ProbesJob(run=str(run), probe="passkey", passkey=PasskeyConfig(**PASSKEY),
                        tokens_per_batch=PASSKEY_TOKENS_PER_BATCH, extension=options)
        print(f"== {run.name} passkey {method or 'no method'}", flush=True)
        probes_app.run_passkey(subject, job, extra, probes_app.extended(subject, options))


def base_runs(runs_dir: Path, schemes: list[str], seeds: list[int]) -> list[tuple[Path, str, int]]:
    """(folder, scheme, seed) of every base run the comparison wants, scheme by scheme (whole groups first)."""
    return [(runs_dir / f"{scheme}-L{BASE_L}-seed{seed}", scheme, seed) for scheme in schemes for seed in seeds]


def run_all(runs_dir: Path, schemes: list[str], seeds: list[int], results: Path, max_tokens: int) -> list[Path]:
    """Train, score and probe each base run in turn, then score the other completed runs (fine-tunes, references)."""
    wanted = base_runs(runs_dir, schemes, seeds)
    for run, scheme, seed in wanted:
        if not completed(run):
            train(run, scheme, seed)
        evaluate(run, BASE_L, results, max_tokens)
        passkey(run, BASE_L, results)
    others = [p for p in sorted(runs_dir.glob("*-L*-seed*")) if completed(p) and p not in {w[0] for w in wanted}]
    for run in others:
        evaluate(run, BASE_L, results, max_tokens)
    return [w[0] for w in wanted] + others


def done_labels(csv: Path, weights: str, read) -> set[str]:
    """The method labels ('' none) with rows in csv from these weights."""
    df = read(csv)
    if df.empty or "weights" not in df:
        return set()
    mine = df[df["weights"].map(store.key_text) == weights]
    return set(mine["rope_scaling"].map(store.key_text)) if "rope_scaling" in mine else {""}


def todo(runs_dir: Path, schemes: list[str], seeds: list[int], results: Path) -> list[tuple[str, str, int]]:
    """(run, what, count) still to do: train, ppl (methods not scored from its weights), passkey (likewise)."""
    out, extension = [], results / "extension"
    for run, _scheme, _seed in base_runs(runs_dir, schemes, seeds):
        methods = methods_of_run(run, BASE_L)
        labels = {"" if m is None else build_extension(m, {}, BASE_L).label() for m in methods}
        if not completed(run):
            out += [(run.name, "train", 1), (run.name, "ppl", len(labels)), (run.name, "passkey", len(labels))]
            continue
        weights = weights_digest(load_run(run)[0])
        scored = done_labels(extension / store.CSV_NAME, weights, store.read_results)
        out.append((run.name, "ppl", len(labels - (scored - dirty_labels(extension / store.CSV_NAME, weights)))))
        passkey_csv = extension / probes_report.PASSKEY_CSV
        out.append((run.name, "passkey", len(labels - done_labels(passkey_csv, weights, probes_report.read_table))))
    return [t for t in out if t[2]]


def estimate(results: Path, runs_dir: Path) -> dict[str, float]:
    """Seconds per training, per method's perplexity rows (5 lengths) and per method's passkey grid, from what
    this machine recorded (the median); a first guess where nothing is recorded yet."""
    trained = [read_status(p).get("train_seconds") for p in runs_dir.glob(f"*-L{BASE_L}-seed*") if completed(p)]
    trained = [t for t in trained if t]
    ppl = store.read_results(results / "extension" / store.CSV_NAME)
    passkey_rows = probes_report.read_table(results / "extension" / probes_report.PASSKEY_CSV)
    per = {"train": float(np.median(trained)) if trained else 240.0,
           "ppl": float(ppl["wall_s"].median()) * len(MULTIPLIERS) if len(ppl) else 60.0,
           "passkey": float(passkey_rows["wall_s"].median()) * len(MULTIPLIERS) * len(PASSKEY["depths"])
           if len(passkey_rows) else 30.0}
    return per


def dry_run(runs_dir: Path, schemes: list[str], seeds: list[int], results: Path) -> None:
    """Print what the comparison still has to do, in its order, and its estimated time."""
    per, work = estimate(results, runs_dir), todo(runs_dir, schemes, seeds, results)
    total, lines = 0.0, []
    for run, what, count in work:
        seconds = per[what] * count
        total += seconds
        lines.append(f"  {run}: {what} x{count} ~{seconds / 60:.0f} min (cumulative {total / 60:.0f} min)")
    print("\n".join(lines) or "  nothing to do: every run is trained and scored")
    print(f"estimate: {total / 60:.0f} min on this machine (per training {per['train'] / 60:.1f} min, per method's "
          f"perplexity {per['ppl'] / 60:.1f} min, per method's passkey grid {per['passkey'] / 60:.1f} min: medians of "
          f"what it recorded), plus the sinks' summary")


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


def t_interval(values: pd.Series) -> tuple[float, float, float, int]:
    """(mean, low, high, n): Student's t 95% interval of the mean over seeds (n < 2: no interval, nan)."""
    values = values.dropna().astype(float)
    n = len(values)
    if n < 2:
        return (float(values.mean()) if n else math.nan), math.nan, math.nan, n
    half = (T95[n - 2] if n - 1 <= len(T95) else Z95) * float(values.std(ddof=1)) / math.sqrt(n)
    return float(values.mean()), float(values.mean()) - half, float(values.mean()) + half, n


def passkey_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Scored passkey rows with a method column ('none' for the plain model) and Lv / L."""
    df = df[df["acc"].notna()].copy()
    method = df["rope_scaling"].map(store.key_text) if "rope_scaling" in df else pd.Series("", index=df.index)
    return df.assign(method=method.replace("", "none"), ratio=(df["eval_len"] / df["train_len"]).round().astype(int))


def passkey_effective(df: pd.DataFrame) -> pd.DataFrame:
    """Per (scheme, method, seed): the relative effective length (results.task_learning.effective_length, NoLiMa's: the longest
    Lv up to which the accuracy, mean over depths, keeps 85% of its value at L), the accuracy at L and the no-key
    control's; effective_len is empty where the accuracy at L is 0 (nothing to keep 85% of)."""
    rows = []
    for (scheme, method, seed, L), part in passkey_rows(df).groupby(["position", "method", "seed", "train_len"]):
        acc = part.groupby("eval_len")["acc"].mean()  # (Lv,): mean over depths
        length = effective_length(acc.to_dict(), int(L))  # None where the accuracy at L is 0
        at_L = part[part["eval_len"] == L]
        nokey, gain = (at_L[c].mean() if c in at_L else math.nan for c in ("acc_nokey", "gain"))
        rows.append(dict(position=scheme, method=method, seed=seed, train_len=int(L), acc_at_L=acc.get(int(L), math.nan),
                         nokey_at_L=nokey, gain_at_L=gain, effective_len=length))
    return pd.DataFrame(rows)


def passkey_tables(df: pd.DataFrame) -> str:
    """Accuracy by Lv / L (mean over depths, mean ± sd over seeds) and the effective length per scheme x method."""
    if df.empty or "acc" not in df or df["acc"].notna().sum() == 0:
        return "(no passkey rows yet)\n"
    rows_, ratios = passkey_rows(df), sorted(passkey_rows(df)["ratio"].unique())
    per_seed = rows_.groupby(["position", "method", "seed", "ratio"])["acc"].mean().reset_index()
    eff = passkey_effective(df)
    table = []
    for (scheme, method), cell in per_seed.groupby(["position", "method"]):
        mine = eff[(eff["position"] == scheme) & (eff["method"] == method)].sort_values("seed")
        L = int(mine["train_len"].iloc[0])
        lengths = ", ".join("n/a" if pd.isna(v) else f"{int(v) // L}L" for v in mine["effective_len"])
        table.append([scheme, method, *[cell_text(cell.loc[cell["ratio"] == r, "acc"], 2) for r in ratios],
                      cell_text(mine["nokey_at_L"], 2), cell_text(mine["gain_at_L"], 2), lengths])
    table.sort(key=lambda r: (r[0], r[1] != "none", r[1]))  # as the perplexity tables
    return markdown_table(["scheme", "method", *[f"{r}L" for r in ratios], "no-key control at L",
                           "log-prob gain over no key at L (nats/digit)", "effective length per seed"], table)


def paired_findings(df: pd.DataFrame) -> list[str]:
    """Per scheme at the longest length: each training-free method's perplexity minus no method's, paired by seed
    (the same weights), with its 95% t interval; a method is named better or worse only where the interval
    excludes 0."""
    df = columns_of(df)
    longest = int((df["eval_len"] / df["train_len"]).max())
    at = df[(df["eval_len"] / df["train_len"]).round() == longest]
    lines = []
    for scheme, part in at.groupby("position"):
        ppl = part.pivot_table(index="seed", columns="method", values="ppl")  # (seeds, methods)
        if "none" not in ppl or len(ppl.dropna(subset=["none"])) < 2:
            continue
        better, worse, within = [], [], []
        for method in [m for m in ppl.columns if m in METHOD_NAMES and m != "none"]:
            mean, low, high, n = t_interval(ppl[method] - ppl["none"])
            if n < 2:
                continue
            text = f"{method} {mean:+.1f} [{low:+.1f}, {high:+.1f}] (n={n})"
            (better if high < 0 else worse if low > 0 else within).append(text)
        if not (better or worse or within):
            continue  # a scheme no method fits (sinusoidal)
        lines.append(f"{scheme} at {longest}L, perplexity minus no method's, paired by seed (n seeds), 95% t "
                     f"interval: lower: {'; '.join(better) or 'none'}. Higher: {'; '.join(worse) or 'none'}. Interval "
                     f"holds 0: {'; '.join(within) or 'none'}.")
    return lines


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


# how the runs under runs/extension/ were trained (<p> each scheme, <n> its seed; <s> 2 or 4, <f> 0.01, 0.05 or
# 0.125 for the fine-tunes and the reference from scratch, seed 0 only). The first is training_command()'s.
TRAINING_COMMANDS = [
    "python -m alibi_lm.train experiment=demo name=extension position=<p> seed=<n> train.max_steps=300 "
    "train.eval_every=300 train.checkpoint_every=100 train.device=cpu train.threads=1 train.evaluate_after=false",
    "python -m alibi_lm.train experiment=demo name=extension position=<p> seed=0 train.seq_len=$((64*<s>)) "
    "train.batch_size=$((32/<s>)) train.init_from=runs/extension/<p>-L64-seed0 train.finetune_fraction=<f> "
    "train.max_steps=null train.max_tokens=null train.warmup_steps=0 train.lr=5e-4 train.eval_tokens=8192 "
    "hydra.run.dir=runs/extension/<p>-L64-seed0-ft<s>x<f>",
    "python -m alibi_lm.train experiment=demo name=extension position=<p> seed=0 train.seq_len=256 train.batch_size=8 "
    "train.max_steps=null train.max_tokens=691200 train.eval_tokens=16384   # from scratch at 4L: the parent's "
    "614,400 tokens plus the largest fine-tune's 12.5%",
]


def provenance_table(tables: dict[str, pd.DataFrame]) -> str:
    """Which rows came from which commit: per table and commit, the rows and the schemes with their seeds."""
    rows = []
    for name, df in tables.items():
        if df.empty:
            continue
        for commit, part in df.groupby(df["commit"].astype(str)):
            seeds = part.groupby("position")["seed"].unique()
            schemes = ", ".join(f"{s} ({','.join(str(int(v)) for v in sorted(seeds[s]))})"
                                for s in store.scheme_order(seeds.index))
            rows.append([name, commit, str(len(part)), f"{part['wall_s'].sum() / 60:.0f}", schemes])
    return markdown_table(["table", "commit", "rows", "scoring min (wall_s)", "schemes (seeds)"], rows)


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


def absent_runs(df: pd.DataFrame) -> list[str]:
    """A line naming the runs with rows here whose folders this checkout lacks (trained in another checkout)."""
    missing = sorted({r for r in df["run"].dropna().astype(str) if not Path(r).is_dir()})
    if not missing:
        return []
    return [f"Rows of runs whose folders are not in this checkout (trained in another; their training commits are not "
            f"listed above, their rows' commits are in the provenance table): {', '.join(missing)}.\n"]


PASSKEY_INTRO = (
    f"\n## Passkey retrieval\n\nThe passkey probe (alibi_lm/probes/passkey_probe.py) with each method: "
    f"{PASSKEY['trials']} prompts per (Lv, depth), depths {PASSKEY['depths']}, the probe's default texts (a 5-digit "
    f"key, the paper's filler). Teacher-forced accuracy on the key's digits, mean over depths, then mean ± sd over "
    f"seeds; at L the no-key control (the same prompt without the key statement) and the key's log-probability gain "
    f"over it; the relative effective length per seed (NoLiMa: the longest Lv up to which the accuracy keeps 85% of "
    f"its value at L; n/a where it is 0 at L).\n")


def header(df: pd.DataFrame, passkey_df: pd.DataFrame, command: str, started: float | None) -> list[str]:
    """The page's provenance: commands, commits per row group, hardware, wall time, seeds per scheme."""
    seeds = df.groupby("position")["seed"].nunique()
    intervals = "mean ± sd (n seeds) in the tables; 95% t intervals over seeds in the findings, where n >= 2"
    return ["# Training-free extension past L, every scheme it fits\n",
            f"Rows made by `python scripts/extension.py` (alibi_lm/plans/extension.py), this page by `{command}`"
            + (f" (this invocation {(time.time() - started) / 60:.0f} min)" if started else "") + f"; hardware: "
            f"{hardware()}. Rows by commit (a commit marked 'with uncommitted changes' was scored from a working tree "
            f"that differed from it):\n", provenance_table({"extrapolation.csv": df, "passkey.csv": passkey_df}),
            "\nSeeds per scheme: " + ", ".join(f"{s} {n}" for s, n in seeds.items()) + f" ({intervals}).\n"]


def report(results: Path, command: str, started: float | None, runs_dir: Path = Path("runs/extension")) -> None:
    out = results / "extension"
    df = store.read_results(out / store.CSV_NAME)
    passkey_df = probes_report.read_table(out / probes_report.PASSKEY_CSV)
    sections = [*header(df, passkey_df, command, started),
                "## Runs\n", "Trained by:\n", *[f"    {c}" for c in TRAINING_COMMANDS], "",
                runs_table(runs_dir) if runs_dir.is_dir() else "(run folders not on this machine)\n",
                *absent_runs(df), "## Perplexity\n", comparison(df, "ppl"),
                f"\n## Key-token perplexity (LongPPL, the model as its own evaluator, alpha = "
                f"{df['longppl_alpha'].dropna().unique().tolist()}, beta = {df['longppl_beta'].dropna().unique().tolist()})\n",
                comparison(df, "key_ppl"), "\n## Key tokens (count)\n", comparison(df, "key_tokens"),
                PASSKEY_INTRO, passkey_tables(passkey_df),
                f"\n## Attention on the first {SINK_TOKENS} tokens (sinks.csv: per layer and head)\n",
                sinks_table(out / "sinks.csv"),
                "\n## Findings (perplexity; computed from the rows above)\n",
                *[f"- {line}" for line in findings(df)], *[f"- {line}" for line in paired_findings(df)],
                "\n## Published claims these rows stand beside (quoted, not reproduced at this scale)\n",
                *[f"- {claim}" for claim in PUBLISHED],
                "\n## Refused\n",
                *([f"- {why}" for why in refusals(sorted(set(df["position"].str.split("+").str[0])))]
                  or ["- nothing: every scored scheme takes every method"])]
    (out / "README.md").write_text("\n".join(sections))
    for metric in ("ppl", "key_ppl"):
        plot(df, metric, out / f"comparison-{metric}.png")


def seed_list(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds takes seeds separated by commas (0,1,2), got {text!r}") from None


def scheme_list(text: str) -> list[str]:
    names = text.split(",")
    if unknown := [n for n in names if n not in POSITION_SCHEMES]:
        raise argparse.ArgumentTypeError(f"--schemes: unknown scheme {unknown[0]!r}; known: {', '.join(POSITION_SCHEMES)}")
    return names


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="runs/extension", help="the trained runs' folder")
    parser.add_argument("--results", default="results", help="results root: rows go to <results>/extension/")
    parser.add_argument("--max-tokens", type=int, default=16384, help="targets scored per length (eval.max_tokens)")
    parser.add_argument("--schemes", type=scheme_list, default=list(SCHEMES),
                        help=f"schemes to train and score, in this order (default: {','.join(SCHEMES)})")
    parser.add_argument("--seeds", type=seed_list, default=[0], help="seeds of each scheme, e.g. 0,1,2 (default 0)")
    parser.add_argument("--dry-run", action="store_true", help="print what is missing and its estimated time; do nothing")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    started, results, runs_dir = time.time(), Path(args.results), Path(args.runs)
    with one_line_errors():  # a failed training or a damaged table: one line, the rows written so far kept
        if args.dry_run:
            dry_run(runs_dir, args.schemes, args.seeds, results)
            return
        if not args.report_only:
            runs = run_all(runs_dir, args.schemes, args.seeds, results, args.max_tokens)
            sink_rows(runs, results, 4096).to_csv(results / "extension" / "sinks.csv", index=False)
        report(results, command_line(), None if args.report_only else started, runs_dir)
