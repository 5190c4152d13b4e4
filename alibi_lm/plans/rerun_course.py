"""The rerun check over training: a committed run's kept checkpoints beside its rerun's, step by step.

A run's last checkpoint is one point of a course that, past L, still swings by tens of points (tasks.md, the late
movement). So rerun.md's third part compares the two courses: at each kept step both were scored at (L, 4L, 16L, on
the same test sequences: over_training.csv), how far the rerun is from the committed run, against how far the
committed seeds of the same table cell are from each other at those steps. A rerun that follows its run's course
stays well under the seeds' distance; one that is as far as another seed is, from the first steps on, says that a
last-bit difference in training draws a new course past L, not a nearby one. Also each course's mean over the last
quarter of training (task_learning.LATE_SHARE): the level a seed settles at, which a single checkpoint may miss.
"""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

import pandas as pd

from alibi_lm.checkpoint import atomic_write_text
from alibi_lm.results.markdown import markdown_table
from alibi_lm.results.plots import pyplot, save_figure
from alibi_lm.results.task_findings import task_metric
from alibi_lm.results.task_learning import LATE_SHARE, multiple
from alibi_lm.results.task_store import OVER_TRAINING_CSV, TABLE_CELL, read_over_training

CELL = [c for c in TABLE_CELL if c != "rope_scaling"]  # the main-table cell a run belongs to: kept weights have no
# extension, and over_training.csv no rope_scaling column
COURSE_COLUMNS = ["run", "eval_len", "train_len", "metric", "rerun", "steps", "rerun_gap", "seed_gap", "seeds",
                  "committed_late", "rerun_late"]


def kept_rows(folder: Path) -> pd.DataFrame:
    """over_training.csv of results/<folder>/ (no rows where it has none), with each row's run name."""
    rows = read_over_training(folder / OVER_TRAINING_CSV)
    return rows.assign(name=rows["run"].map(lambda r: Path(str(r)).name))


def by_step(rows: pd.DataFrame, lv: int, metric: str) -> pd.Series:
    """step -> metric of one run's kept checkpoints at Lv = lv."""
    at = rows[rows["eval_len"] == lv].dropna(subset=[metric])
    return at.set_index(at["step"].astype(int))[metric].astype(float).sort_index()


def late_mean(course: pd.Series) -> float:
    """The mean over the kept steps of the last quarter of training (from LATE_SHARE of the last step on)."""
    return float(course[course.index >= LATE_SHARE * course.index.max()].mean())


def seed_gap(cell: pd.DataFrame, lv: int, metric: str, steps: list[int]) -> tuple[float, int]:
    """(the mean over `steps` and over every pair of the cell's committed runs of |run - run| at Lv = lv, the runs
    with a value at one of those steps): how far apart two seeds' courses are, where the rerun is compared. A step
    that one of a pair lacks is left out of that pair's mean (NaN)."""
    courses = [by_step(part, lv, metric).reindex(steps) for _, part in cell.groupby("name")]  # (runs,) x (steps,)
    courses = [c for c in courses if c.notna().any()]
    gaps = [(a - b).abs() for a, b in combinations(courses, 2)]
    return (float(pd.concat(gaps).mean()) if gaps else float("nan")), len(courses)


