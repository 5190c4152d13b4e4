"""What every plan driver (scripts/reproduce.py, scripts/tasks.py, scripts/task_rerun.py) shares: its common options
(--precision, --stop-starting-after), and drive(), its main: --dry-run, --status and --report-only, or the steps
run --jobs at a time (steps.run_steps) with the record of how the folder was made (run_record: RUN_LOG.jsonl, RUN_INFO.md)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

from alibi_lm.cli import number
from alibi_lm.config import PRECISIONS
from alibi_lm.provenance import hardware, head_commit

from . import checkout_root
from .run_record import RUN_LOG, log_event, step_outcome, write_run_info
from .steps import Step, log_name, plan_status, run_steps

ROOT = checkout_root()  # results/, runs/, logs/


def add_start_limit(p: argparse.ArgumentParser) -> None:
    """--stop-starting-after: the plan drivers' option for an allocation with a time limit (a cluster job, a
    session): no training starts after it; the running steps and the evaluations of the runs trained finish, so
    that the limit ends nothing half done."""
    p.add_argument("--stop-starting-after", type=number(float, 0), default=None, metavar="MINUTES",
                   help="start no training after this many minutes; the running steps and the evaluations of the runs "
                        "trained finish, then exit status 75 (the same command runs the rest): leave a run's length "
                        "before a job's time limit")


def add_modes(p: argparse.ArgumentParser, dry_run: str, status: str, report_only: str) -> None:
    """--dry-run, --status, --report-only: each runs nothing but itself, so at most one of them is given."""
    modes = p.add_mutually_exclusive_group()
    modes.add_argument("--dry-run", action="store_true", help=dry_run)
    modes.add_argument("--status", action="store_true", help=status)
    modes.add_argument("--report-only", action="store_true", help=report_only)


def names(text: str) -> list[str]:
    """'a,b,' -> ['a', 'b']: a comma list, empty entries dropped."""
    return [x.strip() for x in text.split(",") if x.strip()]


def repeated(entries: list) -> object | None:
    """The first entry given again, by value (2 and 2.0, seed 0 and 00 are one), or None: a plan's steps once each."""
    seen = set()
    for entry in entries:
        try:
            value = float(entry)
        except (TypeError, ValueError):
            value = entry
        if value in seen:
            return entry
        seen.add(value)
    return None


def comma_lists(p: argparse.ArgumentParser, args: argparse.Namespace, keys: tuple[str, ...]) -> None:
    """Each args.<key> comma list -> names(); an entry given twice is refused (its steps would run twice)."""
    for key in keys:
        entries = names(getattr(args, key))
        if (twice := repeated(entries)) is not None:
            p.error(f"--{key.replace('_', '-')} names {twice} twice; give each entry once")
        setattr(args, key, entries)


def add_precision(p: argparse.ArgumentParser) -> None:
    p.add_argument("--precision", choices=PRECISIONS, default=None,
                   help="train.precision of every training (its evaluations and probes compute as it trained): fp32 "
                   "on a GPU gives numbers comparable with a CPU's rows, bf16 about twice the speed; the rows' device "
                   "column names it, and it is no setting of the results (they go to the same folder)")


def precision_override(args: argparse.Namespace) -> list[str]:
    return [] if args.precision is None else [f"train.precision={args.precision}"]


def run_logged(name: str, steps: list[Step], jobs: int, runs: Path | list[Path], data: str, invocation: list[str],
               after_step=None, start_until: float | None = None) -> list[str]:
    """run_steps with the record of how results/<name>/ was made: the invocation's start (hardware, HEAD, data,
    threads, jobs, command line), each step's begin and end in RUN_LOG.jsonl, RUN_INFO.md rebuilt after every step
    (then after_step(), if given); each step's output in logs/<name>/ when jobs > 1. The names of failed steps."""
    log_path = ROOT / "results" / name / RUN_LOG
    log_event(log_path, event="start", hardware=hardware(), head=head_commit(), data=data,
              omp=os.environ.get("OMP_NUM_THREADS", "unset (torch default)"), jobs=jobs, argv=shlex.join(invocation))
    logs = ROOT / "logs" / name  # git-ignored

    def begin(step: Step, threads: str | None) -> None:
        print(f"\n=== {step.name}: {shlex.join(step.command)}"
              f"{f' (output: {(logs / log_name(step)).relative_to(ROOT)})' if jobs > 1 else ''}", flush=True)
        shown = shlex.join(["python", *step.command[1:]]).replace(str(ROOT) + "/", "")
        log_event(log_path, event="begin", step=step.name, command=shown, commit=head_commit(),
                  threads=threads or "torch default")

    def end(step: Step, status: int, seconds: float) -> None:
        log_event(log_path, event="end", step=step.name, seconds=round(seconds, 1), status=status)
        write_run_info(name, log_path, runs)
        if after_step is not None:
            after_step()
        if jobs > 1:
            print(f"=== {step.name}: {step_outcome(status)} after {seconds:.0f} s", flush=True)

    def skip(step: Step) -> None:  # done() found nothing left to do: no process, no rebuilt RUN_INFO.md
        print(f"=== {step.name}: nothing left to train or score; skipped", flush=True)
        log_event(log_path, event="skipped", step=step.name)

    return run_steps(steps, jobs, ROOT, logs, begin, end, skip, start_until)


def drive(script: str, folder: str, steps: list[Step], args, data, argv=None, after_step=None,
          experiments: tuple[str, ...] = ()) -> None:
    """A plan driver's main (scripts/<script>, make reproduce / make tasks): --dry-run prints the steps, --status
    what is finished, --report-only rebuilds RUN_INFO.md (then after_step()), else run_logged() runs them, with
    data() describing the data they read; failed steps end it with one line that says how to finish."""
    if args.dry_run:
        print("\n".join(f"{step.name}: {shlex.join(step.command[1:])}" for step in steps))
        return
    if args.status:
        print(plan_status(steps, ROOT))
        return
    # where the runs are: runs/<folder>/, or the folders of the experiments the plan's runs go to (the rerun check's)
    runs = [ROOT / args.runs / x for x in experiments] if experiments else ROOT / args.runs / folder
    if args.report_only:
        print(f"wrote {write_run_info(folder, ROOT / 'results' / folder / RUN_LOG, runs)}")
        if after_step is not None:
            after_step()
        return
    shown = argv if argv is not None else sys.argv[1:]
    invocation = ["python", f"scripts/{script}", *shown]
    minutes = getattr(args, "stop_starting_after", None)
    start_until = None if minutes is None else time.time() + 60 * minutes
    if failed := run_logged(folder, steps, args.jobs, runs, data(), invocation, after_step, start_until):
        sys.exit(f"error: step(s) {', '.join(repr(name) for name in failed)} failed; fix them and run "
                 f"`{shlex.join(invocation)}` again (finished runs and cells are kept and skipped)")
    print(f"\nwrote {ROOT / 'results' / folder / 'RUN_INFO.md'} and the tables")
