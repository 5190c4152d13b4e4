"""The task suite's rerun check: do a committed run's numbers past L survive retraining?

Each named run of results/tasks/ (its committed command, read from its rows in tasks.csv) is trained again twice,
with one and with two CPU threads (different float reductions), into results/tasks-rerun-threads1/ and
results/tasks-rerun-threads2/; then results/tasks-rerun/rerun.md (and rerun.csv) sets the three exact matches at
every scored length (L..16L) side by side with their Wilson intervals, and says whether they agree (every pair of
intervals overlaps); and (rerun_table.csv) the cell of the suite's main table the run belongs to, over all its
seeds, as committed and with each rerun in the seed's place: whether the table would say the same (rerun_table.py);
for a run that kept weights, its course over training beside its rerun's (rerun_course.py); and a cell whose every
seed was trained again, over its reruns alone (rerun_cells.csv). Resumable, as the suite: a trained rerun is
skipped.

    python scripts/task_rerun.py flipflop-alibi-L64-seed0 passkey-alibi-L64-seed0 copy-alibi-L64-seed0
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import pandas as pd

from alibi_lm.checkpoint import atomic_write_text
from alibi_lm.cli import number, one_line_errors
from alibi_lm.errors import ArgumentParser, UserError
from alibi_lm.results.markdown import markdown_table
from alibi_lm.results.task_learning import wilson
from alibi_lm.results.task_store import TASKS_CSV, read_task_results

from . import checkout_root
from .driver import add_modes, drive, repeated
from .rerun_course import course_section
from .rerun_table import cell_name, main_rows, retrained_section, seed_number, table_section
from .steps import Step, trained_run_finished

ROOT = checkout_root()  # results/, runs/
THREADS = (1, 2)
MULTIPLES = (1, 2, 4, 8, 16)  # every length the suite scores: a move at 2L or 8L is shown too
FOLDER = "tasks-rerun"


def thread_label(threads: int) -> str:
    """A rerun's name in the report and its step: '1 thread', '2 threads'."""
    return f"{threads} thread{'s' if threads > 1 else ''}"


def arguments(argv=None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", metavar="RUN",
                   help="committed runs of results/<--suite>/, e.g. flipflop-alibi-L64-seed0, or a main-table cell's "
                        "runs without their seed, flipflop-t5-L64: every committed seed of it (--report-only: none)")
    p.add_argument("--suite", default="tasks", help="the results folder whose runs are checked")
    p.add_argument("--runs", default="runs", help="where the reruns' folders go (runs/tasks-rerun-threads*/)")
    p.add_argument("--jobs", type=number(int, 1), default=1, help="steps run at once")
    p.add_argument("--threads", default=",".join(map(str, THREADS)),
                   help=f"which reruns to train, by CPU threads (default: all of {','.join(map(str, THREADS))}; 2: the one "
                        "whose float reductions differ from the suite's one-thread runs)")
    add_modes(p, dry_run="print the steps and run nothing",
              status="run nothing: how many steps are finished, which are left",
              report_only="rebuild rerun.md from the rows there (every run rerun so far) and RUN_INFO.md; train nothing")
    args = p.parse_args(argv)
    if not args.names and not args.report_only:
        p.error("name at least one committed run to train again, e.g. flipflop-alibi-L64-seed0")
    if (twice := repeated(args.names)) is not None:
        p.error(f"{twice} is named twice; name each run once (its reruns would train into the same folders)")
    chosen = [t.strip() for t in args.threads.split(",") if t.strip()]
    if not chosen or any(t not in {str(n) for n in THREADS} for t in chosen):
        p.error(f"--threads takes thread counts of {','.join(map(str, THREADS))}, comma-separated, got {args.threads!r}")
    args.threads = sorted({int(t) for t in chosen})
    return args


WHERE = ("name=", "paths.runs=", "paths.results=", "train.threads=", "train.resume=")  # where and how a run runs,
# not what it trains: the rerun's own


def training_of(command: str) -> tuple[str, ...] | None:
    """What a row's train command trains, as sorted overrides: without WHERE and the keep interval (kept weights are
    files beside the training, which they leave as it is: a rerun with and without them made the same weights);
    None for a command that is not `python -m alibi_lm.train`."""
    words = shlex.split(str(command))
    if "alibi_lm.train" not in words:
        return None
    return tuple(sorted(a for a in words[words.index("alibi_lm.train") + 1:]
                        if not a.startswith((*WHERE, "train.keep_checkpoints_every="))))


