"""The synthetic task suite, results/tasks/ (make tasks), committed run by run.

For every task with a chosen budget (BUDGETS), every registered position scheme and every variant of
alibi_lm/plans/variants.py, five seeds for the paper's schemes and NoPE (PAPER_SCHEMES) and three for the others:
train at lengths up to L (experiment=tasks: L = 64, 2 layers, d = 128) for the task's fixed budget of steps, the same
for every scheme (no early stop), and score at L..16L on 1,024 test sequences per cell (the passkey also on its depth
grid); the schemes of --random-schemes also with randomized positions (train.positions=random, M = 16L), three
seeds. The paper's schemes and NoPE keep their weights every BUDGETS[task].keep_every steps, scored at L, 4L and 16L
(over_training.csv: accuracy past L against training steps). Then the tables and heatmaps (tasks.md), RUN_INFO.md
(every invocation's hardware and commit, each step's command and wall time) and training.md (each run's exact match
at L at every validation, and the step where it first met the criterion, from training.csv).

Resumable: trained runs are skipped, scored cells are not scored again. --keep-committed does not train the runs
finished elsewhere (an earlier part, another machine: their step ended well in RUN_LOG.jsonl, begun by a command that
trains the same model, and every cell is in results/<name>/); --commit commits results/<name>/ after every run that
finishes, so that a part stopped at any moment loses at most the runs under way;
--stop-starting-after ends a part with whole runs. The estimate of the plan is printed first.

    python scripts/tasks.py --jobs 1 --keep-committed --commit        # the suite, in the background, for days
    python scripts/tasks.py --dry-run                                 # the plan and its estimate
    python scripts/tasks.py --tasks flipflop --schemes alibi,rope --seeds 0 --name tasks-try   # a subset elsewhere
"""

from __future__ import annotations

import argparse
import functools
import re
import shlex
import sys
import time
from collections import defaultdict
from pathlib import Path
from statistics import median
from typing import NamedTuple

from omegaconf import OmegaConf

from alibi_lm.checkpoint import read_status
from alibi_lm.config import compose, to_job
from alibi_lm.errors import ArgumentParser, ConfigError, UserError, check_name
from alibi_lm.eval.scoring import eval_lengths
from alibi_lm.model import position_label
from alibi_lm.positions import POSITION_SCHEMES
from alibi_lm.results.task_store import TASKS_CSV, read_task_results
from alibi_lm.tasks import TASKS, build_task
from alibi_lm.tasks.budgets import BUDGETS, PAPER_SCHEMES, SUITE_EXPERIMENT, kept_every
from alibi_lm.training.run_log import (
    RUN_LOG,
    changes,
    ended_commands,
    ended_well_steps,
    logged_settings,
    model_settings,
    same_model,
    whole_attempt_seconds,
)

from ..cli import number, number_list, one_line_errors
from . import checkout_root
from .driver import add_modes, add_precision, add_start_limit, comma_lists, drive, names, precision_override
from .finished_commit import commit_finished
from .steps import Step, trained_run_finished
from .training_curves import TRAINING_CSV, training_curves
from .variants import VARIANTS, check_extra, model_overrides, overrides, run_label

ROOT = checkout_root()  # results/, runs/

SYNTHETIC = [name for name, task in TASKS.items() if task.synthetic]
PAPER_SEEDS, OTHER_SEEDS = "0,1,2,3,4", "0,1,2"
# the paper's four and FIRE (Zhou et al.); not NoPE: with no positions to randomize, its randomized run trains the very
# same weights (passkey, seed 0: weights f2c888d6bf1d0c77 either way, results/tasks/tasks.csv), so it would only cost
RANDOM_SCHEMES = "sinusoidal,rope,t5,alibi,fire"
SECONDS_PER_STEP = 0.16  # one thread of the AMD EPYC with the cores free (results/tasks-probe/README.md)
# One run's evaluation at 1,024 sequences a cell, one thread, measured on the suite's first runs (two runs at a
# time on the 2-core AMD EPYC; RUN_INFO.md and the rows' wall_s): about 20 s a cell of tasks.csv (a length of the
# task or of one of its variants, L..16L), a minute a kept checkpoint (scored at L, 4L and 16L), and half a minute of
# retrieval and reports.
CELL_SECONDS, KEPT_SECONDS, RUN_SECONDS = 20.0, 60.0, 30.0
SEED_SUFFIX = re.compile(r"-seed\d+$")  # a run's name less it: its setting (copy-alibi-L64)
DEFAULTS = dict(tasks=",".join(t for t in SYNTHETIC if t in BUDGETS), schemes=",".join([*POSITION_SCHEMES, *VARIANTS]),
                seeds="", random_schemes=RANDOM_SCHEMES, steps=None, extra=[])


