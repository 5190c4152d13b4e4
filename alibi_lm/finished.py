"""Whether a train or evaluate command has anything left to do, answered in-process with the apps' own checks.

A plan driver (make reproduce, make tasks) asks this before it starts a step's process: restarted late in a long
plan, it would otherwise start hundreds of processes that each import torch and compose a config (~7 s) only to
print "skipping". A train step is finished when its run folder holds a completed run trained with the command's
settings (check_same_run, as the app's reuse does) and, with train.evaluate_after, every cell it would score is in
the results from these weights (evaluation_pending, as the app's skip_done does); an evaluate step with
eval.skip_done=true when every cell is. Any doubt (an error, a setting these checks do not cover, a run folder
that cannot be read) answers "not finished": the step then runs, and says what it says.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from .checkpoint import read_status
from .cli import command_overrides, output_dir
from .config import compose, to_job
from .eval.evaluation import evaluation_pending


@contextlib.contextmanager
def working_dir(path: Path) -> Iterator[None]:
    """Relative paths (paths.runs, hydra.run.dir, run=) read as in a step's process, which starts in `path`."""
    before = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def finished(app: str, args: list[str], cwd: Path) -> bool:
    """Whether `python -m alibi_lm.<app> *args`, started in cwd, would find nothing to do (module docstring)."""
    try:
        with working_dir(cwd):
            if app == "train":
                return trained_and_scored(args)
            if app == "eval":
                return scored(args)
    except Exception:  # noqa: BLE001 - the step's own process reports what is wrong, in one line
        return False
    return False


def trained_and_scored(args: list[str]) -> bool:
    from .naming import custom_name
    from .train import NOT_MODEL_KEYS, check_same_run  # the train app's own reuse check

    cfg = compose("train", command_overrides(custom_name(list(args), NOT_MODEL_KEYS)))  # the folder it would use
    job, run_dir = to_job(cfg), output_dir(cfg, multirun=False)
    if run_dir is None or job.train.resume is True or read_status(run_dir)["status"] != "completed":
        return False
    check_same_run(job, run_dir)  # a run trained with other settings raises: the app refuses it in one line
    return not job.train.evaluate_after or not evaluation_pending(run_dir, job.eval, job.paths.results,
                                                                  job.train.device)


def scored(args: list[str]) -> bool:
    job = to_job(compose("evaluate", command_overrides(list(args))))
    if not job.run or not job.eval.skip_done or str(job.run).startswith("hf:"):
        return False
    return not evaluation_pending(Path(job.run), job.eval, job.paths.results, job.device, job.position)
