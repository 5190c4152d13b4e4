"""The dry run: what the comparison still has to do, in its order, with an estimate of its time from what this
machine recorded (medians of the runs' training seconds and the rows' wall_s; a first guess where nothing is
recorded yet), and the folders it refuses to reuse."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ...checkpoint import read_status
from ...probes import report as probes_report
from ...results import store
from ...results.task_store import TASKS_CSV, read_task_results
from ...subjects.native import read_finetune_record
from .runs import BASE_L, BASE_TOKENS, MULTIPLIERS, REFERENCE_TOKENS, Job, completed, methods_for, stale_runs, staleness
from .scoring import PASSKEY, dirty_labels, label_of, method_labels, weights_of
from .tasks import pending

PROCESS_START = 30.0  # seconds a fresh training process spends before its first step (imports, data cache)
# seconds per task cell of 1,024 sequences: the mean over L..16L measured on this machine with no method (a rotary
# remap's passes cost more: DCA on RoPE about 3x)
TASK_CELL = 18.0


def median_or(values: list, default: float) -> float:
    values = [v for v in values if v]
    return float(np.median(values)) if values else default


def training_seconds(runs_dir: Path, wanted: list[Job]) -> dict:
    """Recorded train_seconds: base runs (a list), references (a list), fine-tunes by (scale, fraction); only of
    the folders the comparison wants and would keep (a run of other settings trained for another time)."""
    out = {"base": [], "reference": [], "finetune": {}}
    kept = {job.folder(runs_dir) for job in wanted if not staleness(job, runs_dir)}
    for run in (p for p in runs_dir.glob("*-L*-seed*") if p in kept and completed(p)):
        seconds, record = read_status(run).get("train_seconds"), read_finetune_record(run)
        if record:
            out["finetune"].setdefault((record["scale"], record["fraction"]), []).append(seconds)
        elif re.fullmatch(rf"[a-z0-9_]+-L{BASE_L}-seed\d+", run.name):
            out["base"].append(seconds)
        elif re.fullmatch(r"[a-z0-9_]+-L\d+-seed\d+", run.name):
            out["reference"].append(seconds)
    return out


def train_estimate(job: Job, recorded: dict) -> float:
    """Seconds to train one run: the median recorded for its kind (fine-tunes: of its scale and fraction), else
    the base runs' seconds per token times its tokens (twice that for a longer length), plus the process start."""
    base = median_or(recorded["base"], 900.0)
    per_token = base / BASE_TOKENS
    if job.kind == "base":
        return base + PROCESS_START
    if job.kind == "reference":
        return median_or(recorded["reference"], 2 * per_token * REFERENCE_TOKENS) + PROCESS_START
    guess = 2 * per_token * job.tokens()
    return median_or(recorded["finetune"].get((float(job.scale), job.fraction), []), guess) + PROCESS_START


def scoring_estimates(results: Path) -> dict[str, float]:
    """Seconds per method's perplexity rows (5 lengths), per method's passkey grid, per task cell."""
    ppl = store.read_results(results / "extension" / store.CSV_NAME)
    passkey_rows = probes_report.read_table(results / "extension" / probes_report.PASSKEY_CSV)
    tasks = read_task_results(results / "extension" / TASKS_CSV)
    return {"ppl": float(ppl["wall_s"].median()) * len(MULTIPLIERS) if len(ppl) else 60.0,
            "passkey": float(passkey_rows["wall_s"].median()) * len(MULTIPLIERS) * len(PASSKEY["depths"])
            if len(passkey_rows) else 30.0,
            "task": float(tasks["wall_s"].median()) if len(tasks) else TASK_CELL}


def run_todo(job: Job, runs_dir: Path, results: Path) -> list[tuple[str, int]]:
    """(what, count) still to do for one run: train (missing, or a folder not to reuse: trained again once cleared),
    ppl (methods not scored from its weights, or scored from a dirty tree), passkey (a base run's methods not probed
    from its weights)."""
    run, extension = job.folder(runs_dir), results / "extension"
    methods = [None, *methods_for(job.scheme)] if job.kind == "base" else [None]
    labels = {label_of(m) for m in methods}
    if not completed(run) or staleness(job, runs_dir):
        return [("train", 1), ("ppl", len(labels))] + ([("passkey", len(labels))] if job.kind == "base" else [])
    weights = weights_of(run)
    scored = method_labels(extension / store.CSV_NAME, weights, store.read_results)
    out = [("ppl", len(labels - (scored - dirty_labels(extension / store.CSV_NAME, weights))))]
    if job.kind == "base":
        probed = method_labels(extension / probes_report.PASSKEY_CSV, weights, probes_report.read_table)
        out.append(("passkey", len(labels - probed)))
    return [t for t in out if t[1]]


def dry_run(wanted: list[Job], runs_dir: Path, results: Path, task_runs: list[Path], examples: int) -> None:
    """Print what the comparison still has to do, in its order, and its estimated time."""
    recorded, per = training_seconds(runs_dir, wanted), scoring_estimates(results)
    total, lines = 0.0, []
    for job in wanted:
        for what, count in run_todo(job, runs_dir, results):
            seconds = train_estimate(job, recorded) if what == "train" else per[what] * count
            total += seconds
            kind = f" ({job.kind}, {job.tokens():,} tokens)" if what == "train" else f" x{count}"
            lines.append(f"  {job.folder(runs_dir).name}: {what}{kind} ~{seconds / 60:.0f} min (cumulative {total / 60:.0f} min)")
    for run in task_runs:
        for method, cells in pending(run, results, examples).items():
            seconds = per["task"] * len(cells) * examples / 1024
            total += seconds
            lines.append(f"  {run}: task cells {method or 'no method'} x{len(cells)} ({examples} sequences each) "
                         f"~{seconds / 60:.1f} min (cumulative {total / 60:.0f} min)")
    if stale := stale_runs(wanted, runs_dir):
        print("to clear first (the comparison refuses to start while these remain):\n" + "\n".join(f"  {s}" for s in stale))
    print("\n".join(lines) or "  nothing to do: every run is trained and scored")
    base = train_estimate(Job("alibi", 0), recorded)
    print(f"estimate: {total / 60:.0f} min on this machine (per base training {base / 60:.1f} min, per method's "
          f"perplexity {per['ppl'] / 60:.1f} min, per method's passkey grid {per['passkey'] / 60:.1f} min, per task "
          f"cell {per['task']:.0f} s: medians of what it recorded), plus the sinks' summary")
