"""--commit of the task suite: results/<name>/ as it stands, less the rows of runs still under way.

With --jobs 2, one run is training or being scored while the other run's step ends. Committing the folder as it
stands would commit the first run's rows part-way (its curve so far, some cells), and reports (tasks.md, its plots,
training.md, RUN_INFO.md's cost table) that count them. The commit is made instead from a copy of the folder without
the rows of runs whose step is under way (RUN_LOG.jsonl: begun and not ended well: running, stopped or failed), with
the reports rebuilt from that copy, through an index of its own, on top of the HEAD it was made from. The working
tree keeps every row, so a run under way goes on where it is; nothing else staged or changed in the checkout is
committed."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pandas as pd

from alibi_lm.checkpoint import LOCK_FILE, atomic_write_text, is_temporary
from alibi_lm.errors import UserError
from alibi_lm.results.learned_values import LEARNED_CSV, read_learned
from alibi_lm.results.retrieval_store import RETRIEVAL_CSV, read_retrieval
from alibi_lm.results.store import drop_rows
from alibi_lm.results.task_report import REPORT_FILES, build_task_report
from alibi_lm.results.task_store import OVER_TRAINING_CSV, TASKS_CSV, read_over_training, read_task_results
from alibi_lm.training.run_log import RUN_LOG, steps_under_way

from .run_record import RUN_INFO, cost_row_runs, run_info
from .training_curves import TRAINING_CSV, TRAINING_MD, read_training_csv, training_report

# the tables a run's step writes rows to (training.csv its curve so far, then learned.csv, before its cells), each
# with its reader; their `run` column is runs/<name>/<run> (training.csv's: <run>)
RUN_TABLES = {TASKS_CSV: read_task_results, OVER_TRAINING_CSV: read_over_training, RETRIEVAL_CSV: read_retrieval,
              LEARNED_CSV: read_learned, TRAINING_CSV: read_training_csv}
NO_RUN_FOLDERS = "no run folders"  # run_info's runs folder for the copy: none, so every cost row comes from RUN_INFO.md
NO_COMMIT = "0" * 40  # update-ref's old value for a branch with no commit yet


def runs_under_way(folder: Path) -> set[str]:
    """The runs of folder whose training step (training, then its cells, kept checkpoints and retrieval) is under way."""
    log = folder / RUN_LOG
    steps = steps_under_way(log) if log.is_file() else frozenset()
    return {step.removeprefix("train ") for step in steps if step.startswith("train ")}


def of_runs(runs: set[str]):
    """drop_rows's test: the rows whose run folder is named in runs."""
    return lambda df: df["run"].astype(str).map(lambda path: Path(path).name).isin(runs)


def runs_in(table: Path) -> set[str]:
    """The runs a table has rows of, read from its run column alone (the whole table is read, and checked against
    its schema, only where rows are to be dropped)."""
    try:
        return set(pd.read_csv(table, usecols=["run"], dtype=str)["run"].dropna().map(lambda path: Path(path).name))
    except (pd.errors.EmptyDataError, ValueError):  # no rows at all, or no run column: nothing of any run
        return set()