def committed_command(rows: pd.DataFrame, run: str, suite: str) -> list[str]:
    """The train command that made `run` (its rows' command column), as arguments after `python -m alibi_lm.train`."""
    mine = rows[rows["run"].astype(str).str.endswith(f"/{run}")]
    if mine.empty:
        example = Path(str(rows["run"].iloc[0])).name if len(rows) else ""
        raise UserError(f"no committed rows of {run} in results/{suite}/{TASKS_CSV}; name a run it holds (its run "
                        f"column, e.g. {example}) or a cell's runs without their seed (e.g. {cell_name(example)})"
                        if len(rows) else
                        f"no committed rows of {run} in results/{suite}/{TASKS_CSV}, which holds none; name a suite "
                        f"with --suite")
    words = shlex.split(str(mine["command"].iloc[0]))
    return words[words.index("alibi_lm.train") + 1:]


def named_runs(suite: str, names: list[str]) -> list[str]:
    """The runs named: each committed run as it is, and a name without its seed (flipflop-t5-L64) as every committed
    seed of it, in seed order; a run named twice that way is refused in one line."""
    held = {Path(str(r)).name for r in read_task_results(ROOT / "results" / suite / TASKS_CSV)["run"]}
    runs = []
    for name in names:
        seeds = sorted((r for r in held if r != name and cell_name(r) == name), key=seed_number)
        runs += [name] if name in held or not seeds else seeds
    if (twice := repeated(runs)) is not None:
        raise UserError(f"{twice} is named twice (on its own and in its cell, or in two names); name each run once")
    return runs


def plan(args: argparse.Namespace) -> list[Step]:
    rows = read_task_results(ROOT / "results" / args.suite / TASKS_CSV)
    steps = []
    for run in args.names:
        # the committed training as it was, its kept weights included: the rerun's are scored over training too
        training = [a for a in committed_command(rows, run, args.suite) if not a.startswith(WHERE)]
        for threads in args.threads:
            name = f"{FOLDER}-threads{threads}"
            command = [sys.executable, "-m", "alibi_lm.train", *training, f"name={name}", "paths.results=results",
                       f"paths.runs={args.runs}", f"train.threads={threads}", "train.resume=auto"]
            done = trained_run_finished(command, Path(args.runs) / name / run, ROOT)
            steps.append(Step(f"train {run} ({thread_label(threads)})", command,
                              makes=f"{name}/{run}", done=done))
    return steps


def rows_by_source(suite: str) -> dict[str, pd.DataFrame]:
    """'committed' -> results/<suite>/tasks.csv's rows, then each thread label ('2 threads') -> the rows of its
    reruns' folder that rerun a run of that suite (reruns_of): every row the report reads, read once."""
    committed = read_task_results(ROOT / "results" / suite / TASKS_CSV)
    return {"committed": committed, **{thread_label(t): reruns_of(committed, t) for t in THREADS}}


def comparison(rows_of: dict[str, pd.DataFrame], runs: list[str]) -> pd.DataFrame:
    """One row per (run, Lv in MULTIPLES x L, source of rows_of): exact match, its sequences and Wilson interval."""
    out = []
    for source, rows in rows_of.items():
        for run in runs:
            mine = rows[rows["run"].astype(str).str.endswith(f"/{run}") & (rows["variant"] == "")]
            for _, r in mine.iterrows():
                if int(r["eval_len"]) in {m * int(r["train_len"]) for m in MULTIPLES}:
                    low, high = wilson(float(r["exact"]) * int(r["examples"]), int(r["examples"]))
                    out.append(dict(run=run, eval_len=int(r["eval_len"]), train_len=int(r["train_len"]), source=source,
                                    exact=float(r["exact"]), examples=int(r["examples"]), low=low, high=high,
                                    token_acc=float(r["token_acc"]), commit=r["commit"], device=r["device"]))
    return pd.DataFrame(out, columns=["run", "eval_len", "train_len", "source", "exact", "examples", "low", "high",
                                      "token_acc", "commit", "device"])