# The settings plan() gives every run (its name, folder and record follow from them) -> the flag that sets them
PLAN_KEYS = {"seed": "--seeds", "task": "--tasks", "position": "--schemes", "experiment": "another script (this one "
             "runs experiment=tasks)", "name": "--name", "paths.runs": "--runs", "train.max_steps": "--steps",
             "train.max_tokens": "--steps", "train.positions": "--random-schemes", "train.max_position": "--random-schemes",
             "train.keep_checkpoints_every": "the task's Budget (alibi_lm/tasks/budgets.py BUDGETS)"}


def arguments(argv=None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default=DEFAULTS["tasks"], help="comma-separated tasks")
    p.add_argument("--schemes", default=DEFAULTS["schemes"],
                   help="comma-separated position schemes and variants (alibi_lm/plans/variants.py)")
    p.add_argument("--seeds", type=number_list(int, 0), default=DEFAULTS["seeds"],
                   help=f"seeds of every run (default: {PAPER_SEEDS} for {','.join(PAPER_SCHEMES)}, else {OTHER_SEEDS})")
    p.add_argument("--random-schemes", default=DEFAULTS["random_schemes"],
                   help="schemes also trained with randomized positions ('' for none)")
    p.add_argument("--steps", type=number(int, 1), default=None,
                   help="training steps of every run (default: each task's BUDGETS)")
    p.add_argument("--jobs", type=number(int, 1), default=1, help="steps run at once (2 on 2 cores: one thread each)")
    p.add_argument("--name", default=None, help="the runs/ and results/ folder (default: tasks; any setting that "
                                                "differs from the suite's: tasks-custom)")
    p.add_argument("--runs", default="runs")
    add_modes(p, dry_run="print the steps and run nothing",
              status="run nothing: how many steps are finished, which are left",
              report_only="rebuild RUN_INFO.md and the report; run nothing")
    add_precision(p)
    p.add_argument("--keep-committed", action="store_true",
                   help="do not train runs finished elsewhere (an earlier part of the suite, another machine): their "
                        "step ended well in RUN_LOG.jsonl, begun by a command that trains the same model, and every "
                        "cell is in results/<name>/tasks.csv")
    add_start_limit(p)
    p.add_argument("--commit", action="store_true",
                   help="git-commit results/<name>/ after every run that finishes (only that folder, by name)")
    p.add_argument("extra", nargs="*", help="more overrides for every training, e.g. train.lr=3e-3")
    args = p.parse_args(argv)
    comma_lists(p, args, ("tasks", "schemes", "seeds", "random_schemes"))
    if unknown := [t for t in args.tasks if t not in SYNTHETIC]:
        p.error(f"unknown task(s) {unknown}; choose from {','.join(SYNTHETIC)}")
    if args.steps is None and (unbudgeted := [t for t in args.tasks if t not in BUDGETS]):
        p.error(f"task(s) {','.join(unbudgeted)} have no budget chosen yet (alibi_lm/tasks/budgets.py BUDGETS, from their "
                f"probes); give --steps N (and a --name of their own), or run {','.join(BUDGETS)}")
    if unknown := [s for s in args.schemes if s not in POSITION_SCHEMES and s not in VARIANTS]:
        p.error(f"unknown scheme(s) {unknown}; choose from {','.join([*POSITION_SCHEMES, *VARIANTS])}")
    if unknown := [s for s in args.random_schemes if s not in POSITION_SCHEMES]:
        p.error(f"unknown --random-schemes {unknown}; choose from {','.join(POSITION_SCHEMES)}")
    if taken := [o for o in args.extra if o.lstrip("+~").split("=", 1)[0] in PLAN_KEYS]:
        key = taken[0].lstrip("+~").split("=", 1)[0]
        p.error(f"the extra override {taken[0]} sets {key}, which the plan sets for every run itself (its folder and "
                f"record would name another run than it trains): use {PLAN_KEYS[key]}")
    check_extra(p, args.schemes, "tasks", 64, args.extra, args.tasks)
    changed = args.steps is not None or args.extra  # a subset is the suite's cells; other settings are not
    args.name = args.name or ("tasks-custom" if changed else "tasks")
    try:  # results/<name>/ gets RUN_INFO.md before the first training would refuse the name: refuse it first
        check_name("--name", args.name)
    except ConfigError as e:
        p.error(str(e))
    return args


