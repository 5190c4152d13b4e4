"""The rerun check at the level of the suite's main table: does a table cell (a task, scheme, positions and L, over
its seeds) say the same when its runs are trained again?

Two views (rerun.md's second and fourth parts):
  - each rerun in its own seed's place, the cell's other seeds as committed (rerun_table.csv);
  - a cell with two or more seeds trained again with the same thread count, over those seeds as committed and as
    retrained (rerun_cells.csv): the cell retrained, the unit a finding past L is stated on.
Both in the table's metric (task_findings.task_metric) with its interval (task_learning.seed_interval).
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from alibi_lm.checkpoint import atomic_write_text
from alibi_lm.results.markdown import markdown_table
from alibi_lm.results.task_findings import task_metric
from alibi_lm.results.task_learning import seed_interval
from alibi_lm.results.task_store import TABLE_CELL

SEED_SUFFIX = re.compile(r"-seed(\d+)$")  # a suite run's name ends in its seed: flipflop-t5-L64-seed0


def cell_name(run: str) -> str:
    """A run's name without its seed: its main-table cell's (flipflop-t5-L64-seed0 -> flipflop-t5-L64)."""
    return SEED_SUFFIX.sub("", run)


def seed_number(run: str) -> int:
    """The seed a run's name ends in (-1 for a name without one)."""
    found = SEED_SUFFIX.search(run)
    return int(found.group(1)) if found else -1
COMMITTED = "committed seeds"
CELL_COLUMNS = ["eval_len", "train_len", "metric", "source", "mean", "low", "high", "seeds"]


def in_its_place(label: str) -> str:
    """The second part's column of a rerun source ('2 threads in its place')."""
    return f"{label} in its place"


def retrained(label: str) -> str:
    """A rerun source's rows in the fourth part (rerun_cells.csv's source: 'retrained, 2 threads')."""
    return f"retrained, {label}"


def main_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """A suite's rows (its tasks.csv) of the tasks as trained (the main table's), with each row's run name."""
    main = rows[rows["variant"] == ""]
    return main.assign(name=main["run"].map(lambda r: Path(str(r)).name))


def seeds_beside(main: pd.DataFrame, run: str) -> tuple[pd.DataFrame, int]:
    """(the committed rows of every seed of run's row in the suite's main table: its task, scheme, positions and L,
    the task as trained; run's own seed)."""
    mine = main["name"] == run  # (rows,)
    cells = pd.MultiIndex.from_frame(main[TABLE_CELL].astype(str))  # (rows,) of TABLE_CELL tuples
    same = cells.isin(cells[mine.to_numpy()])  # (rows,)
    return main[same], int(main.loc[mine, "seed"].iloc[0])


def cell_row(at: pd.DataFrame, values: pd.Series, metric: str, source: str) -> dict:
    """One CELL_COLUMNS row: `values` (seeds,) of the cell's seeds at one Lv, on the trials of its committed rows."""
    trials = at["examples"] if metric == "exact" else at["answers"]  # the same sequences, answers in every rerun
    mean, low, high, n = seed_interval(values, trials)
    return dict(eval_len=int(at["eval_len"].iloc[0]), train_len=int(at["train_len"].iloc[0]), metric=metric,
                source=source, mean=mean, low=low, high=high, seeds=n)


