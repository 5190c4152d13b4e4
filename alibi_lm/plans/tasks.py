"""The synthetic task suite, results/tasks/ (make tasks; committed when complete).

For every task (alibi_lm/tasks/), every registered position scheme and every variant of scripts/variants.py
(fox+rope, iRoPE with and without a window, Scalable-Softmax, QK-norm, learned ALiBi slopes), --seeds seeds:
train at lengths up to L (experiment=tasks: L = 64, 2 layers, d = 128) and score at L..16L (the passkey also on
its depth grid); the schemes of --random-schemes also with randomized positions (train.positions=random,
M = 16L). Then the tables
and heatmaps (tasks.md), RUN_INFO.md (every invocation's hardware and commit, each step's command and wall
time) and training.md (each run's answer accuracy at L during training, from training.csv). Resumable: trained
runs are skipped, scored cells are not scored again; --jobs 2 runs two steps at once. The suite takes longer than
one machine may be held (a cluster job's limit, a session): --stop-starting-after ends it with whole runs, whose
rows can be committed, and --keep-committed, on the next machine, trains only the runs whose rows are not all in
results/tasks/ yet.

    python scripts/tasks.py --jobs 2
    python scripts/tasks.py --jobs 2 --keep-committed --stop-starting-after 120   # one part on a fresh clone
    python scripts/tasks.py --tasks mqar --schemes alibi,rope --seeds 0 --name tasks-try   # a subset elsewhere
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

from omegaconf import OmegaConf

from alibi_lm.checkpoint import atomic_write_text
from alibi_lm.config import compose
from alibi_lm.eval.scoring import eval_lengths
from alibi_lm.positions import POSITION_SCHEMES
from alibi_lm.results.task_store import TASKS_CSV, read_task_results
from alibi_lm.tasks import TASKS, build_task

from .reproduce import add_precision, add_start_limit, drive, names, precision_override
from .steps import Step, trained_run_finished
from .variants import VARIANTS, check_extra, overrides, run_label

ROOT = Path(__file__).resolve().parents[2]  # the checkout: results/, runs/

SYNTHETIC = [name for name, task in TASKS.items() if task.synthetic]
RANDOM_SCHEMES = "sinusoidal,rope,t5,alibi,nope,fire"  # the paper's four, the control and FIRE (Zhou et al.)
DEFAULTS = dict(tasks=",".join(SYNTHETIC), schemes=",".join([*POSITION_SCHEMES, *VARIANTS]), seeds="0,1,2",
                random_schemes=RANDOM_SCHEMES, steps=None, extra=[])


def arguments(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default=DEFAULTS["tasks"], help="comma-separated tasks")
    p.add_argument("--schemes", default=DEFAULTS["schemes"],
                   help="comma-separated position schemes and variants (scripts/variants.py)")
    p.add_argument("--seeds", default=DEFAULTS["seeds"])
    p.add_argument("--random-schemes", default=DEFAULTS["random_schemes"],
                   help="schemes also trained with randomized positions ('' for none)")
    p.add_argument("--steps", type=int, default=None, help="training steps (default: experiment=tasks')")
    p.add_argument("--jobs", type=int, default=1, help="steps run at once (2 on 2 cores: one thread each)")
    p.add_argument("--name", default=None, help="the runs/ and results/ folder (default: tasks; any setting that "
                                                "differs from the suite's: tasks-custom)")
    p.add_argument("--runs", default="runs")
    p.add_argument("--dry-run", action="store_true", help="print the steps and run nothing")
    p.add_argument("--status", action="store_true", help="run nothing: how many steps are finished, which are left")
    p.add_argument("--report-only", action="store_true", help="rebuild RUN_INFO.md and the report; run nothing")
    add_precision(p)
    p.add_argument("--keep-committed", action="store_true",
                   help="do not train runs that have no folder here but every cell in results/<name>/tasks.csv "
                        "(trained in an earlier part of the suite, on another machine)")
    add_start_limit(p)
    p.add_argument("extra", nargs="*", help="more overrides for every training, e.g. train.lr=3e-3")
    args = p.parse_args(argv)
    for key in ("tasks", "schemes", "seeds", "random_schemes"):
        setattr(args, key, names(getattr(args, key)))
    if unknown := [t for t in args.tasks if t not in SYNTHETIC]:
        p.error(f"unknown task(s) {unknown}; choose from {','.join(SYNTHETIC)}")
    if unknown := [s for s in args.schemes if s not in POSITION_SCHEMES and s not in VARIANTS]:
        p.error(f"unknown scheme(s) {unknown}; choose from {','.join([*POSITION_SCHEMES, *VARIANTS])}")
    if unknown := [s for s in args.random_schemes if s not in POSITION_SCHEMES]:
        p.error(f"unknown --random-schemes {unknown}; choose from {','.join(POSITION_SCHEMES)}")
    check_extra(p, args.schemes, "tasks", 64, args.extra, args.tasks)
    changed = args.steps is not None or args.extra  # a subset is the suite's cells; other settings are not
    args.name = args.name or ("tasks-custom" if changed else "tasks")
    return args


def plan(args: argparse.Namespace) -> list[Step]:
    """One training step per run (its evaluate_after scores it), seed by seed: every task and scheme of a seed,
    then its randomized runs, before the next seed (an unfinished suite has whole seeds); the report last."""
    common = ["experiment=tasks", f"name={args.name}", f"paths.runs={args.runs}", "train.resume=auto",
              "train.progress=false", *([f"train.max_steps={args.steps}"] if args.steps else []),
              *precision_override(args), *args.extra]
    steps, elsewhere = [], []
    for seed in args.seeds:
        for random in (False, True):
            for task in args.tasks:
                for scheme in args.random_schemes if random else args.schemes:
                    if random and scheme not in args.schemes:
                        continue
                    # extra may label it: fox+gate_bias_init5
                    label = run_label(scheme, "tasks", 64, tuple(args.extra), (f"task={task}",))
                    run = f"{task}-{label}{'-random' if random else ''}-L64-seed{seed}"
                    positions = ["train.positions=random", "train.max_position=1024"] if random else []
                    if random and scheme == "learned":
                        positions.append("position.max_len=1024")  # a row for every position it may be given
                    command = [sys.executable, "-m", "alibi_lm.train", f"task={task}", *overrides(scheme, "tasks", 64),
                               f"seed={seed}", *positions, *common]
                    if made_elsewhere(args, run, command[3:]):
                        elsewhere.append(run)
                        continue
                    done = trained_run_finished(command, Path(args.runs) / args.name / run, ROOT)
                    steps.append(Step(f"train {run}", command, makes=run, done=done))
    if elsewhere:
        print(f"note: {len(elsewhere)} run(s) have every cell in results/{args.name}/{TASKS_CSV} and no folder here "
              f"(trained elsewhere): not trained again")
    report = [sys.executable, "-m", "alibi_lm.results", str(Path("results") / args.name)]
    return steps + [Step("report", report, barrier=True)]


def expected_cells(training: list[str]) -> frozenset[tuple[str, int]]:
    """The (variant, eval length) cells the evaluation of a run trained with these overrides scores (its
    evaluation's cells()): what they set of the task, its length and eval.* (the seed sets none of it)."""
    return _cells(tuple(a for a in training if not a.startswith("seed=")))


@functools.cache
def _cells(training: tuple[str, ...]) -> frozenset[tuple[str, int]]:
    cfg = compose("train", list(training))
    lengths = eval_lengths(int(cfg.train.seq_len), cfg.eval.multipliers, cfg.eval.lengths)
    task = build_task(str(cfg.task_name), OmegaConf.to_container(cfg.task, resolve=True))
    variants = ["", *(label for label, _ in task.variants())]
    return frozenset((variant, length) for variant in variants for length in lengths)


@functools.cache
def committed_cells(csv: Path):
    return read_task_results(csv)


def made_elsewhere(args: argparse.Namespace, run: str, training: list[str]) -> bool:
    """Whether `run` (with --keep-committed) has no folder here but every cell of its evaluation in the committed
    tasks.csv, all from one set of weights: a run of an earlier part of the suite, trained on another machine."""
    csv = ROOT / "results" / args.name / TASKS_CSV
    if not args.keep_committed or (ROOT / args.runs / args.name / run).exists() or not csv.is_file():
        return False
    rows = committed_cells(csv)
    mine = rows[rows["run"].astype(str) == str(Path(args.runs) / args.name / run)]
    cells = set(zip(mine["variant"], mine["eval_len"].astype(int)))
    return mine["weights"].nunique() == 1 and expected_cells(training) <= cells


TRAINING_CSV = "training.csv"  # in results/<name>/: every validation of every run, kept across machines


def validations_here(runs_dir: Path):
    """One row per validation of every run here (its log.jsonl: step, answer accuracy at L), with the run's last
    training loss, step of solving and training seconds (status.json); a run not yet validated has one blank row."""
    import pandas as pd

    rows = []
    for run in sorted(p for p in runs_dir.glob("*") if (p / "log.jsonl").is_file()):
        log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines() if line.strip()]
        status = json.loads((run / "status.json").read_text()) if (run / "status.json").is_file() else {}
        common = dict(run=run.name, last_loss=log[-1]["loss"] if log else None, solved_at=status.get("solved_at_step"),
                      train_seconds=status.get("train_seconds"))
        validations = [dict(common, step=r["step"], val_acc=r["val_acc"]) for r in log if "val_acc" in r]
        rows += validations or [dict(common, step=None, val_acc=None)]
    return pd.DataFrame(rows, columns=["run", "step", "val_acc", "last_loss", "solved_at", "train_seconds"])