def files_to_commit(root: Path, folder: Path) -> list[str]:
    """The files of folder (relative to root) that `git add` would take, tracked or not ignored, less the
    temporaries of writers still at work (renamed over their table when done)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", str(folder)],
                            cwd=root, capture_output=True, text=True).stdout.split("\0")
    return sorted({path for path in listed if path and not is_temporary(Path(path).name)})


def finished_copy(root: Path, folder: Path, into: Path) -> list[str]:
    """Copy folder's files (files_to_commit) to into/, the same paths under it, less the rows of its runs under way
    (and their cost rows in RUN_INFO.md); the reports are rebuilt from the rows left (removed where none are left).
    The runs whose rows were left out."""
    for path in files_to_commit(root, folder):  # each table is replaced whole (atomic_write_text): no lock needed
        (into / path).parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copy2(root / path, into / path)
        except FileNotFoundError:  # deleted since it was listed: not in the commit either
            pass
    copy = into / folder
    under_way = runs_under_way(copy)
    found = rows_of_runs_under_way(copy, under_way)
    left_out = {run for _, run in found}
    for table in sorted({table for table, _ in found}):
        drop_rows(copy / table, RUN_TABLES[table], of_runs(left_out))
    if left_out:
        for pattern in REPORT_FILES:  # a plot of a task only the runs under way have is not left behind
            for stale in copy.glob(pattern):
                stale.unlink()
        if (copy / TASKS_CSV).is_file() and runs_in(copy / TASKS_CSV):
            build_task_report(copy)
        if (copy / TRAINING_CSV).is_file():  # the curves, and evaluation minutes, of the finished runs alone
            atomic_write_text(copy / TRAINING_MD, training_report(copy))
    # RUN_INFO.md's cost rows: of the finished runs alone (a run under way has one from its status.json, written at
    # its start, before it has a row anywhere else), from the RUN_INFO.md just written: no run folder is read
    previous = (copy / RUN_INFO).read_text() if (copy / RUN_INFO).is_file() else ""
    if costed := cost_row_runs(previous) & under_way:
        left_out |= costed
        atomic_write_text(copy / RUN_INFO, run_info(folder.name, copy / RUN_LOG, copy / NO_RUN_FOLDERS, previous,
                                                    frozenset(under_way)))
    for lock in copy.rglob(LOCK_FILE):  # left by the copy's own writers: not a result
        lock.unlink()
    return sorted(left_out)


def git(root: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, env=env, capture_output=True, text=True)


def commit_copy(root: Path, folder: Path, message: str, tmp: Path) -> str | None:
    """Commit folder as finished_copy makes it on top of the HEAD it was read from: None when committed (or
    nothing was new), else why not. update-ref moves HEAD only if it is still that commit, so a commit made
    meanwhile by anyone else is never undone: this one is refused and made again on top of it."""
    head = git(root, "rev-parse", "--verify", "-q", "HEAD").stdout.strip()
    env = {**os.environ, "GIT_INDEX_FILE": str(tmp / "index")}
    if git(root, "read-tree", *([head] if head else ["--empty"]), env=env).returncode:
        return "git read-tree failed"
    left_out = finished_copy(root, folder, tmp / "tree")
    if git(root, "--work-tree", str(tmp / "tree"), "add", "-A", "--", str(folder), env=env).returncode:
        return f"git add of {folder} failed"
    tree = git(root, "write-tree", env=env).stdout.strip()
    if head and tree == git(root, "rev-parse", f"{head}^{{tree}}").stdout.strip():
        return None  # nothing new
    if left_out:
        message += f" (without the rows of {', '.join(left_out)}: under way)"
    made = git(root, "commit-tree", tree, *(["-p", head] if head else []), "-m", message)
    if made.returncode:
        return f"git commit-tree failed: {made.stderr.strip()}"
    moved = git(root, "update-ref", "-m", f"commit: {message}", "HEAD", made.stdout.strip(), head or NO_COMMIT)
    return f"HEAD moved while {folder} was copied" if moved.returncode else None


def commit_finished(root: Path, folder: Path, message: str) -> str | None:
    """Commit folder (relative to root) without the rows of runs under way (commit_copy), then bring the checkout's
    index to the new commit for that folder alone (its working tree untouched). None when done, else why not; a
    damaged table or a file it cannot read is a reason, not a crash of the suite."""
    with tempfile.TemporaryDirectory(prefix="finished-commit-") as tmp:
        try:
            why = commit_copy(root, folder, message, Path(tmp))
        except (OSError, UserError) as e:
            why = str(e)
    if why is None and git(root, "reset", "-q", "--", str(folder)).returncode:
        return (f"committed, but the index could not be brought to the commit (busy); before committing anything "
                f"else, run: git reset -q -- {folder}")
    return why


def rows_of_runs_under_way(folder: Path, under_way: set[str] | None = None) -> list[tuple[str, str]]:
    """(table, run) for each table of folder (RUN_TABLES) holding rows of a run whose step is under way (under_way,
    else runs_under_way(folder)): none in a commit of the suite's."""
    under_way, found = runs_under_way(folder) if under_way is None else under_way, []
    for table in RUN_TABLES:
        if (folder / table).is_file():
            found += [(table, run) for run in sorted(runs_in(folder / table) & under_way)]
    return found