def table_cells(main: pd.DataFrame, reruns: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, Lv compared, source): the suite's main-table cell over seeds as committed, and with each
    rerun's value (reruns: task_rerun.comparison's rows) in place of the run's own seed: what the table would say
    had that seed been trained again."""
    out = []
    for run in sorted(set(reruns["run"])):
        seeds, seed = seeds_beside(main, run)
        metric = task_metric(str(seeds["task"].iloc[0]))  # the table's: token_acc where answers grow with Lv
        for lv, at in seeds.groupby("eval_len"):
            here = reruns[(reruns["run"] == run) & (reruns["eval_len"] == lv)].set_index("source")[metric]
            if "committed" not in here:  # not a length the check compares
                continue
            for source, value in here.items():  # the committed cell first, then each rerun scored so far
                values = at[metric].where(at["seed"] != seed, float(value))  # (seeds,)
                label = COMMITTED if source == "committed" else in_its_place(source)
                out.append(dict(run=run, **cell_row(at, values, metric, label)))
    return pd.DataFrame(out, columns=["run", *CELL_COLUMNS])


def cells_rerun(main: pd.DataFrame, runs: list[str]) -> dict[tuple, pd.DataFrame]:
    """The main-table cells (TABLE_CELL values) with a rerun among `runs` -> their committed rows, every seed."""
    cells = {}
    for run in runs:
        seeds, _ = seeds_beside(main, run)
        cells.setdefault(tuple(seeds[TABLE_CELL].astype(str).iloc[0]), seeds)
    return cells


def retrained_cells(main: pd.DataFrame, reruns: pd.DataFrame, labels: list[str]) -> pd.DataFrame:
    """One row per (cell with two or more committed seeds trained again by one source, Lv compared, source): the cell
    over those seeds as committed, and over their reruns (labels: the rerun sources, '2 threads'); `seed_set` names
    the seeds. The same seeds on both sides: a seed the suite added later, without a rerun, is left out of both. One
    retrained seed is left to the per-run parts."""
    out = []
    for seeds in cells_rerun(main, sorted(set(reruns["run"]))).values():
        cell = cell_name(sorted(seeds["name"])[0])
        metric = task_metric(str(seeds["task"].iloc[0]))
        for label in labels:
            redone = reruns[reruns["source"] == label]
            done = sorted(set(seeds["name"]) & set(redone["run"]), key=seed_number)  # the seeds this source retrained
            if len(done) < 2:
                continue
            seed_set = ",".join(str(seed_number(run)) for run in done)
            for lv, at in seeds[seeds["name"].isin(done)].groupby("eval_len"):
                value = redone[redone["eval_len"] == lv].set_index("run")[metric]  # run name -> its rerun's value
                if not set(done) <= set(value.index):  # not a length the check compares
                    continue
                out += [dict(cell=cell, seed_set=seed_set, **cell_row(at, at[metric], metric, COMMITTED)),
                        dict(cell=cell, seed_set=seed_set, **cell_row(at, at["name"].map(value), metric,
                                                                        retrained(label)))]
    return pd.DataFrame(out, columns=["cell", "seed_set", *CELL_COLUMNS])


NO_TEST = "no test"  # the verdict where the committed interval is all of [0, 1]: no rerun could move the cell


def holds(part: pd.DataFrame) -> str:
    """'holds' when every rerun source's mean lies inside the committed cell's interval, 'moves' otherwise; NO_TEST
    when that interval is all of [0, 1] (seeds that disagree, as one near 1 and one near 0): a check that cannot
    fail is not counted as a hold; '' before any rerun of the cell is scored."""
    if len(part) < 2:
        return ""
    committed = part[part["source"] == COMMITTED].iloc[0]
    if committed["low"] <= 0.0 and committed["high"] >= 1.0:
        return NO_TEST
    inside = part["mean"].between(committed["low"], committed["high"])
    return "holds" if bool(inside.all()) else "moves"


def cell_text(part: pd.DataFrame) -> dict[str, str]:
    """source -> 'mean [low, high] (n=seeds)'."""
    return {r.source: f"{r.mean:.2f} [{r.low:.2f}, {r.high:.2f}] (n={r.seeds})" for r in part.itertuples()}


def table_section(main: pd.DataFrame, suite: str, reruns: pd.DataFrame, labels: list[str], folder: Path) -> str:
    """rerun.md's second part, and rerun_table.csv: the suite's main-table cells with each rerun in its seed's place."""
    cells = table_cells(main, reruns)
    atomic_write_text(folder / "rerun_table.csv", cells.to_csv(index=False))
    sources, rows = [COMMITTED, *map(in_its_place, labels)], []
    for (run, lv), part in cells.groupby(["run", "eval_len"], sort=True):
        text = cell_text(part)
        rows.append([run, f"{lv // int(part['train_len'].iloc[0])}L", part["metric"].iloc[0],
                     *(text.get(s, "") for s in sources), holds(part)])
    return "\n".join([
        "## The suite's table with the rerun in its seed's place\n",
        f"The row of results/{suite}/tasks.md's main table that the run belongs to (its task, scheme, positions and L), "
        "in the table's metric (exact match; answer-token accuracy where the answers grow with Lv, as flip-flop's) "
        "over every committed seed: mean [95% interval: the wider of the t interval over seeds and the pooled trials' "
        "Wilson], as committed and with each rerun's value in place of the run's own seed. *holds*: every rerun's "
        "mean lies inside the committed interval, so the table's cell says the same had that seed been trained "
        f"again; *{NO_TEST}*: that interval is all of [0, 1] (seeds that disagree), which no value could leave. "
        f"Rows: rerun_table.csv, computed from results/{suite}/tasks.csv's rows of those seeds and the reruns' "
        "rows in results/tasks-rerun-threads*/tasks.csv, each with its command, commit, device and wall time; the "
        "reruns' commands, commits, hardware and wall times are also in RUN_INFO.md.\n",
        markdown_table(["run", "Lv", "metric", *sources, "verdict"], rows), ""])


def retrained_section(main: pd.DataFrame, suite: str, reruns: pd.DataFrame, labels: list[str], folder: Path) -> str:
    """rerun.md's fourth part, and rerun_cells.csv: the cells whose every seed was trained again ('' when none)."""
    cells = retrained_cells(main, reruns, labels)
    atomic_write_text(folder / "rerun_cells.csv", cells.to_csv(index=False))
    if cells.empty:
        return ""
    rows = []
    for (cell, seed_set, lv), part in cells.groupby(["cell", "seed_set", "eval_len"], sort=True):
        text = cell_text(part)
        rerun = next(s for s in part["source"] if s != COMMITTED)
        rows.append([cell, seed_set, f"{lv // int(part['train_len'].iloc[0])}L", part["metric"].iloc[0],
                     text[COMMITTED], text[rerun], rerun.removeprefix(retrained("")), holds(part)])
    return "\n".join([
        "## A table cell with its seeds trained again\n",
        f"The cells of results/{suite}/tasks.md's main table with two or more seeds trained again with the same "
        "thread count: over those seeds (*seeds*), the cell as committed and over their reruns alone, in the "
        "table's metric, mean [95% interval as above]. *holds*: the retrained mean lies inside the committed "
        f"interval; *{NO_TEST}*: that interval is all of [0, 1]. The cell over seeds is the unit a finding past L "
        "is stated on. Rows: rerun_cells.csv, from the same rows as the part above.\n",
        markdown_table(["cell", "seeds", "Lv", "metric", "committed", "retrained", "threads", "verdict"], rows), ""])


__all__ = ["COMMITTED", "NO_TEST", "cell_name", "cells_rerun", "holds", "main_rows", "retrained_cells",
           "retrained_section", "seed_number", "seeds_beside", "table_cells", "table_section"]
