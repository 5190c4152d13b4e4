"""The rerun check: a committed run retrained by its own command with 1 and 2 threads, and the three exact matches
at every scored length compared by their Wilson intervals."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest
from conftest import REPO

from alibi_lm.errors import UserError
from alibi_lm.plans import task_rerun
from alibi_lm.results.task_learning import wilson
from alibi_lm.results.task_store import COLUMNS


def test_each_run_is_retrained_by_its_committed_command_with_one_and_two_threads():
    args = task_rerun.arguments(["--suite", "tasks-d718115", "flipflop-alibi-L64-seed1"])
    steps = task_rerun.plan(args)
    assert [s.name for s in steps] == ["train flipflop-alibi-L64-seed1 (1 thread)",
                                       "train flipflop-alibi-L64-seed1 (2 threads)"]
    for step, threads in zip(steps, (1, 2)):
        assert step.command[1:6] == ["-m", "alibi_lm.train", "task=flipflop", "position=alibi", "seed=1"]
        assert step.command[-5:] == [f"name=tasks-rerun-threads{threads}", "paths.results=results", "paths.runs=runs",
                                     f"train.threads={threads}", "train.resume=auto"]
        assert "name=tasks" not in step.command and "experiment=tasks" in step.command
    with pytest.raises(UserError, match=r"no committed rows of copy-nothing-L64-seed0 .*; name a run it holds \(its "
                                        r"run column, e.g. [\w+-]+-L64-seed\d\)$"):
        task_rerun.plan(task_rerun.arguments(["--suite", "tasks-d718115", "copy-nothing-L64-seed0"]))


def test_a_run_the_suite_does_not_hold_is_refused_in_one_line_with_exit_2():
    out = subprocess.run([sys.executable, "scripts/task_rerun.py", "--dry-run", "copy-nothing-L64-seed0"], cwd=REPO,
                         capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "no committed rows of copy-nothing" in out.stderr


def rows(folder, run: str, exact: dict[int, float], examples: int = 1000) -> list[dict]:
    return [dict(task="flipflop", task_options="", position="alibi", positions="sequential", train_len=64, eval_len=lv,
                 variant="", seed=0, run=f"runs/{folder}/{run}", exact=e, token_acc=e, examples=examples, commit="c",
                 device="cpu") for lv, e in exact.items()]


def test_the_report_sets_the_three_side_by_side_and_says_whether_their_intervals_overlap(tmp_path, monkeypatch):
    monkeypatch.setattr(task_rerun, "ROOT", tmp_path)
    run = "flipflop-alibi-L64-seed0"
    tables = {"tasks": {64: 1.0, 256: 0.90, 1024: 0.50, 128: 0.2, 96: 0.7},  # 1.5L is no length the suite scores
              "tasks-rerun-threads1": {64: 1.0, 256: 0.89, 1024: 0.30},
              "tasks-rerun-threads2": {64: 0.999, 256: 0.91}}  # 16L not scored yet
    for folder, exact in tables.items():
        (tmp_path / "results" / folder).mkdir(parents=True)
        pd.DataFrame(rows(folder, run, exact)).reindex(columns=COLUMNS).to_csv(
            tmp_path / "results" / folder / "tasks.csv", index=False)
    text = task_rerun.write_report("tasks", [run]).read_text()
    low, high = wilson(900, 1000)
    assert f"| {run} | 4L | 0.900 [{low:.3f}, {high:.3f}] |" in text and text.count("| agree |") == 2
    assert f"| {run} | 16L | 0.500" in text and text.rstrip().endswith("|  |")  # two of three: no verdict yet
    csv = pd.read_csv(tmp_path / "results" / "tasks-rerun" / "rerun.csv")
    assert sorted(set(csv["eval_len"])) == [64, 128, 256, 1024] and len(csv) == 9
    assert f"| {run} | 2L | 0.200" in text and text.count(f"| {run} | 1L |") == 1  # 96 (1.5L) not compared
    tables["tasks-rerun-threads2"][1024] = 0.31
    pd.DataFrame(rows("tasks-rerun-threads2", run, tables["tasks-rerun-threads2"])).reindex(columns=COLUMNS).to_csv(
        tmp_path / "results" / "tasks-rerun-threads2" / "tasks.csv", index=False)
    text = task_rerun.write_report("tasks", [run]).read_text()
    assert "| 16L |" in text and "| differ |" in text  # 0.50 against 0.30: intervals apart


def test_a_run_named_twice_is_refused(capsys):
    """Its reruns would train into the same two folders, each step twice."""
    with pytest.raises(SystemExit) as stopped:
        task_rerun.arguments(["--dry-run", "flipflop-alibi-L64-seed0", "copy-t5-L64-seed0", "flipflop-alibi-L64-seed0"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "flipflop-alibi-L64-seed0 is named twice; name each run once" in err


def test_a_report_of_some_runs_keeps_every_run_rerun_so_far(tmp_path, monkeypatch):
    """rerun.md is rebuilt from the reruns' folders: naming only the newly checked run (or none, --report-only)
    keeps the rows of the runs checked before."""
    monkeypatch.setattr(task_rerun, "ROOT", tmp_path)
    first, second = "flipflop-alibi-L64-seed0", "passkey-alibi-L64-seed0"
    for folder in ("tasks", "tasks-rerun-threads1", "tasks-rerun-threads2"):
        (tmp_path / "results" / folder).mkdir(parents=True)
        pd.DataFrame(rows(folder, first, {64: 1.0}) + rows(folder, second, {64: 0.9})).reindex(columns=COLUMNS).to_csv(
            tmp_path / "results" / folder / "tasks.csv", index=False)
    other = "copy-t5-L64-seed0"  # rerun from another suite (--suite tasks-probe): not compared with this one's rows
    pd.DataFrame(rows("tasks-rerun-threads1", other, {64: 0.5})).reindex(columns=COLUMNS).to_csv(
        tmp_path / "results" / "tasks-rerun-threads1" / "tasks.csv", mode="a", header=False, index=False)
    for names in ([second], []):
        text = task_rerun.write_report("tasks", names).read_text()
        assert f"| {first} | 1L |" in text and f"| {second} | 1L |" in text and other not in text
    assert task_rerun.arguments(["--report-only"]).names == []


def test_training_needs_a_run_to_train(capsys):
    with pytest.raises(SystemExit) as stopped:
        task_rerun.arguments([])
    assert stopped.value.code == 2 and "name at least one committed run" in capsys.readouterr().err