def seeds_of(args: argparse.Namespace, scheme: str, random: bool) -> list[str]:
    """--seeds, else five seeds for the paper's schemes and NoPE trained with sequential positions, three otherwise."""
    if args.seeds:
        return args.seeds
    return names(PAPER_SEEDS if scheme in PAPER_SCHEMES and not random else OTHER_SEEDS)


def budget_overrides(args: argparse.Namespace, task: str, scheme: str, random: bool) -> list[str]:
    """train.max_steps of the task's budget (or --steps), and for the paper's schemes and NoPE (sequential) the
    interval of kept checkpoints: the budget is written into every run's command, so its rows say how it trained."""
    steps = args.steps or BUDGETS[task].steps  # a task without a budget is run only with --steps
    keep = kept_every(task, scheme, "random" if random else "sequential") if args.steps is None else None
    return [f"train.max_steps={steps}", *([f"train.keep_checkpoints_every={keep}"] if keep else [])]


def plan(args: argparse.Namespace) -> list[Step]:
    """One training step per run (its evaluate_after scores it), seed by seed: every task and scheme of a seed,
    then its randomized runs, before the next seed (an unfinished suite has whole seeds); the report last."""
    # results/<name>/ for every --name: another folder than the experiment's own goes beside the runs unless told
    own = [] if args.name == SUITE_EXPERIMENT else ["paths.results=results"]
    common = ["experiment=tasks", f"name={args.name}", *own, f"paths.runs={args.runs}", "train.resume=auto",
              "train.progress=false", *precision_override(args), *args.extra]
    every_seed = sorted({seed for s in args.schemes for r in (False, True) for seed in seeds_of(args, s, r)}, key=int)
    steps, elsewhere, trained_by = [], [], ended_commands(ROOT / "results" / args.name / RUN_LOG)
    named: dict[str, set[str]] = {}  # a variant -> the labels its runs and rows are named by (irope: rope+nope2)
    keeping, again = argparse.Namespace(**{**vars(args), "keep_committed": True}), []  # committed, trained again
    for seed in every_seed:
        for random in (False, True):
            for task in args.tasks:
                for scheme in args.random_schemes if random else args.schemes:
                    if (random and scheme not in args.schemes) or seed not in seeds_of(args, scheme, random):
                        continue
                    # extra may label it: fox+gate_bias_init5
                    model = model_args(scheme, task, args)
                    label = task_label(scheme, task, tuple(model), tuple(args.extra))
                    if label != scheme:
                        named.setdefault(scheme, set()).add(label)
                    run = f"{task}-{label}{'-random' if random else ''}-L64-seed{seed}"
                    positions = ["train.positions=random", "train.max_position=1024"] if random else []
                    if random and scheme == "learned":
                        positions.append("position.max_len=1024")  # a row for every position it may be given
                    command = [sys.executable, "-m", "alibi_lm.train", f"task={task}", *model,
                               f"seed={seed}", *positions, *budget_overrides(args, task, scheme, random), *common]
                    if args.steps is not None or args.extra:  # settings of the user's (the suite's own: below)
                        check_same_training(args.name, run, trained_by.get(f"train {run}"), command[3:])
                    if made_elsewhere(args, run, command[3:]):
                        elsewhere.append(run)
                        continue
                    if not args.keep_committed and made_elsewhere(keeping, run, command[3:]):
                        again.append(run)
                    done = trained_run_finished(command, Path(args.runs) / args.name / run, ROOT)
                    steps.append(Step(f"train {run}", command, makes=run, done=done))
    for scheme, labels in named.items():
        print(f"note: {scheme}'s runs and rows are named {', '.join(sorted(labels))} (the label of what it trains)")
    if again:
        print(f"note: {len(again)} of these run(s) have every cell in results/{args.name}/{TASKS_CSV} (trained "
              f"elsewhere) and are planned to be trained again here; --keep-committed skips them")
    if elsewhere:
        print(f"note: {len(elsewhere)} run(s) have every cell in results/{args.name}/{TASKS_CSV} and no finished "
              f"training here (trained elsewhere): not trained again")
    report = [sys.executable, "-m", "alibi_lm.results", str(Path("results") / args.name)]
    return steps + [Step("report", report, barrier=True)]