def agree(part: pd.DataFrame) -> str:
    """'agree' when every pair of the Wilson intervals overlaps (the committed cell's and those of the reruns trained
    so far), 'differ' when one pair does not; '' before any rerun of the cell is scored."""
    if len(part) < 2 or "committed" not in set(part["source"]):
        return ""
    return "agree" if part["low"].max() <= part["high"].min() else "differ"


def reruns_of(committed: pd.DataFrame, threads: int) -> pd.DataFrame:
    """The rows of results/tasks-rerun-threads<threads>/tasks.csv that rerun a run of `committed` (a suite's rows):
    the same run name and the same training (training_of its command). Another suite's run of that name (the first
    suite's, trained otherwise) is not this one's rerun."""
    rows = read_task_results(ROOT / "results" / f"{FOLDER}-threads{threads}" / TASKS_CSV)
    trained = {Path(str(r)).name: training_of(c) for r, c in zip(committed["run"], committed["command"])}
    same = [trained.get(Path(str(r)).name, ()) == training_of(c) for r, c in zip(rows["run"], rows["command"])]
    return rows[pd.Series(same, index=rows.index, dtype=bool)]


def rerun_so_far(rows_of: dict[str, pd.DataFrame]) -> set[str]:
    """The runs of the suite rerun in the reruns' folders (rows_of: rows_by_source()): every run of that suite this check
    has trained."""
    return {Path(str(run)).name for source, rows in rows_of.items() if source != "committed" for run in rows["run"]}


def write_report(suite: str, runs: list[str]) -> Path:
    """rerun.md and rerun.csv over every run rerun so far and those named now: a check of a few more runs adds
    them to the report and keeps the others'."""
    rows_of = rows_by_source(suite)
    table = comparison(rows_of, sorted(set(runs) | rerun_so_far(rows_of)))
    main = main_rows(rows_of["committed"])
    folder = ROOT / "results" / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / "rerun.csv", table.to_csv(index=False))
    sources = ["committed", *map(thread_label, THREADS)]
    rows = []
    for (run, lv), part in table.groupby(["run", "eval_len"], sort=True):
        cells = {r.source: f"{r.exact:.3f} [{r.low:.3f}, {r.high:.3f}]" for r in part.itertuples()}
        rows.append([run, f"{lv // int(part['train_len'].iloc[0])}L", *(cells.get(s, "") for s in sources), agree(part)])
    text = "\n".join([
        "# The rerun check: a committed run's exact match past L, trained again\n",
        f"Each run of results/{suite}/ retrained by its committed command, with {' and '.join(map(str, THREADS))} CPU "
        f"threads (results/{FOLDER}-threads*/): exact match at every Lv [95% Wilson interval] on the same test "
        "sequences; *agree*: every pair of the intervals there overlaps (a blank rerun: not trained, `--threads`). "
        "Rows: rerun.csv (with each row's commit and device). Written by `python scripts/task_rerun.py`.\n",
        markdown_table(["run", "Lv", *sources, "verdict"], rows), ""])
    labels, results = [thread_label(t) for t in THREADS], ROOT / "results"
    # the runs with a rerun of this suite's training (reruns_of): only their kept checkpoints are courses to compare
    rerun_here = sorted(set(table.loc[table["source"] != "committed", "run"]))
    parts = (text + table_section(main, suite, table, labels, folder),
             course_section(suite, {thread_label(t): f"{FOLDER}-threads{t}" for t in THREADS}, rerun_here,
                            results, folder),
             retrained_section(main, suite, table, labels, folder))
    atomic_write_text(folder / "rerun.md", "\n".join(filter(None, parts)))
    return folder / "rerun.md"


def main(argv=None) -> None:
    args = arguments(argv)
    with one_line_errors():
        args.names = named_runs(args.suite, args.names)
        steps = plan(args)
    # RUN_INFO.md (--report-only too) costs each rerun from its own folders, runs/tasks-rerun-threads*/
    drive("task_rerun.py", FOLDER, steps, args, lambda: "synthetic (no data set)", argv,
          lambda: write_report(args.suite, args.names), experiments=tuple(f"{FOLDER}-threads{t}" for t in THREADS))
    if args.report_only:
        print(f"wrote {ROOT / 'results' / FOLDER / 'rerun.md'}")


if __name__ == "__main__":
    main()