def run_and_cell(committed: pd.DataFrame, run: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(run's kept-checkpoint rows, those of every committed seed of its main-table cell, its own included)."""
    run_rows = committed[committed["name"] == run]
    if run_rows.empty:
        return run_rows, run_rows
    key = run_rows.iloc[0][CELL].astype(str)
    return run_rows, committed[(committed[CELL].astype(str) == key).all(axis=1)]


def course_rows(committed: pd.DataFrame, reruns: dict[str, pd.DataFrame], runs: list[str]) -> pd.DataFrame:
    """One row per (run, Lv, rerun with kept checkpoints scored): COURSE_COLUMNS."""
    out = []
    for run in runs:
        run_rows, cell = run_and_cell(committed, run)
        if run_rows.empty:
            continue
        first = run_rows.iloc[0]
        metric = task_metric(str(first["task"]))  # the main table's
        for source, rows in reruns.items():
            rerun_rows = rows[rows["name"] == run]
            for lv in sorted(int(v) for v in rerun_rows["eval_len"].unique()):
                old, new = by_step(run_rows, lv, metric), by_step(rerun_rows, lv, metric)  # step -> value
                common = sorted(set(old.index) & set(new.index))
                if not common:
                    continue
                gap, seeds = seed_gap(cell, lv, metric, common)
                out.append(dict(run=run, eval_len=lv, train_len=int(first["train_len"]), metric=metric, rerun=source,
                                steps=len(common), rerun_gap=float((old[common] - new[common]).abs().mean()),
                                seed_gap=gap, seeds=seeds, committed_late=late_mean(old), rerun_late=late_mean(new)))
    return pd.DataFrame(out, columns=COURSE_COLUMNS)


def course_figure(run: str, committed: pd.DataFrame, reruns: dict[str, pd.DataFrame], path: Path) -> None:
    """One panel per scored multiple of L: the committed run's course (solid), each rerun's (dashed), and the
    other committed seeds of its table cell (faint), against the training step."""
    plt = pyplot()
    mine, cell = run_and_cell(committed, run)
    first = mine.iloc[0]
    metric, L = task_metric(str(first["task"])), int(first["train_len"])
    lengths = sorted(int(v) for v in mine["eval_len"].unique())
    fig, axes = plt.subplots(1, len(lengths), figsize=(4.2 * len(lengths), 3.4), squeeze=False, sharey=True)
    for ax, lv in zip(axes[0], lengths):
        for i, (_, part) in enumerate(cell[cell["name"] != run].groupby("seed")):
            course = by_step(part, lv, metric)
            ax.plot(course.index, course.values, color="grey", alpha=0.35, linewidth=0.8,
                    label="other seeds" if i == 0 else None)
        course = by_step(mine, lv, metric)
        ax.plot(course.index, course.values, color="black", linewidth=1.8, label="committed")
        for source, rows in reruns.items():
            course = by_step(rows[rows["name"] == run], lv, metric)
            ax.plot(course.index, course.values, linestyle="--", linewidth=1.6, label=f"rerun, {source}")
        ax.set_title(f"Lv = {multiple(lv, L)} = {lv}", fontsize=10)
        ax.set_xlabel("training step")
        ax.set_ylim(-0.02, 1.02)
    axes[0][0].set_ylabel("exact match" if metric == "exact" else "answer-token accuracy")
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.suptitle(f"{run}: the committed course and its rerun's", fontsize=10)
    save_figure(fig, path)


def course_section(suite: str, rerun_folders: dict[str, str], runs: list[str], results: Path, folder: Path) -> str:
    """rerun.md's third part, rerun_course.csv and a figure per run (rerun-course-<run>.png in `folder`): the named
    runs whose reruns (rerun_folders: label -> results folder) kept weights scored over training."""
    committed = kept_rows(results / suite)
    reruns = {label: rows for label, name in rerun_folders.items() if not (rows := kept_rows(results / name)).empty}
    table = course_rows(committed, reruns, runs)
    atomic_write_text(folder / "rerun_course.csv", table.to_csv(index=False))
    if table.empty:
        return ""
    rows, figures = [], []
    for run in sorted(set(table["run"])):
        course_figure(run, committed, {k: v for k, v in reruns.items() if run in set(v["name"])},
                      folder / f"rerun-course-{run}.png")
        figures.append(f"![{run}: the committed course and its rerun's](rerun-course-{run}.png)\n")
    for r in table.sort_values(["run", "eval_len", "rerun"]).itertuples():
        rows.append([r.run, multiple(int(r.eval_len), int(r.train_len)), r.metric, r.rerun, str(r.steps),
                     f"{r.rerun_gap:.2f}", f"{r.seed_gap:.2f} (n={r.seeds})", f"{r.committed_late:.2f}",
                     f"{r.rerun_late:.2f}"])
    return "\n".join([
        "## Over training: the committed course and its rerun's\n",
        f"For the reruns that kept weights as their run did (the paper's schemes and NoPE keep them; rows in "
        f"results/{suite}/ and the reruns' {OVER_TRAINING_CSV}, scored at L, 4L and 16L on the cells' test "
        "sequences): at the kept steps both have, the mean of |committed - rerun| (*rerun's distance*) beside the "
        "mean of |seed - seed| over every pair of the committed seeds of the same table cell at those steps (*seeds' "
        "distance*); a rerun that follows its run's course stays well under the seeds' distance. Then each course's "
        f"mean over the kept steps of the last quarter of training (from {LATE_SHARE:.0%} of the last step on). "
        "Rows: rerun_course.csv; each figure: the committed run (solid), its rerun (dashed), its cell's other seeds "
        "(grey).\n",
        markdown_table(["run", "Lv", "metric", "rerun", "kept steps", "rerun's distance", "seeds' distance",
                        "last quarter, committed", "last quarter, rerun"], rows), "", *figures])


__all__ = ["COURSE_COLUMNS", "course_rows", "course_section", "late_mean", "seed_gap"]