def model_args(scheme: str, task: str, args: argparse.Namespace) -> list[str]:
    """The overrides that make the scheme or variant on the task's model: experiment=tasks' depth, or the task's
    Budget.layers (with model.n_layer, and iRoPE's NoPE layer the last of them)."""
    layers = BUDGETS[task].layers if task in BUDGETS and args.steps is None else None
    if layers is None:
        return overrides(scheme, "tasks", 64)
    return [*model_overrides(scheme, layers, 64), f"model.n_layer={layers}"]


@functools.cache
def task_label(scheme: str, task: str, model: tuple[str, ...], extra: tuple[str, ...]) -> str:
    """The position label the train app names the run's folder with (rope+nope4-w32; fox+gate_bias_init5)."""
    if not any(a.startswith("model.n_layer=") for a in model):
        return run_label(scheme, "tasks", 64, extra, (f"task={task}",))
    job = to_job(compose("train", ["experiment=tasks", "train.seq_len=64", f"task={task}", *model, *extra]))
    return position_label(job.model)


class RecordedTimes(NamedTuple):
    """Wall seconds of the runs a results folder's RUN_LOG.jsonl records trained and scored whole in one attempt."""
    by_setting: dict[tuple[str, str], list[float]]  # (the run less its seed: copy-alibi-L64, its budget)
    by_task: dict[tuple[str, bool, str], list[float]]  # (its task, whether it kept checkpoints, its budget)


def estimate(steps: list[Step], recorded: RecordedTimes | None = None, jobs: int = 1) -> str:
    """The plan's cost before it starts: the runs left (not those whose step is done: trained and scored here) and
    their one-thread hours. A run takes the median wall time of the recorded runs of its setting, else of its task
    (recorded_times), else modelled_seconds."""
    done = {s.name for s in steps if s.makes and s.done is not None and s.done()}
    runs = [s for s in steps if s.makes and s.name not in done]
    budget = sum(int(setting(s, "train.max_steps", 0)) for s in runs)
    times = {s.name: recorded_times(s, recorded or RecordedTimes({}, {})) for s in runs}
    by = {source: [median(t) for kind, t in times.values() if kind == source] for source in ("setting", "task")}
    modelled = [s for s in runs if times[s.name][0] is None]
    total = sum(by["setting"]) + sum(by["task"]) + sum(modelled_seconds(s) for s in modelled)
    model = (f"{SECONDS_PER_STEP} s a step of the 2-layer model, {CELL_SECONDS:.0f} s a cell of 1,024 sequences and "
             f"{KEPT_SECONDS:.0f} s a kept checkpoint; shared cores take 2-5x longer")
    wall = f" ({total / jobs / 3600:.0f} h at --jobs {jobs})" if jobs > 1 else ""
    head = (f"estimate: {len(runs)} run(s) to train ({budget:,} training steps): about {total / 3600:.0f} h of "
            f"one-thread time{wall}")
    skipped = (f"the plan's {len(done)} run(s) trained and scored here already are not counted" if done
               else "runs already trained here are skipped when due")
    if not by["setting"] and not by["task"]:
        return f"{head}, {sum(eval_seconds(s) for s in modelled) / 3600:.0f} h of it evaluation (at {model}; {skipped})"
    parts = [f"{len(by['setting'])} at the median wall time of their setting's runs (any seed, the same budget) that "
             f"{RUN_LOG} records whole, {len(by['task'])} at that of their task's (the same kept checkpoints and "
             f"budget): one thread a job, as they ran"]
    if modelled:
        parts.append(f"{len(modelled)} at {model}")
    return f"{head}: {'; '.join([*parts, skipped])}"


