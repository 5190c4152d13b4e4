"""Whether a train or evaluate command has anything left to do, answered in-process with the apps' own checks.

A plan driver (make reproduce, make tasks) asks this before it starts a step's process: restarted late in a long
plan, it would otherwise start hundreds of processes that each import torch and compose a config (~7 s) only to
print "skipping". A train step is finished when its run folder holds a completed run trained with the command's
settings (check_same_run, as the app's reuse does) and, with train.evaluate_after, every cell it would score is in
the results from these weights (evaluation_pending, as the app's skip_done does); an evaluate step with
eval.skip_done=true when every cell is. Both after the app's own preflight (its check()), which reads only. Any
doubt answers "not finished", and the step then runs and says what it says: an error, a Hydra flag or a hydra.*
setting (another config, a sweep, a launcher, a job that changes its folder), a run folder that cannot be read.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator
from pathlib import Path

from omegaconf import OmegaConf

from .checkpoint import read_status
from .cli import output_dir
from .config import compose, to_job
from .eval import app
from .eval.evaluation import evaluation_pending
from .naming import custom_name
from .subjects import hf
from .train import NOT_MODEL_KEYS, check  # the train app's own preflight, its reuse check among them


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
    if any(a.startswith("-") or a.lstrip("+~").startswith("hydra") for a in args):
        return False  # Hydra's flags (-m, -cd, -cn, ...) and hydra.* / hydra/launcher=: not what compose() runs
    try:
        with working_dir(cwd), contextlib.redirect_stdout(io.StringIO()):  # the apps' notes belong to the step
            if app == "train":
                return trained_and_scored(args)
            if app == "eval":
                return scored(args)
    except Exception:  # noqa: BLE001 - the step's own process reports what is wrong, in one line
        return False
    return False


def trained_and_scored(args: list[str]) -> bool:
    cfg = compose("train", custom_name(list(args), NOT_MODEL_KEYS))  # name= as the app adds it: its folder
    job, run_dir = to_job(cfg), output_dir(cfg, multirun=False)
    if OmegaConf.select(cfg, "hydra.job.chdir"):
        return False  # relative paths would be read inside the job's folder
    if run_dir is None or job.train.resume is True or read_status(run_dir)["status"] != "completed":
        return False
    check(job, run_dir)  # device, data, writable folders, and check_same_run: a run trained with other settings
    if not os.access(run_dir, os.W_OK):
        return False  # train() refuses it
    return not job.train.evaluate_after or not evaluation_pending(run_dir, job.eval, job.paths.results,
                                                                  job.train.device)


def scored(args: list[str]) -> bool:
    job = to_job(compose("eval", list(args)))
    if not job.run or not job.eval.skip_done or hf.is_hf(job.run):
        return False
    app.check(job)  # device, run folder, writable results folder; raises as the app would
    return not evaluation_pending(Path(job.run), job.eval, job.results_root(), job.device, job.position)
