"""Passkey retrieval on models that learned it: synthetic-task runs trained elsewhere (--task-runs, read only), each
scored at L..16L with no method and with every method its scheme takes, by the task evaluation
(eval/task_evaluation.TaskEvaluation, extension=: rows keyed by the method's label) into
results/extension/tasks.csv. Teacher-forced exact match on the task as trained (not its variants, no greedy
decoding: the suite checks that greedy equals exact), TASK_EXAMPLES sequences per cell, the same for every run.
The WikiText-2 demo models retrieve no passkey at any length, so this is where the methods' effect on retrieval
shows; the table gives Wilson 95% intervals and the relative effective length (results.task_learning's one rule)."""

from __future__ import annotations

import glob
from pathlib import Path

import pandas as pd
import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from ...config import EvalConfig
from ...costs import FirstBatchEstimate
from ...errors import UserError
from ...eval.evaluation import trained_task
from ...eval.task_evaluation import TaskEvaluation
from ...extension import OPTIONS
from ...results.markdown import markdown_table
from ...results.task_learning import effective_length, interval_text, multiple, seed_interval
from ...results.task_store import TASKS_CSV, read_task_results
from .runs import MULTIPLIERS, completed, methods_for
from .scoring import dirty_labels, label_of, weights_of
from .tables import task_rows

TASK_EXAMPLES = 1024  # sequences per cell: a Wilson interval of about +-0.03 around 0.5


def task_runs(pattern: str) -> list[Path]:
    """The run folders --task-runs names (a run folder, a folder of run folders, or a glob): completed runs of a
    synthetic task, else a one-line UserError."""
    path = Path(pattern)
    if (path / "config.yaml").is_file():
        found = [path]
    elif path.is_dir():
        found = sorted(p for p in path.iterdir() if (p / "config.yaml").is_file())
    else:
        found = sorted(Path(p) for p in glob.glob(pattern) if (Path(p) / "config.yaml").is_file())
    if not found:
        raise UserError(f"--task-runs {pattern}: no run folder there; give a run folder, a folder of them or a glob")
    for run in found:
        if trained_task(run) == "lm":
            raise UserError(f"--task-runs: {run} is a language-model run (the comparison trains those itself); give "
                            f"runs of a synthetic task (experiment=tasks task=passkey)")
        if not completed(run):
            raise UserError(f"--task-runs: {run} is not a completed run (status.json); finish its training or leave it out")
    return found


def task_methods(run: Path) -> list[str | None]:
    """None (no method) and each method the run's scheme takes."""
    return [None, *methods_for(str(OmegaConf.load(run / "config.yaml").model.position))]


def task_evaluation(run: Path, method: str | None, results: Path, examples: int, redo: set[str]) -> TaskEvaluation:
    """The task evaluation of one run under one method, its rows into results/extension/tasks.csv (skip_done, but
    for a label in redo: rows from a dirty tree)."""
    ev = EvalConfig(multipliers=MULTIPLIERS, examples=examples, skip_done=True)
    return TaskEvaluation(run, ev, results / "extension", torch.device("cpu"), progress=False,
                          skip_done=label_of(method) not in redo, extension_cfg=None if method is None else OPTIONS[method](),
                          csv=results / "extension" / TASKS_CSV)


def pending(run: Path, results: Path, examples: int) -> dict[str | None, list]:
    """Per method: the cells (variant '', task, Lv) of the task as trained still to score from these weights."""
    redo = dirty_labels(results / "extension" / TASKS_CSV, weights_of(run), read_task_results)
    out = {}
    for method in task_methods(run):
        cells = [c for c in task_evaluation(run, method, results, examples, redo).cells() if c[0] == ""]
        if cells:
            out[method] = cells
    return out


def score_task_run(run: Path, results: Path, examples: int) -> None:
    """Every pending cell of one task run, a method at a time, each row written as soon as it is scored."""
    redo = dirty_labels(results / "extension" / TASKS_CSV, weights_of(run), read_task_results)
    for method in task_methods(run):
        evaluation = task_evaluation(run, method, results, examples, redo)
        cells = [c for c in evaluation.cells() if c[0] == ""]  # the task as trained, not its variants
        print(f"== task {run.name} {method or 'no method'}: {len(cells)} cells x {examples} sequences", flush=True)
        with tqdm(total=sum(examples * length for _, _, length in cells), disable=True) as bar:  # tokens, as scored
            estimate = FirstBatchEstimate(bar, "tokens through the model", " (at the first cell; longer ones cost more)")
            for variant, task, length in cells:
                evaluation.score(variant, task, length, estimate, greedy=False)


def task_table(df: pd.DataFrame) -> str:
    """Task x scheme x method: exact match at each Lv / L (mean over seeds [95% interval: Wilson of the pooled
    sequences, or the t interval over seeds where wider]) and the relative effective length of the means."""
    if df.empty:
        return "(no task rows yet: run with --task-runs)\n"
    df = task_rows(df)
    ratios = sorted({int(r) for r in (df["eval_len"] / df["train_len"]).round()})
    rows = []
    for (task, scheme, method), part in df.groupby(["task", "position", "method"]):
        L = int(part["train_len"].iloc[0])
        stats = {r: seed_interval(part.loc[part["eval_len"] == r * L, "exact"], part.loc[part["eval_len"] == r * L,
                                                                                          "examples"]) for r in ratios}
        means = {r * L: s[0] for r, s in stats.items() if s[3]}
        length = effective_length(means, L)
        rows.append([task, scheme, method, *(interval_text(*stats[r]) for r in ratios),
                     "n/a" if length is None else multiple(length, L), str(part["seed"].nunique())])
    rows.sort(key=lambda r: (r[0], r[1], r[2] != "none", r[2]))
    return markdown_table(["task", "scheme", "method", *[f"{r}L" for r in ratios], "effective length", "seeds"], rows)