def modelled_seconds(step: Step) -> float:
    """One run, one thread with the cores free: SECONDS_PER_STEP for the 2-layer model, in proportion to the task's
    depth, and its evaluation (eval_seconds)."""
    depth = int(setting(step, "model.n_layer", 2))
    return int(setting(step, "train.max_steps", 0)) * SECONDS_PER_STEP * depth / 2 + eval_seconds(step)


def recorded_seconds(name: str) -> RecordedTimes:
    """The wall seconds of results/<name>/'s runs trained and scored whole in one attempt (whole_attempt_seconds), by
    setting and by task (RecordedTimes): the runs were timed on one thread a job, on whatever machine trained them."""
    recorded = RecordedTimes(defaultdict(list), defaultdict(list))
    for step, (command, seconds) in whole_attempt_seconds(ROOT / "results" / name / RUN_LOG).items():
        if step.startswith("train "):
            run, words = step.removeprefix("train "), shlex.split(command)
            steps_of = command_value(words, "train.max_steps", "")
            recorded.by_setting[(SEED_SUFFIX.sub("", run), steps_of)].append(seconds)
            recorded.by_task[(command_value(words, "task", ""), keeps_checkpoints(words), steps_of)].append(seconds)
    return recorded


def recorded_times(step: Step, recorded: RecordedTimes) -> tuple[str | None, list[float]]:
    """("setting", the recorded seconds of runs of this step's setting and budget), else ("task", those of its task
    with its kept checkpoints and budget), else (None, [])."""
    steps_of = setting(step, "train.max_steps", "")
    if times := recorded.by_setting.get((SEED_SUFFIX.sub("", step.makes), steps_of)):
        return "setting", times
    if times := recorded.by_task.get((setting(step, "task", ""), keeps_checkpoints(step.command), steps_of)):
        return "task", times
    return None, []


def keeps_checkpoints(command: list[str]) -> bool:
    return any(a.startswith("train.keep_checkpoints_every=") for a in command)


def command_value(command: list[str], key: str, default):
    """The value of `key=` in a command's words, else default."""
    return next((a.split("=", 1)[1] for a in command if a.startswith(f"{key}=")), default)


def setting(step: Step, key: str, default):
    """The value of `key=` in a step's command, else default."""
    return command_value(step.command, key, default)


@functools.cache
def eval_length_count() -> int:
    """How many lengths experiment=tasks scores (its eval.multipliers)."""
    return len(compose("train", ["experiment=tasks"]).eval.multipliers)


