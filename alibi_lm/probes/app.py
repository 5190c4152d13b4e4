"""The probes app (configs/probes.yaml): passkey retrieval and the context-use curve for one model or
every run of an experiment, then the report.

    python -m alibi_lm.probes run=runs/quick/alibi-L64-seed0
    python -m alibi_lm.probes sweep=quick                        # make context-probes EXPERIMENT=quick
    python -m alibi_lm.probes run=hf:path/to/model data=wikitext2 hf.train_len=1024 probe=passkey
    python -m alibi_lm.probes run=runs/quick/rope-L64-seed0 probe=passkey extension=self_extend   # rows of its own
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .. import cli
from ..checkpoint import CHECKPOINT, latest_run, read_status, run_dirs
from ..config import RopeScalingConfig, resolve_device
from ..errors import UserError
from ..eval.evaluation import trained_task
from ..eval.extension import apply_method, chosen_method
from ..provenance import command_line
from ..subjects import Subject, check_job, hf, open_subject
from ..subjects.native import ALLOW_FAILED
from . import context_use, passkey_probe, report
from .config import ProbesJob


def sweep_runs(runs_root: Path, experiment: str) -> list[Path]:
    """Every run folder under runs_root/<experiment>/, in a stable order."""
    folder = Path(runs_root) / experiment
    runs = run_dirs(folder)
    if not runs:
        raise UserError(f"sweep={experiment}: no run folder (config.yaml + {CHECKPOINT}) under {folder}; train the "
                        f"experiment first (make sweep EXPERIMENT={experiment}) or set paths.runs=...")
    return runs


def run_passkey(subject: Subject, job: ProbesJob, extra: dict, method=None) -> None:
    csv = subject.out_dir / report.PASSKEY_CSV
    done = report.passkey_done(csv, subject.provenance["weights"], extra["data_sha"]) if job.skip_done else None

    def save(rows):
        report.replace_rows(csv, [dict(r, **extra) for r in rows], report.PASSKEY_KEY)
        scored = [r for r in rows if "acc" in r]
        if scored:
            acc, gain, copy = (sum(r[k] for r in scored) / len(scored) for k in ("acc", "gain", "copy_gain"))
            print(f"  passkey Lv={rows[0]['eval_len']}: accuracy {acc:.3f}, gain {gain:+.3f} nats/token over no key, "
                  f"{copy:+.3f} over another key (mean over {len(scored)} depths)")
        else:
            print(f"  passkey Lv={rows[0]['eval_len']}: {rows[0]['note']}")

    print(f"  {passkey_probe.plan(subject, job.passkey, job.split, int(job.tokens_per_batch), done, method)}")
    if not passkey_probe.probe(subject, job.passkey, job.split, int(job.tokens_per_batch), done, save, method):
        print(f"  passkey: every cell is already in {csv}")


def run_context(subject: Subject, job: ProbesJob, extra: dict) -> None:
    csv = subject.out_dir / report.CONTEXT_CSV
    settings, weights = context_use.settings(job.context), subject.provenance["weights"]
    if job.skip_done and report.context_done(csv, subject.identity, job.split, settings, weights, extra["data_sha"]):
        print(f"  context use: already in {csv}")
        return
    print(f"  {context_use.plan(subject, job.context, job.split, int(job.tokens_per_batch))}")
    rows = context_use.probe(subject, job.context, job.split, int(job.tokens_per_batch))
    report.replace_rows(csv, [dict(r, **extra) for r in rows], report.MODEL_KEY)
    if "loss" in rows[0]:
        s = report.context_summary(pd.DataFrame(rows)).iloc[0]  # c* and the gain beyond L, as in probes.md
        print(f"  context use up to {rows[0]['eval_len']}: c* = {s['c_star']:.0f} (L = {subject.identity['train_len']}), "
              f"gain beyond L {s['gain_beyond_L']:+.3f} ± {s['gain_beyond_L_se']:.3f} nats ({rows[0]['wall_s']:.0f} s)")
    else:
        print(f"  context use: {rows[0]['note']}")


def extended(subject: Subject, extension_cfg):
    """The extension= method (eval/extension.py) set on the subject's scorer at its L, or None: a scheme it does
    not fit is refused here in one line, before any forward pass, as the evaluate app refuses it."""
    method = chosen_method(RopeScalingConfig(), extension_cfg, subject.identity["train_len"])
    apply_method(subject.scorer, method, subject.identity["train_len"])
    return method


def task(job: ProbesJob, output_dir=None) -> None:
    device, out_dirs = resolve_device(job.device), []
    runs = Path(job.paths.runs)
    for target in sweep_runs(runs, str(job.sweep)) if job.sweep else [job.run or latest_run(runs)]:
        if job.sweep and not hf.is_hf(target) and read_status(target)["status"] != "completed":
            print(f"{target}: not a completed run; skipped (probe it with run={target} {ALLOW_FAILED}=true)")
            continue
        subject = open_subject(job, target, device)  # an unfinished run: refused unless allow_failed_run=true
        if not hf.is_hf(target) and not subject.completed:
            print(f"note: {target} is not a completed run")
        print(f"{subject.name} ({subject.provenance['run']}):")
        extra = dict(subject.provenance, data_sha=subject.split_sha(job.split), command=command_line())
        method = extended(subject, job.extension)
        if job.probe in ("passkey", "all"):  # every check before the first forward pass
            passkey_probe.check_fits(subject, job.passkey, job.split)
        if job.probe in ("context", "all"):
            context_use.check_fits(subject, job.context, job.split)
        if job.probe in ("passkey", "all"):
            run_passkey(subject, job, extra, method)
        if job.probe in ("context", "all"):
            run_context(subject, job, extra)
        out_dirs.append(subject.out_dir)
        report.build(subject.out_dir)  # after every model: a killed sweep leaves a report of what it did
    for out_dir in dict.fromkeys(out_dirs):
        print(f"-> {out_dir / report.REPORT}")


def check(job: ProbesJob, output_dir=None) -> None:
    """Preflight (the settings are checked by ProbesJob itself): the device, the model (run folder, hf:
    folder or sweep) and the results folder."""
    check_job(job)
    runs = [Path(job.run)] if job.run and not hf.is_hf(job.run) else []
    if job.sweep and not job.run:
        runs = sweep_runs(Path(job.paths.runs), str(job.sweep))
    for run in runs:
        if (task := trained_task(run)) != "lm":
            raise UserError(f"{run} was trained on the synthetic task {task}; the probes measure a language model on "
                            f"text: point run= (or sweep=) at language-model runs, and score a task run with "
                            f"python -m alibi_lm.eval run={run}")


def main() -> None:
    cli.main("probes", task, check)
