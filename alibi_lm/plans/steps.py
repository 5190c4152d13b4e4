"""Run a plan of steps (subprocesses) in order, up to `jobs` at a time: what make reproduce and make budget-probes share.

A step that trains a run folder declares it (`makes`); a step that evaluates or probes one declares it too
(`needs`) and starts only once the step that makes it has ended well. A `barrier` step (the report) waits for
every step before it. With jobs > 1 the steps split the CPU cores between them (OMP_NUM_THREADS = cores // jobs
unless it is set) and write their output to log files, as two processes would otherwise interleave their lines.
On 2 cores, two 1-thread processes trained the tiny model ~1.3x faster in total than one 2-thread process: its
matrices are too small to keep two threads busy. A train or evaluate step that would find nothing left to do
(alibi_lm.finished, asked in this process when the step is due) is skipped without a process.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from alibi_lm.checkpoint import STATUS
from alibi_lm.finished import finished
from alibi_lm.stopping import INTERRUPTED_EXIT, exit_status_after, stop_requests

POLL_S = 1.0  # how often the running steps are checked: steps take minutes


@dataclass
class Step:
    name: str
    command: list[str]
    makes: str | None = None  # the run folder this step trains
    needs: tuple[str, ...] = ()  # run folders that must be trained before this step starts
    barrier: bool = False  # starts only when every earlier step has ended
    done: Callable[[], bool] | None = None  # asked when the step is due: True skips it (default: app_finished)


APPS = {"alibi_lm.train": "train", "alibi_lm.eval": "eval"}  # the apps alibi_lm.finished answers for


def trained_run_finished(command: list[str], run_dir: Path, cwd: Path) -> Callable[[], bool]:
    """Step.done for the step that trains run_dir (relative to cwd): not finished, without composing its config
    (~0.3 s), while the folder has no status.json (a run never started); else app_finished."""
    return lambda: (cwd / run_dir / STATUS).is_file() and app_finished(command, cwd)


def app_of(command: list[str]) -> str | None:
    """The app alibi_lm.finished answers for that `python -m alibi_lm.<app> ...` runs (train, eval), else None."""
    return APPS.get(command[2]) if command[1:2] == ["-m"] and len(command) > 2 else None


def is_done(step: Step, cwd: Path) -> bool:
    """Whether a due step may be skipped: its own done(), else app_finished."""
    return step.done() if step.done is not None else app_finished(step.command, cwd)


def app_finished(command: list[str], cwd: Path) -> bool:
    """Whether a train or evaluate command would find nothing to do (alibi_lm.finished, in this process: no
    process per finished run when a long plan is restarted); False for any other command."""
    if (app := app_of(command)) is None:
        return False
    return finished(app, command[3:], cwd)


def threads_per_job(jobs: int) -> str:
    """OMP_NUM_THREADS for each step: the user's, else the cores split between the jobs (None with one job)."""
    if "OMP_NUM_THREADS" in os.environ or jobs == 1:
        return os.environ.get("OMP_NUM_THREADS")
    return str(max(1, (os.cpu_count() or 1) // jobs))


def plan_status(steps: list[Step], cwd: Path) -> str:
    """--status: how many train and evaluate steps are finished (app_finished, as a restart would skip them) and
    the first of those left; the other steps (probes, the report) run whenever the plan does, doing what is left."""
    checked = [s for s in steps if app_of(s.command) is not None]
    # disable=None: a bar on a terminal only, not hundreds of carriage-return frames in a log file
    left = [s.name for s in tqdm(checked, desc="checking", unit="step", leave=False, disable=None)
            if not is_done(s, cwd)]
    lines = [f"{len(checked) - len(left)} of {len(checked)} train and evaluate steps finished, {len(left)} left "
             f"(a step under way counts as left)"]
    lines += [f"  next: {name}" for name in left[:5]] + ([f"  ... and {len(left) - 5} more"] if left[5:] else [])
    if other := len(steps) - len(checked):
        lines.append(f"{other} other step(s) (probes, the report) run each time the plan does and skip what is done")
    return "\n".join(lines)


def log_name(step: Step) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", step.name).strip("_") + ".log"


def past_the_start_limit(pending: list[Step], running: list[Step], made: set[str]) -> list[Step]:
    """The pending steps that may no longer start once no training may (run_steps' start_until): the trainings,
    and the steps on runs neither trained nor being trained. What stays: the evaluations and probes of the runs
    trained (so the plan ends with whole runs) and the report, which then waits only for those."""
    making = {step.makes for step in running if step.makes}
    return [step for step in pending if step.makes or (not step.barrier and not set(step.needs) <= made | making)]


def _ready(step: Step, order: list[Step], open_steps: list[Step], running: list[Step], made: set[str]) -> bool:
    """Whether `step` may start: a barrier once every earlier step has ended; another step once the runs it
    needs are trained and no running step uses them (one reader of a run's rows and plots at a time)."""
    if step.barrier:
        return all(order.index(s) >= order.index(step) for s in open_steps)
    makers = {s.makes for s in order if s.makes}
    if any(set(step.needs) & {r.makes, *r.needs} for r in running):
        return False
    return all(run in made or run not in makers for run in step.needs)  # a folder no step makes: already there


def run_steps(steps: list[Step], jobs: int, cwd: Path, logs: Path | None, begin: Callable[[Step, str | None], None],
              end: Callable[[Step, int, float], None], skip: Callable[[Step], None] = lambda step: None,
              start_until: float | None = None) -> list[str]:
    """Run `steps` (each once), up to `jobs` at a time, the earliest ready one first; begin(step, threads) before
    and end(step, exit status, seconds) after each; a step whose done() says it has nothing left to do is not
    started: skip(step) instead. After a failure no new step starts; returns the failed names.
    A stop signal (SIGTERM, SIGUSR1/2) is passed to the running steps, which save what they did; no new step
    starts, and once they have ended, one line and exit status 75: the same command continues. Past start_until
    (a time.time()), no training starts: the running steps finish, then the evaluations of the runs trained and
    the report (past_the_start_limit), so that a job with a time limit ends with whole runs, every row of each,
    and their tables; then the same line and exit status."""
    with stop_requests() as stop:
        failed, left = _run_plan(steps, jobs, cwd, logs, begin, end, skip, stop, start_until)
    if stop.signal is not None:
        print(f"error: stopped by {stop.name}; every finished step is kept, and the same command runs the rest",
              file=sys.stderr)
        sys.exit(exit_status_after(stop.signal))  # 130 after Ctrl-C, 75 after a scheduler's signal
    if left and not failed:
        print(f"error: {len(left)} step(s) not started: the time to start trainings (--stop-starting-after) is over; "
              f"every finished step is kept, and the same command runs the rest", file=sys.stderr)
        sys.exit(INTERRUPTED_EXIT)
    return failed


def _run_plan(steps, jobs, cwd, logs, begin, end, skip, stop, start_until=None) -> tuple[list[str], list[Step]]:
    threads = threads_per_job(jobs)
    env = {**os.environ, "OMP_NUM_THREADS": threads} if threads else None
    pending, running, made, failed, passed_on, left = list(steps), {}, set(), [], False, []
    while pending or running:
        if stop.signal is not None and not passed_on:  # each running step stops as it would on its own
            for proc in running:
                proc.send_signal(stop.signal)
            passed_on = True
        if start_until is not None and time.time() >= start_until:
            for step in past_the_start_limit(pending, [step for step, _, _ in running.values()], made):
                pending.remove(step)
                left.append(step)
        while not failed and stop.signal is None and len(running) < jobs:
            busy = [step for step, _, _ in running.values()]
            step = next((s for s in pending if _ready(s, steps, pending + busy, busy, made)), None)
            if step is None:
                break
            pending.remove(step)
            if is_done(step, cwd):
                skip(step)
                if step.makes:
                    made.add(step.makes)
                continue
            begin(step, threads)
            out = None
            if jobs > 1 and logs is not None:  # each step's own log: two processes' lines would interleave
                logs.mkdir(parents=True, exist_ok=True)
                out = open(logs / log_name(step), "a")
            proc = subprocess.Popen(step.command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT if out else None)
            running[proc] = (step, time.perf_counter(), out)
        if not running:
            break  # failed, past start_until, or nothing ready (a step needs a folder whose maker failed)
        time.sleep(POLL_S)
        for proc in [p for p in running if p.poll() is not None]:
            step, started, out = running.pop(proc)
            if out is not None:
                out.close()
            end(step, proc.returncode, time.perf_counter() - started)
            if proc.returncode == 0 and step.makes:
                made.add(step.makes)
            elif proc.returncode != 0:
                failed.append(step.name)
    return failed, left + pending