def eval_seconds(step: Step) -> float:
    """One run's evaluation, one thread: its cells (each length of the task and of its variants), its kept
    checkpoints, retrieval and the reports."""
    cells = eval_length_count() * (1 + len(build_task(setting(step, "task", "")).variants()))
    keep_every = int(setting(step, "train.keep_checkpoints_every", 0))
    # the last kept step is the run's own weights, whose cells are taken, not scored again
    kept = max(int(setting(step, "train.max_steps", 0)) // keep_every - 1, 0) if keep_every else 0
    return CELL_SECONDS * cells + KEPT_SECONDS * kept + RUN_SECONDS


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


def check_same_training(name: str, run: str, made_by: str | None, training: list[str]) -> None:
    """A UserError where results/<name>/ holds `run` trained to the end by a command that trains another model
    (another budget, learning rate, depth; RUN_LOG.jsonl) than this plan's, given settings of the user's (--steps,
    extra overrides): training it again would replace its rows by a trial's under the suite's name. A plan with the
    suite's own settings (BUDGETS) trains such a run again: the suite's protocol changed since."""
    if made_by is None or same_model(made_by, training):
        return
    changed = changes(logged_settings(made_by), model_settings(tuple(training)))
    raise UserError(f"results/{name}/ holds {run} trained with other settings ({changed}); training it again here "
                    f"would replace its rows: give --name <a folder of its own>")


def made_elsewhere(args: argparse.Namespace, run: str, training: list[str]) -> bool:
    """Whether `run` (with --keep-committed) has no finished training here but was trained and scored to the end on
    another machine: its step's latest attempt ended well there (RUN_LOG.jsonl: its kept checkpoints and retrieval scored
    too), begun by a command that trains the same model as this plan's (same_model: not another budget),
    and every cell of its evaluation is in the committed tasks.csv, all from one set of weights. A run this
    machine left part-way meanwhile is skipped too (its folder left as it is); one that finished training here never
    is: what its evaluation has not scored yet is scored."""
    results = ROOT / "results" / args.name
    here = ROOT / args.runs / args.name / run
    if not args.keep_committed or read_status(here)["status"] == "completed" or not (results / TASKS_CSV).is_file():
        return False
    made_by = ended_commands(results / RUN_LOG).get(f"train {run}")
    if made_by is None or not same_model(made_by, training):
        return False  # not finished there, or trained there by another command (another budget): trained here
    rows = committed_cells(results / TASKS_CSV)
    mine = rows[rows["run"].astype(str) == str(Path(args.runs) / args.name / run)]
    cells = set(zip(mine["variant"], mine["eval_len"].astype(int)))
    return mine["weights"].nunique() == 1 and expected_cells(training) <= cells


def runs_ended_well(name: str) -> dict[str, int]:
    """The runs of results/<name>/ whose training step (training, then its cells, kept checkpoints and retrieval)
    ended well in its latest attempt, on this machine or another -> the index of that end in RUN_LOG.jsonl."""
    return {step.removeprefix("train "): index for step, index in ended_well_steps(ROOT / "results" / name / RUN_LOG).items()
            if step.startswith("train ")}


def commit_results(name: str, done_before: dict[str, int]) -> dict[str, int]:
    """--commit: git-commit results/<name>/ (that folder alone) when runs' steps ended well since `done_before`
    (runs_ended_well: a run whose first cells are written is not finished while its kept checkpoints are scored; a
    run trained again ends anew), without the rows of runs still under way (finished_commit); the runs finished now.
    A busy index (another commit under way) is retried for a minute; a commit that cannot be made says so and is
    left to the next finished run."""
    folder = Path("results") / name
    done = runs_ended_well(name)
    new = sorted(run for run, index in done.items() if done_before.get(run) != index)
    if not new:
        return done
    message = f"{name}: {', '.join(new)} ({len(done)} runs in results/{name})"
    for _ in range(12):
        if (why := commit_finished(ROOT, folder, message)) is None:
            return done
        time.sleep(5)  # .git/index.lock, or HEAD moved: another commit is under way
    print(f"warning: {folder} not committed for a minute ({why}); the next finished run commits it",
          file=sys.stderr, flush=True)
    return done_before


def main(argv=None) -> None:
    args = arguments(argv)
    runs_dir = ROOT / args.runs / args.name
    with one_line_errors():
        steps = plan(args)
    print(estimate(steps, recorded_seconds(args.name), args.jobs))
    committed = [runs_ended_well(args.name)]

    def after_step() -> None:  # from the runs here and, on a fresh clone, training.csv alone
        if runs_dir.is_dir() or (ROOT / "results" / args.name / TRAINING_CSV).is_file():
            training_curves(ROOT / "results" / args.name, runs_dir)
        if args.commit:
            committed[0] = commit_results(args.name, committed[0])

    drive("tasks.py", args.name, steps, args, lambda: "synthetic (no data set)", argv, after_step)


if __name__ == "__main__":
    main()
