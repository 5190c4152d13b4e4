"""The rerun check: a committed run retrained by its own command with 1 and 2 threads, and the three exact matches
at every scored length compared by their Wilson intervals."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import REPO
from forked_app import run_python

from alibi_lm.errors import UserError
from alibi_lm.plans import task_rerun
from alibi_lm.results.task_learning import wilson
from alibi_lm.results.task_store import COLUMNS, OVER_COLUMNS


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
                                        r"run column, e.g. [\w+-]+-L64-seed\d\) or a cell's runs without their "
                                        r"seed \(e.g. [\w+-]+-L64\)$"):
        task_rerun.plan(task_rerun.arguments(["--suite", "tasks-d718115", "copy-nothing-L64-seed0"]))


def test_a_rerun_keeps_the_weights_its_committed_run_kept():
    """The committed command's keep interval stays in the rerun's: its kept weights are scored over training too, so
    the rerun's course past L can be set beside the committed one's, not its last checkpoint alone."""
    steps = task_rerun.plan(task_rerun.arguments(["--threads", "2", "passkey-t5-L64-seed0"]))
    assert [s.name for s in steps] == ["train passkey-t5-L64-seed0 (2 threads)"]
    assert "train.keep_checkpoints_every=1000" in steps[0].command and "train.max_steps=8000" in steps[0].command


def test_a_run_the_suite_does_not_hold_is_refused_in_one_line_with_exit_2():
    out = run_python(["scripts/task_rerun.py", "--dry-run", "copy-nothing-L64-seed0"], cwd=REPO)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "no committed rows of copy-nothing" in out.stderr


def rows(folder, run: str, exact: dict[int, float], examples: int = 1000, task: str = "flipflop", seed: int = 0,
         token_acc: dict[int, float] | None = None) -> list[dict]:
    return [dict(task=task, task_options="", position="alibi", positions="sequential", train_len=64, eval_len=lv,
                 variant="", seed=seed, run=f"runs/{folder}/{run}", exact=e, token_acc=(token_acc or exact)[lv],
                 examples=examples, answers=4 * examples, commit="c", device="cpu") for lv, e in exact.items()]


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
    text = task_rerun.write_report("tasks", [run]).read_text().split("## The suite's table")[0]  # the runs' own cells
    low, high = wilson(900, 1000)
    assert f"| {run} | 4L | 0.900 [{low:.3f}, {high:.3f}] |" in text and text.count("| agree |") == 2
    # 16L not scored by the 2-thread rerun yet: a blank, the verdict over the intervals there (0.50 against 0.30)
    assert text.rstrip().endswith(f"| {run} | 16L | 0.500 [0.469, 0.531] | 0.300 [0.272, 0.329] |  | differ |")
    csv = pd.read_csv(tmp_path / "results" / "tasks-rerun" / "rerun.csv")
    assert sorted(set(csv["eval_len"])) == [64, 128, 256, 1024] and len(csv) == 9
    assert f"| {run} | 2L | 0.200" in text and text.count(f"| {run} | 1L |") == 1  # 96 (1.5L) not compared
    tables["tasks-rerun-threads2"][1024] = 0.31
    pd.DataFrame(rows("tasks-rerun-threads2", run, tables["tasks-rerun-threads2"])).reindex(columns=COLUMNS).to_csv(
        tmp_path / "results" / "tasks-rerun-threads2" / "tasks.csv", index=False)
    text = task_rerun.write_report("tasks", [run]).read_text().split("## The suite's table")[0]
    assert "| 16L |" in text and "| differ |" in text  # 0.50 against 0.30: intervals apart


def test_the_suites_table_is_shown_with_each_rerun_in_its_seeds_place(tmp_path, monkeypatch):
    """The main table's cell over seeds (mean, the wider of the t interval and the pooled Wilson), as committed and
    with each rerun's value in place of the run's seed; in the table's metric (answer-token accuracy for flip-flop,
    its answers the trials); *holds* while every such mean stays inside the committed interval."""
    monkeypatch.setattr(task_rerun, "ROOT", tmp_path)
    run = "passkey-alibi-L64-seed0"
    committed = [(0, {64: 1.0, 1024: 0.5}), (1, {64: 1.0, 1024: 0.9}), (2, {64: 1.0, 1024: 0.1})]
    folders = {"tasks": [r for seed, exact in committed for r in rows("tasks", run.replace("seed0", f"seed{seed}"),
                                                                     exact, task="passkey", seed=seed)],
               "tasks-rerun-threads1": rows("tasks-rerun-threads1", run, {64: 1.0, 1024: 0.5}, task="passkey"),
               "tasks-rerun-threads2": rows("tasks-rerun-threads2", run, {64: 0.9, 1024: 0.3}, task="passkey")}
    for folder, table in folders.items():
        (tmp_path / "results" / folder).mkdir(parents=True)
        pd.DataFrame(table).reindex(columns=COLUMNS).to_csv(tmp_path / "results" / folder / "tasks.csv", index=False)
    task_rerun.write_report("tasks", [run])
    cells = pd.read_csv(tmp_path / "results" / "tasks-rerun" / "rerun_table.csv").set_index(["eval_len", "source"])
    t = 4.302653  # t(0.975, 2 degrees of freedom)
    for source, values in (("committed seeds", [0.5, 0.9, 0.1]), ("2 threads in its place", [0.3, 0.9, 0.1])):
        mean, half = sum(values) / 3, t * pd.Series(values).std() / 3 ** 0.5
        cell = cells.loc[(1024, source)]
        assert cell["mean"] == pytest.approx(mean) and cell["seeds"] == 3 and cell["metric"] == "exact"
        assert (cell["low"], cell["high"]) == pytest.approx((max(0.0, mean - half), min(1.0, mean + half)))
    text = (tmp_path / "results" / "tasks-rerun" / "rerun.md").read_text().split("## The suite's table")[1]
    assert f"| {run} | 16L | exact | 0.50 [0.00, 1.00] (n=3) | 0.50 [0.00, 1.00] (n=3) | 0.43 [0.00, 1.00] (n=3) | no test |" \
        in text  # three seeds that disagree: an interval of all of [0, 1], which no rerun could leave
    low = wilson(3000, 3000)[0]  # at L every committed seed is at 1.0: the pooled Wilson interval alone
    assert f"| {run} | 1L | exact | 1.00 [{low:.2f}, 1.00] (n=3) | 1.00 [{low:.2f}, 1.00] (n=3) |" in text
    line = next(line for line in text.splitlines() if line.startswith(f"| {run} | 1L |"))
    swapped_low = 0.9666667 - t * pd.Series([0.9, 1.0, 1.0]).std() / 3 ** 0.5  # wider than the pooled Wilson's
    assert line.endswith(f"| 0.97 [{swapped_low:.2f}, 1.00] (n=3) | moves |")  # the 2-thread rerun's 0.9: below it
    flipflop = "flipflop-alibi-L64-seed0"  # its answers grow with Lv: answer-token accuracy, answers the trials
    for folder, acc in (("tasks", 0.8), ("tasks-rerun-threads1", 0.8), ("tasks-rerun-threads2", 0.7)):
        pd.DataFrame(rows(folder, flipflop, {1024: 0.0}, token_acc={1024: acc})).reindex(columns=COLUMNS).to_csv(
            tmp_path / "results" / folder / "tasks.csv", mode="a", header=False, index=False)
    task_rerun.write_report("tasks", [flipflop])
    cells = pd.read_csv(tmp_path / "results" / "tasks-rerun" / "rerun_table.csv")
    mine = cells[cells["run"] == flipflop].set_index("source")
    assert set(mine["metric"]) == {"token_acc"} and mine.loc["2 threads in its place", "mean"] == pytest.approx(0.7)
    assert (mine.loc["committed seeds", "low"], mine.loc["committed seeds", "high"]) == pytest.approx(wilson(3200, 4000))


def test_threads_chooses_which_reruns_are_trained(capsys):
    """--threads 2 trains the rerun whose float reductions differ from the suite's one-thread runs alone (the
    one-thread rerun reproduces the committed weights bit for bit); a count the check has no folder for is refused."""
    args = task_rerun.arguments(["--suite", "tasks-d718115", "--threads", "2", "flipflop-alibi-L64-seed1"])
    steps = task_rerun.plan(args)
    assert [step.name for step in steps] == ["train flipflop-alibi-L64-seed1 (2 threads)"]
    assert "train.threads=2" in steps[0].command
    with pytest.raises(SystemExit) as stopped:
        task_rerun.arguments(["--threads", "4", "flipflop-alibi-L64-seed1"])
    assert stopped.value.code == 2 and "--threads takes thread counts of 1,2" in capsys.readouterr().err


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


def kept(folder: str, run: str, seed: int, course: dict[int, dict[int, float]], positions: str = "sequential"
         ) -> list[dict]:
    """over_training.csv rows of one run: step -> (Lv -> exact), passkey at L = 64."""
    return [dict(task="passkey", task_options="", position="t5", positions=positions, train_len=64, seed=seed,
                 step=step, eval_len=lv, exact=e, token_acc=e, examples=1024, run=f"runs/{folder}/{run}", commit="c",
                 device="cpu") for step, cells in course.items() for lv, e in cells.items()]


def test_a_rerun_that_kept_weights_is_set_beside_its_runs_course_and_the_seeds_distance(tmp_path, monkeypatch):
    """rerun_course.csv: at the kept steps both have, the mean |committed - rerun| beside the mean |seed - seed| over
    every pair of the committed seeds of the cell, and each course's mean over the last quarter of training; a rerun
    without kept weights (the 1-thread one here) has no row, and a report with none has no such part."""
    monkeypatch.setattr(task_rerun, "ROOT", tmp_path)
    run = "passkey-t5-L64-seed0"
    seeds = {0: {1000: {256: 0.2}, 2000: {256: 0.8}, 3000: {256: 0.6}, 4000: {256: 0.4}},
             1: {1000: {256: 0.0}, 2000: {256: 0.1}, 3000: {256: 0.1}, 4000: {256: 0.2}},
             2: {1000: {256: 0.5}, 2000: {256: 0.5}, 3000: {256: 0.9}, 4000: {256: 1.0}}}
    rerun = {500: {256: 0.7}, 1000: {256: 0.2}, 2000: {256: 0.9}, 4000: {256: 0.9}}  # 500 and 3000: not in both
    over = [r for s, course in seeds.items() for r in kept("tasks", run.replace("seed0", f"seed{s}"), s, course)]
    over += kept("tasks", "passkey-t5-random-L64-seed0", 0, {1000: {256: 1.0}, 2000: {256: 1.0}, 4000: {256: 1.0}},
                 positions="random-1024")  # another cell: not one of the seeds
    over += kept("tasks", "passkey-t5-L64-seed3", 3, {3000: {256: 0.9}})  # a seed with no value at the steps compared
    for folder, table, over_rows in (("tasks", rows("tasks", run, {64: 1.0, 256: 0.4}, task="passkey"), over),
                                     ("tasks-rerun-threads1", rows("tasks-rerun-threads1", run, {64: 1.0, 256: 0.4},
                                                                   task="passkey"), []),
                                     ("tasks-rerun-threads2", rows("tasks-rerun-threads2", run, {64: 1.0, 256: 0.9},
                                                                   task="passkey"), kept("tasks-rerun-threads2", run, 0, rerun))):
        (tmp_path / "results" / folder).mkdir(parents=True)
        pd.DataFrame(table).reindex(columns=COLUMNS).to_csv(tmp_path / "results" / folder / "tasks.csv", index=False)
        if over_rows:
            pd.DataFrame(over_rows).reindex(columns=OVER_COLUMNS).to_csv(
                tmp_path / "results" / folder / "over_training.csv", index=False)
    text = task_rerun.write_report("tasks", [run]).read_text()
    (row,) = pd.read_csv(tmp_path / "results" / "tasks-rerun" / "rerun_course.csv").itertuples()
    steps = (1000, 2000, 4000)
    pairs = [(0, 1), (0, 2), (1, 2)]
    seed_gap = sum(abs(seeds[a][s][256] - seeds[b][s][256]) for s in steps for a, b in pairs) / (3 * len(pairs))
    assert (row.run, row.eval_len, row.rerun, row.steps, row.seeds) == (run, 256, "2 threads", 3, 3)
    assert row.rerun_gap == pytest.approx((0.0 + 0.1 + 0.5) / 3) and row.seed_gap == pytest.approx(seed_gap)
    assert row.committed_late == pytest.approx((0.6 + 0.4) / 2) and row.rerun_late == pytest.approx(0.9)  # >= 3000
    assert f"| {run} | 4L | exact | 2 threads | 3 | 0.20 | {seed_gap:.2f} (n=3) | 0.50 | 0.90 |" in text
    assert (tmp_path / "results" / "tasks-rerun" / f"rerun-course-{run}.png").stat().st_size > 0
    (tmp_path / "results" / "tasks-rerun-threads2" / "over_training.csv").unlink()
    assert "## Over training" not in task_rerun.write_report("tasks", [run]).read_text()


def test_a_cell_whose_seeds_were_trained_again_is_set_against_the_same_seeds_as_committed(tmp_path, monkeypatch):
    """rerun_cells.csv and rerun.md's fourth part: a main-table cell with two or more seeds trained again with one
    thread count, over those seeds as committed and over their reruns (mean, the t interval over seeds or the pooled
    Wilson, the wider); a seed the suite added without a rerun is in neither; a thread count that retrained one seed
    gives no row, nor does a cell of one seed; *holds* says whether the retrained mean lies inside the committed
    interval."""
    monkeypatch.setattr(task_rerun, "ROOT", tmp_path)
    runs = [f"passkey-nope-L64-seed{s}" for s in range(4)]
    committed, threads2 = [0.5, 0.9, 0.1, 0.7], [0.2, 0.3, 0.1]  # seed 3: committed, never rerun
    folders = {"tasks": [r for s, (run, e) in enumerate(zip(runs, committed))
                         for r in rows("tasks", run, {64: 1.0, 256: e}, task="passkey", seed=s)],
               "tasks-rerun-threads1": rows("tasks-rerun-threads1", runs[0], {64: 1.0, 256: 0.5}, task="passkey"),
               "tasks-rerun-threads2": [r for s, (run, e) in enumerate(zip(runs, threads2))
                                        for r in rows("tasks-rerun-threads2", run, {64: 1.0, 256: e}, task="passkey",
                                                      seed=s)]}
    for folder in ("tasks", "tasks-rerun-threads2"):  # a cell of one seed, retrained: the per-run parts' alone
        folders[folder] += rows(folder, "copy-alibi-L64-seed0", {64: 1.0, 256: 0.5}, task="copy")
    for folder, table in folders.items():
        (tmp_path / "results" / folder).mkdir(parents=True)
        pd.DataFrame(table).reindex(columns=COLUMNS).to_csv(tmp_path / "results" / folder / "tasks.csv", index=False)
    text = task_rerun.write_report("tasks", [*runs[:3], "copy-alibi-L64-seed0"]).read_text().split(
        "## A table cell with its seeds trained again")[1]
    cells = pd.read_csv(tmp_path / "results" / "tasks-rerun" / "rerun_cells.csv", dtype={"seed_set": str})
    assert set(cells["source"]) == {"committed seeds", "retrained, 2 threads"}
    assert set(zip(cells["cell"], cells["seed_set"])) == {("passkey-nope-L64", "0,1,2")}
    t = 4.302653  # t(0.975, 2 degrees of freedom)
    for source, values in (("committed seeds", committed[:3]), ("retrained, 2 threads", threads2)):
        mean, half = sum(values) / 3, t * pd.Series(values).std() / 3 ** 0.5
        cell = cells[(cells["source"] == source) & (cells["eval_len"] == 256)].iloc[0]
        assert cell["mean"] == pytest.approx(mean) and cell["seeds"] == 3  # t to 3 decimals in the code's table:
        assert (cell["low"], cell["high"]) == pytest.approx((max(0.0, mean - half), min(1.0, mean + half)), abs=1e-4)
    assert "| passkey-nope-L64 | 0,1,2 | 4L | exact | 0.50 [0.00, 1.00] (n=3) | 0.20 [0.00, 0.45] (n=3) | 2 threads " \
           "| no test |" in text  # committed over [0, 1]: the check cannot fail there
    low = wilson(3000, 3000)[0]  # every seed at 1.0 at L: the pooled Wilson interval, and the reruns' the same
    assert f"| passkey-nope-L64 | 0,1,2 | 1L | exact | 1.00 [{low:.2f}, 1.00] (n=3) | 1.00 [{low:.2f}, 1.00] (n=3) " \
           "| 2 threads | holds |" in text


def test_a_cell_named_without_its_seed_retrains_every_committed_seed_of_it(capsys):
    """flipflop-t5-L64 names every committed seed of that cell, in seed order; a run named on its own as well is
    refused in one line with exit 2; a name that matches nothing is refused as before."""
    assert task_rerun.named_runs("tasks-d718115", ["flipflop-t5-L64", "copy-alibi-L64-seed0"]) == [
        "flipflop-t5-L64-seed0", "flipflop-t5-L64-seed1", "flipflop-t5-L64-seed2", "copy-alibi-L64-seed0"]
    with pytest.raises(UserError, match=r"^flipflop-t5-L64-seed1 is named twice \(on its own and in its cell"):
        task_rerun.named_runs("tasks-d718115", ["flipflop-t5-L64", "flipflop-t5-L64-seed1"])
    assert task_rerun.named_runs("tasks-d718115", ["copy-nothing-L64"]) == ["copy-nothing-L64"]
    with pytest.raises(SystemExit) as e:
        task_rerun.main(["--suite", "tasks-d718115", "--dry-run", "flipflop-t5-L64", "flipflop-t5-L64-seed1"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "named twice" in err


def test_a_cells_seeds_are_taken_in_seed_order_and_a_run_of_that_very_name_stays_itself(tmp_path, monkeypatch):
    """Seeds in numeric order (seed10 after seed2); a name that is a committed run is that run, even when other runs
    carry it with a seed; a folder without such runs leaves the name as given (refused later, as before)."""
    monkeypatch.setattr(task_rerun, "ROOT", tmp_path)
    (tmp_path / "results" / "tasks").mkdir(parents=True)
    held = ["copy-t5-L64-seed10", "copy-t5-L64-seed2", "copy-t5-L64-seed1", "copy-t5-L64x-seed0", "odd-L64",
            "odd-L64-seed0"]
    pd.DataFrame([r for run in held for r in rows("tasks", run, {64: 1.0}, task="copy")]).reindex(
        columns=COLUMNS).to_csv(tmp_path / "results" / "tasks" / "tasks.csv", index=False)
    assert task_rerun.named_runs("tasks", ["copy-t5-L64"]) == ["copy-t5-L64-seed1", "copy-t5-L64-seed2",
                                                              "copy-t5-L64-seed10"]
    assert task_rerun.named_runs("tasks", ["odd-L64"]) == ["odd-L64"]
    assert task_rerun.named_runs("tasks", ["copy-t5"]) == ["copy-t5"]
    with pytest.raises(UserError, match=r"or a cell's runs without their seed \(e\.g\. copy-t5-L64\)$"):
        task_rerun.plan(task_rerun.arguments(["copy-t5"]))


def test_a_rerun_counts_for_a_suite_only_when_it_trains_what_that_suites_run_trained(tmp_path, monkeypatch):
    """The reruns' folders hold reruns of one suite's runs; another suite with runs of the same names (the first
    protocol's, trained for other steps) is not compared with them. Where and how a rerun ran (name, paths, threads,
    resume) and its kept weights do not make another training."""
    monkeypatch.setattr(task_rerun, "ROOT", tmp_path)
    run = "passkey-t5-L64-seed0"
    train = "python -m alibi_lm.train task=passkey position=t5 seed=0 experiment=tasks"
    commands = {"tasks": f"{train} train.max_steps=8000 train.keep_checkpoints_every=1000 name=tasks paths.runs=runs",
                "old": f"{train} train.max_steps=4000 name=old paths.runs=runs",
                "tasks-rerun-threads2": f"{train} train.max_steps=8000 name=tasks-rerun-threads2 paths.results=results "
                                        "paths.runs=runs-kept train.threads=2 train.resume=auto"}
    for folder, command in commands.items():
        (tmp_path / "results" / folder).mkdir(parents=True)
        pd.DataFrame([dict(r, command=command) for r in rows(folder, run, {64: 1.0, 256: 0.3}, task="passkey")]
                     ).reindex(columns=COLUMNS).to_csv(tmp_path / "results" / folder / "tasks.csv", index=False)
    tasks, old = task_rerun.rows_by_source("tasks"), task_rerun.rows_by_source("old")
    assert task_rerun.rerun_so_far(tasks) == {run} and task_rerun.rerun_so_far(old) == set()
    assert set(task_rerun.comparison(old, [run])["source"]) == {"committed"}
    assert set(task_rerun.comparison(tasks, [run])["source"]) == {"committed", "2 threads"}
    for folder in ("old", "tasks-rerun-threads2"):  # kept checkpoints of both: not one run's course and its rerun's
        pd.DataFrame(kept(folder, run, 0, {1000: {256: 0.2}, 2000: {256: 0.4}})).reindex(columns=OVER_COLUMNS).to_csv(
            tmp_path / "results" / folder / "over_training.csv", index=False)
    assert "## Over training" not in task_rerun.write_report("old", [run]).read_text()
