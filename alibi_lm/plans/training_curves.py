"""training.csv and training.md of a task-suite folder: each run's exact match at L at every validation step.

training.csv keeps every validation of every run across machines: the runs here are read from their folders
(log.jsonl, status.json) and merged into it (update_training_csv); training.md is built from training.csv alone
(training_report), so that a commit of the finished runs (finished_commit.py) can rebuild it from its own rows."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from alibi_lm.checkpoint import atomic_write_text, read_status
from alibi_lm.results.task_store import TASKS_CSV
from alibi_lm.tasks.stream import LEARNED_AT, VALID_SEQUENCES, first_met
from alibi_lm.training.run_log import RUN_LOG, steps_ended_well, steps_under_way

TRAINING_CSV = "training.csv"  # in results/<name>/: every validation of every run, kept across machines
TRAINING_MD = "training.md"
COLUMNS = ["run", "step", "val_exact", "val_acc", "last_loss", "budget", "learned_at", "solved_at", "train_seconds"]


def validations_here(runs_dir: Path) -> pd.DataFrame:
    """One row per validation of every run here (its log.jsonl: step, exact match at L; val_acc, answer-token
    accuracy, in runs of the first protocol), with the run's last training loss, budget, first step at the criterion
    (status.json learned_at_step, else from the log), early stop (first protocol) and training seconds; a run not yet
    validated has one blank row."""
    rows = []
    for run in sorted(p for p in runs_dir.glob("*") if (p / "log.jsonl").is_file()):
        log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines() if line.strip()]
        status = json.loads((run / "status.json").read_text()) if (run / "status.json").is_file() else {}
        met = first_met([json.dumps(r) for r in log])["learned_at_step"]
        common = dict(run=run.name, last_loss=log[-1]["loss"] if log else None, budget=status.get("steps"),
                      learned_at=status.get("learned_at_step", met), solved_at=status.get("solved_at_step"),
                      train_seconds=status.get("train_seconds"))
        validations = [dict(common, step=r["step"], val_exact=r.get("val_exact"), val_acc=r.get("val_acc"))
                       for r in log if "val_exact" in r or "val_acc" in r]
        rows += validations or [dict(common, step=None)]
    return pd.DataFrame(rows, columns=COLUMNS)


INTEGERS = ("step", "budget", "learned_at", "solved_at")  # blanks stay blank (Int64), never 750.0


def read_training_csv(path: Path) -> pd.DataFrame:
    """A training.csv (no rows where there is none, or it is empty), in COLUMNS, its steps integers."""
    table = pd.read_csv(path) if path.is_file() and path.stat().st_size else pd.DataFrame(columns=COLUMNS)
    return table.reindex(columns=COLUMNS).astype({c: "Int64" for c in INTEGERS})


def update_training_csv(results: Path, runs_dir: Path) -> set[str]:
    """Merge the validations of the runs here into results/training.csv (the rows of runs not here, trained on
    another machine or in an earlier part, are kept); the runs whose step is under way (their curve so far)."""
    here, earlier = validations_here(runs_dir), read_training_csv(results / TRAINING_CSV)
    # a run stopped part-way here while another machine trained it to the end (its step ended well in RUN_LOG.jsonl;
    # without a log, its rows are in training.csv): the committed curve stays
    log = results / RUN_LOG
    unfinished = {run for run in set(here["run"]) if read_status(runs_dir / run)["status"] != "completed"}
    finished = {step.removeprefix("train ") for step in steps_ended_well(log)} if log.is_file() else set(earlier["run"])
    here = here[~here["run"].isin(unfinished & finished)]
    table = pd.concat([earlier[~earlier["run"].isin(here["run"])], here]).sort_values(["run", "step"], kind="stable")
    table = table.astype({c: "Int64" for c in INTEGERS})
    atomic_write_text(results / TRAINING_CSV, table.to_csv(index=False))
    # a run still training here, or whose step (training, then its cells, kept checkpoints and retrieval) has not
    # ended well on any machine, though its curve may be written
    return (unfinished - finished) | {step.removeprefix("train ") for step in steps_under_way(log)}


def table_row(cells) -> str:
    return "| " + " | ".join(map(str, cells)) + " |"


def training_report(results: Path, under_way: set[str] = frozenset()) -> str:
    """training.md from results/training.csv: each run's exact match at L on the validation sequences at every
    validation step, the step where it first met the criterion (exact match >= LEARNED_AT: `learned at`), its
    budget, final training loss and training and evaluation minutes; the runs of under_way marked so."""
    table = read_training_csv(results / TRAINING_CSV)
    steps = sorted(int(s) for s in table["step"].dropna().unique())
    scored = results / TASKS_CSV  # each cell's wall time: the run's evaluation cost
    cells = pd.read_csv(scored, usecols=["run", "wall_s"]) if scored.is_file() else pd.DataFrame(columns=["run", "wall_s"])
    lines = [f"# results/{results.name}: exact match at L during training", "",
             f"Exact match at L on {VALID_SEQUENCES:,} fixed validation sequences at each validation step, from each "
             f"run's log.jsonl, kept in {TRAINING_CSV} (written by `python scripts/tasks.py`; a blank: not reached "
             f"yet). The protocol: every run trains its task's whole budget (`budget`, the same for every scheme); "
             f"`learned at` is the first validation with exact match >= {LEARNED_AT} (the criterion, recorded, never "
             f"acted on); then the final training loss and the training and evaluation time (status.json's "
             f"train_seconds, the wall_s of the run's rows in tasks.csv). *(under way)*: a run whose step (training, "
             f"then its evaluation) has not ended yet, its curve so far.", "",
             table_row(["run", *steps, "budget", "learned at", "last loss", "train min", "eval min"]),
             "|---" * (len(steps) + 6) + "|"]
    for run, rows in table.groupby("run", sort=True):
        lines.append(run_line(str(run), rows, steps, cells, under_way))
    return "\n".join(lines) + "\n"


def run_line(run: str, rows: pd.DataFrame, steps: list[int], cells: pd.DataFrame, under_way: set[str]) -> str:
    """One run's row of training.md: its exact match at each validation step, then its budget and costs."""
    acc = {int(r.step): r.val_exact for r in rows.itertuples() if pd.notna(r.step) and pd.notna(r.val_exact)}
    last = rows.iloc[-1]
    text = {c: f"{int(last[c])}" if pd.notna(last[c]) else "" for c in ("budget", "learned_at")}
    loss = f"{last.last_loss:.3f}" if pd.notna(last.last_loss) else ""
    train = f"{last.train_seconds / 60:.1f}" if pd.notna(last.train_seconds) and last.train_seconds else ""
    evaluation = cells.loc[cells["run"].astype(str).str.endswith(f"/{run}"), "wall_s"].sum()
    label = f"{run} *(under way)*" if run in under_way else run
    return table_row([label, *(f"{acc[s]:.2f}" if s in acc else "" for s in steps), text["budget"],
                      text["learned_at"], loss, train, f"{evaluation / 60:.1f}"])


def training_curves(results: Path, runs_dir: Path) -> None:
    """training.csv updated from the runs here, and training.md rebuilt from it, in results/."""
    under_way = update_training_csv(results, runs_dir)
    atomic_write_text(results / TRAINING_MD, training_report(results, under_way))
