"""How a plan's results folder was made: every invocation's start and every step's begin and end, appended to
results/<folder>/RUN_LOG.jsonl (log_event), and RUN_INFO.md rebuilt from it after every step (run_info): the
invocations' hardware, HEAD, threads and data, each step's command, commit and wall time, and what each run cost
(its status.json's training segments and its rows' wall_s; the rows of runs trained elsewhere kept from the
RUN_INFO.md it replaces)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from alibi_lm.checkpoint import atomic_write_text
from alibi_lm.provenance import HASH_COLUMNS
from alibi_lm.results.retrieval_store import RETRIEVAL_CSV
from alibi_lm.results.task_store import OVER_TRAINING_CSV, TASKS_CSV
from alibi_lm.stopping import STOP_SIGNALS, STOPPED_EXITS
from alibi_lm.training.run_log import RUN_LOG, run_log_events

RUN_INFO = "RUN_INFO.md"  # beside the run log: how the folder was made, what each run cost
STEP_SHOWN_S = 10  # steps shorter than this found their cells done: counted in RUN_INFO.md, not listed


def _minutes(seconds) -> str:
    return "-" if not seconds else f"{seconds / 60:.1f}"


COST_TABLE_HEAD = ("| run | steps | trained at commits | trained on | train | eval nonoverlapping / sliding / RoPE "
                   "extensions | probes passkey / context use | commits of its rows |", "|---|---|---|---|---|---|---|---|")
# a task suite's folder (tasks.csv): its evaluation is the run's cells, its kept checkpoints and its retrieval rows
TASK_COST_HEAD = ("| run | steps | trained at commits | trained on | train | eval cells / kept checkpoints / retrieval "
                  "| commits of its rows |", "|---|---|---|---|---|---|---|")
TRAINING_CELLS = 5  # run, steps, trained at commits, trained on, train: from status.json, the rest from the rows


def _table(results_dirs: list[Path], name: str, columns: list[str]):
    """The columns of a results table that the cost rows read (all of them there are), from every folder that has
    it; empty where none has."""
    import pandas as pd

    parts = [pd.read_csv(d / name, dtype=HASH_COLUMNS, usecols=lambda c: c in columns) for d in results_dirs
             if (d / name).is_file()]
    df = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    return df if not df.empty else pd.DataFrame(columns=columns)


def _mine(df, name: str):
    """(rows,) bool: a table's rows of the run folder `name` (its run column ends with /<name>; a name may be
    <experiment>/<run>)."""
    runs = df["run"].astype(str)
    return (runs == name) | runs.str.endswith(f"/{name}")


def is_task_folder(results_dirs: list[Path]) -> bool:
    return any((d / TASKS_CSV).is_file() for d in results_dirs)


def cost_head(results_dirs: list[Path]) -> tuple[str, str]:
    return TASK_COST_HEAD if is_task_folder(results_dirs) else COST_TABLE_HEAD


def training_cells(run: Path, label: str) -> list[str]:
    """The training part of a run's cost row, from its status.json: label (the run), steps, commits, devices,
    minutes."""
    status = json.loads((run / "status.json").read_text())
    segments = status.get("train_segments", [dict(seconds=status.get("train_seconds"), partial=True)])
    known = sum(s["seconds"] or 0 for s in segments)
    partial = any(s["seconds"] is None or s.get("partial") for s in segments) and status.get("step")
    devices = list(dict.fromkeys(s.get("device", "not recorded") for s in segments))  # in order, once each
    return [label, str(status.get("step")), ", ".join(status.get("train_commits", [])) or "not recorded",
            "; ".join(devices), f"{'≥ ' if partial else ''}{_minutes(known)} min"]


def lm_evaluation_cells(results_dirs: list[Path]) -> Callable[[str], list[str]]:
    """run name -> a language-model run's evaluation and probe minutes and the commits of its rows (the folder's
    tables read once)."""
    import pandas as pd

    rows = _table(results_dirs, "extrapolation.csv", ["run", "mode", "wall_s", "commit", "rope_scaling"])
    passkey = _table(results_dirs, "passkey.csv", ["run", "wall_s"])
    context = _table(results_dirs, "context_use.csv", ["run", "split", "wall_s"])
    extended = rows["rope_scaling"].notna() if "rope_scaling" in rows else pd.Series(False, index=rows.index)

    def cells(name: str) -> list[str]:
        mine = _mine(rows, name)
        evals = [rows[mine & ~extended & (rows["mode"] == m)]["wall_s"].sum() for m in ("nonoverlapping", "sliding")]
        evals.append(rows[mine & extended]["wall_s"].sum())
        pk = passkey[_mine(passkey, name)]["wall_s"].sum()
        cu = context[_mine(context, name)].drop_duplicates(["split"])["wall_s"].sum()  # a curve's bins repeat its time
        commits = ", ".join(sorted(set(rows[mine]["commit"].astype(str))))
        return [f"{' / '.join(map(_minutes, evals))} min", f"{_minutes(pk)} / {_minutes(cu)} min", commits]

    return cells


def task_evaluation_cells(results_dirs: list[Path]) -> Callable[[str], list[str]]:
    """run name -> a task run's evaluation minutes (its cells in tasks.csv, its kept checkpoints in over_training.csv,
    its attention rows in retrieval.csv) and the commits of its cells: all committed, so the same on every machine
    (the folder's tables read once)."""
    scored = _table(results_dirs, TASKS_CSV, ["run", "wall_s", "commit"])
    kept = _table(results_dirs, OVER_TRAINING_CSV, ["run", "wall_s"])
    retrieval = _table(results_dirs, RETRIEVAL_CSV, ["run", "eval_len", "weights", "timestamp", "wall_s"])
    # one measurement per length, its time copied onto each of its distance x layer x head rows: counted once
    measured = retrieval.drop_duplicates([c for c in ("run", "eval_len", "weights", "timestamp") if c in retrieval])

    def cells(name: str) -> list[str]:
        evals = [df[_mine(df, name)]["wall_s"].sum() if "wall_s" in df else 0 for df in (scored, kept, measured)]
        commits = ", ".join(sorted(set(scored[_mine(scored, name)]["commit"].astype(str))))
        return [f"{' / '.join(map(_minutes, evals))} min", commits]

    return cells


def evaluation_cells(results_dirs: list[Path]) -> Callable[[str], list[str]]:
    """run name -> the evaluation part of its cost row, in the folders' layout (cost_head)."""
    return (task_evaluation_cells if is_task_folder(results_dirs) else lm_evaluation_cells)(results_dirs)


def cost_sources(runs: Path | list[Path], log_path: Path) -> list[tuple[Path, Path, str]]:
    """(runs folder, results folder, label prefix) of each experiment a plan trains: its own (runs/<folder>/, rows
    beside the log), or several (the rerun check's runs/tasks-rerun-threads1/ and -threads2/, rows in the results
    folders of the same names beside the plan's, each run labelled <experiment>/<run>)."""
    if isinstance(runs, Path):
        return [(runs, log_path.parent, "")]
    return [(d, log_path.parent.parent / d.name, f"{d.name}/") for d in runs]


def per_run_costs(sources: list[tuple[Path, Path, str]]) -> list[str]:
    """Training, evaluation and probe wall time of every run: status.json's segments and the rows' wall_s."""
    evaluation = evaluation_cells([results for _, results, _ in sources])
    lines = list(cost_head([results for _, results, _ in sources]))
    for runs_dir, _, prefix in sources:
        for run in sorted(p for p in runs_dir.glob("*") if (p / "status.json").is_file()):
            lines.append(table_line([*training_cells(run, prefix + run.name), *evaluation(prefix + run.name)]))
    return lines


def table_line(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def step_outcome(status: int) -> str:
    """A step's exit status in words: a stop signal (exit 75, or 130 after Ctrl-C) is not a failure, the same command
    resumes it."""
    if status == 0:
        return "done"
    if status in STOPPED_EXITS:  # 75 after a scheduler's signal, 130 after Ctrl-C
        return f"stopped by a signal (exit status {status}; resumed by the same command)"
    if status < 0 and -status in STOP_SIGNALS:  # ended by the signal itself (it came before the app's handler)
        return f"stopped by {signal.Signals(-status).name} (resumed by the same command)"
    return f"failed (exit status {status})"


def log_event(path: Path, **record) -> None:
    """Append one record to the run log (RUN_LOG.jsonl), synced: a session killed mid-step keeps what it did."""
    path.parent.mkdir(parents=True, exist_ok=True)
    cut_short = path.is_file() and path.stat().st_size and not path.read_bytes().endswith(b"\n")
    with open(path, "a") as f:
        if cut_short:  # a write killed part-way: this record starts a line of its own, so it is read
            f.write("\n")
        f.write(json.dumps({"time": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S UTC}", **record}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def earlier_cost_rows(previous: str | None, head: tuple[str, str] = COST_TABLE_HEAD) -> list[str]:
    """The rows of the per-run cost table of an earlier RUN_INFO.md: the lines of that table only (up to the first
    line that is not a table row), and none from a table of another layout (an older RUN_INFO.md's columns)."""
    text = f"\n{head[0]}\n{head[1]}\n"
    if not previous or text not in previous:
        return []
    rows = []
    for line in previous.split(text, 1)[1].split("\n"):
        if not line.startswith("| "):
            break
        rows.append(line)
    return rows


def earlier_rows(previous: str | None, results_dirs: list[Path]) -> list[str]:
    """The earlier cost rows of the runs not here (cost_rows): the training part kept as it was recorded (status.json
    is on the machine that trained it), the evaluation part computed again from the committed rows, which every
    machine has."""
    rows = cost_rows(previous)
    if not rows:
        return []
    evaluation = evaluation_cells(results_dirs)
    training = [[cell.strip() for cell in row.split("|")[1:-1]][:TRAINING_CELLS] for row in rows]
    return [table_line([*cells, *evaluation(cells[0])]) for cells in training]


def run_of(row: str) -> str:
    """The run a cost-table row is of (its first cell)."""
    return row.split("|")[1].strip()


def cost_rows(text: str | None) -> list[str]:
    """The rows of a RUN_INFO.md's per-run cost table, in either layout (a task folder's was written in the language
    model's before it had its own)."""
    return earlier_cost_rows(text, TASK_COST_HEAD) or earlier_cost_rows(text, COST_TABLE_HEAD)


def cost_row_runs(text: str) -> set[str]:
    """The runs with a row in the per-run cost table of a RUN_INFO.md."""
    return {run_of(row) for row in cost_rows(text)}


def with_earlier_costs(here: list[str], previous: str | None, results_dirs: list[Path],
                       leave_out: frozenset[str] = frozenset()) -> list[str]:
    """The per-run cost table: the rows of the runs whose folders are here (per_run_costs), and the rows of an
    earlier RUN_INFO.md for the runs whose folders are not (trained in an earlier part of the plan or on another
    machine, their rows committed): a plan finished across machines keeps what every run cost. Less the runs of
    leave_out (a commit's runs under way)."""
    head, earlier = cost_head(results_dirs), earlier_rows(previous, results_dirs)
    names = {run_of(row) for row in here[2:]}
    rows = [row for row in here[2:] + [row for row in earlier if run_of(row) not in names] if run_of(row) not in leave_out]
    if not rows:
        return ["(no finished run yet)" if leave_out else "(no run folders here, and no earlier table)"]
    return [*head, *sorted(rows, key=run_of)]


def driver_of(start: dict) -> str:
    """The script an invocation ran, from its logged command line (`python scripts/tasks.py --jobs 2`)."""
    words = start.get("argv", "").split()
    return next((w for w in words if w.endswith(".py")), "scripts/reproduce.py")


def run_info(experiment: str, log_path: Path, runs: Path | list[Path], previous: str | None = None,
             leave_out: frozenset[str] = frozenset()) -> str:
    """RUN_INFO.md from every invocation in the run log: how the folder was made, and what each run cost (from its
    runs folder, or the several folders of cost_sources, and for the runs not there the rows of `previous`, the
    RUN_INFO.md this one replaces), less the cost rows of the runs of leave_out."""
    events = run_log_events(log_path)  # a line cut short by a kill is passed over
    starts = [e for e in events if e["event"] == "start"]
    drivers = sorted({driver_of(e) for e in starts}) or ["scripts/reproduce.py"]
    lines = [f"# How results/{experiment}/ was made", "",
             f"Written by {' and '.join(f'`{d}`' for d in drivers)} after every step, from `{RUN_LOG}` (every "
             f"invocation appends to it). {len(starts)} invocation(s); a step that found its cells done takes seconds "
             "and is counted, not listed.",
             "", "| started | invocation | hardware | HEAD at start | OMP_NUM_THREADS | jobs | data |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {e['time']} | `{e.get('argv', '-')}` | {e['hardware']} | {e['head']} | {e['omp']} | {e.get('jobs', 1)} "
              f"| {e['data']} |" for e in starts]
    lines += ["", "| invocation started | step | command | commit | threads | wall time | outcome |",
              "|---|---|---|---|---|---|---|"]
    # steps begun and not yet ended, by name, with the invocation (its start time) that began them and the index of
    # their begin: invocations may overlap (two drivers on one folder), so an end belongs to the latest begin of its
    # step, whoever started since. Rows in log order: a finished step where it ended, a stopped one where the next
    # invocation started after it began (or at the end).
    invocation, begun, skipped, total, rows = "", {}, 0, 0.0, []
    starts = [i for i, e in enumerate(events) if e["event"] == "start"]

    def stopped(b, started, at):  # a step begun and not ended: stopped (killed, machine gone) when a later
        # invocation started after it, else it may still be running
        after = next((i - 0.5 for i in starts if i > at), None)
        outcome = "stopped before it ended" if after is not None else "not ended when this was written"  # or running
        rows.append((len(events) if after is None else after,
                     f"| {started} | {b['step']} | `{b['command']}` | {b['commit']} | {b.get('threads') or '-'} | "
                     f"- | {outcome} |"))

    for i, e in enumerate(events):
        if e["event"] == "start":
            invocation = e["time"]
        elif e["event"] == "begin":
            if e["step"] in begun:  # begun again: the earlier attempt never ended
                stopped(*begun[e["step"]])
            begun[e["step"]] = (e, invocation, i)
        elif e["event"] == "skipped":
            skipped += 1
        elif e["event"] == "end" and e["step"] in begun:
            (b, started, _), total = begun.pop(e["step"]), total + e["seconds"]
            if e["seconds"] < STEP_SHOWN_S and e["status"] == 0:
                skipped += 1
                continue
            outcome = step_outcome(e["status"])
            rows.append((i, f"| {started} | {e['step']} | `{b['command']}` | {b['commit']} | {b.get('threads') or '-'} | "
                            f"{e['seconds']:.0f} s | {outcome} |"))
    for open_step in list(begun.values()):
        stopped(*open_step)
    lines += [line for _, line in sorted(rows, key=lambda r: r[0])]
    lines += ["", f"Steps that found their cells done: {skipped}. Wall time of all logged steps: {total / 3600:.1f} h "
              f"(steps stopped before they ended are not counted; their runs resume from their last checkpoint).", "",
              "Cost of each run, over every invocation (training: the segments in its status.json; ≥: a segment trained "
              "before they were recorded; evaluation and probes: the wall_s of its rows):", ""]
    sources = cost_sources(runs, log_path)
    results_dirs = [results for _, results, _ in sources]
    here = per_run_costs([s for s in sources if s[0].is_dir()])
    return "\n".join(lines + with_earlier_costs(here, previous, results_dirs, leave_out)) + "\n"


def write_run_info(experiment: str, log_path: Path, runs: Path | list[Path]) -> Path:
    """RUN_INFO.md beside the log, the cost rows of its runs not here kept from the one it replaces."""
    path = log_path.parent / RUN_INFO
    previous = path.read_text() if path.is_file() else None
    atomic_write_text(path, run_info(experiment, log_path, runs, previous))  # the only record of earlier parts
    return path