def table_row(cells) -> str:
    return "| " + " | ".join(map(str, cells)) + " |"


def training_curves(name: str, runs_dir: Path) -> str:
    """training.md (and training.csv, its data): each run's answer accuracy at L on the validation batches at every
    validation step, and its final training loss: how far each scheme got, and whether it jumped past the plateau
    that associative-recall tasks sit on before they are learned (the step budget was chosen from these curves).
    The runs here are read from their folders; the rows of runs not here (an earlier part of the suite, trained
    on another machine) are kept from training.csv."""
    import pandas as pd

    results = ROOT / "results" / name
    here = validations_here(runs_dir)
    earlier = pd.read_csv(results / TRAINING_CSV) if (results / TRAINING_CSV).is_file() and \
        (results / TRAINING_CSV).stat().st_size else here.iloc[:0]
    table = pd.concat([earlier[~earlier["run"].isin(here["run"])], here]).sort_values(["run", "step"], kind="stable")
    table = table.astype({"step": "Int64", "solved_at": "Int64"})  # 250, not 250.0: blanks stay blank
    atomic_write_text(results / TRAINING_CSV, table.to_csv(index=False))
    steps = sorted(int(s) for s in table["step"].dropna().unique())
    scored = results / TASKS_CSV  # each cell's wall time: the run's evaluation cost
    cells = pd.read_csv(scored) if scored.is_file() else pd.DataFrame(columns=["run", "wall_s"])
    lines = [f"# results/{name}: answer accuracy at L during training", "",
             "Validation answer-token accuracy at L (4 fixed batches) at each validation step, from each run's "
             f"log.jsonl, kept in {TRAINING_CSV} (written by `python scripts/tasks.py`; a blank: not reached yet, or "
             "past the step where the run solved the task: `solved at`, the first validation at or above "
             "train.stop_at_accuracy, where its training ended), its training and evaluation time (status.json's "
             "train_seconds, the wall_s of its rows in tasks.csv).", "",
             table_row(["run", *steps, "solved at", "last loss", "train min", "eval min"]), "|---" * (len(steps) + 5) + "|"]
    for run, rows in table.groupby("run", sort=True):
        acc = {int(r.step): r.val_acc for r in rows.itertuples() if pd.notna(r.step)}
        last = rows.iloc[-1]
        loss = f"{last.last_loss:.3f}" if pd.notna(last.last_loss) else ""
        solved = f"{int(last.solved_at)}" if pd.notna(last.solved_at) else ""
        train = f"{last.train_seconds / 60:.1f}" if pd.notna(last.train_seconds) and last.train_seconds else ""
        evaluation = cells.loc[cells["run"].astype(str).str.endswith(f"/{run}"), "wall_s"].sum()
        lines.append(table_row([run, *(f"{acc[s]:.2f}" if s in acc else "" for s in steps), solved, loss, train,
                                f"{evaluation / 60:.1f}"]))
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    args = arguments(argv)
    runs_dir = ROOT / args.runs / args.name

    def write_training_curves() -> None:  # from the runs here and, on a fresh clone, training.csv alone
        if runs_dir.is_dir() or (ROOT / "results" / args.name / TRAINING_CSV).is_file():
            atomic_write_text(ROOT / "results" / args.name / "training.md", training_curves(args.name, runs_dir))

    drive("tasks.py", args.name, plan(args), args, lambda: "synthetic (no data set)", argv, write_training_curves)


if __name__ == "__main__":
    main()
