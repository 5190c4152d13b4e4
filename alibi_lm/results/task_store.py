"""results/<experiment>/tasks.csv: one row per scored cell of a synthetic task (KEY), written and read as the
perplexity rows are (alibi_lm.results.store: locked, atomic; re-scoring a cell replaces its row)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from ..errors import UserError
from ..tasks import TASKS
from ..tasks.base import TaskOptions
from .store import extension_problem, key_text, read_table, replace_keyed, row_keys
from .tables import TableSchema, register_table

TASKS_CSV = "tasks.csv"
# task_options: the options that differ from the task's defaults ("distractors=3"), empty for the defaults;
# positions: sequential, or random-<M>; variant: '' for the task as trained, else an evaluation setting
# ("depth=0.25"); rope_scaling: an extension's label (extension=<method>, as perplexity rows name it), '' for none:
# the row's cell
KEY = ["task", "task_options", "position", "positions", "train_len", "eval_len", "variant", "seed", "rope_scaling"]
# a row of a task's main table in tasks.md (one scheme, its positions and extension, at one L), over its seeds and
# lengths: the cell a finding past L is stated on
TABLE_CELL = [k for k in KEY if k not in ("eval_len", "variant", "seed")]
OPTIONAL_KEY = ("task_options", "variant", "rope_scaling")  # may be empty; rope_scaling absent from older tables
METRICS = ["token_acc", "exact", "greedy", "greedy_agree", "loss", "chance_token", "chance_exact", "examples", "answers"]
# batch_sequences: the test sequences per batch, which with examples and the length says which sequences a row scored
# (empty in rows written before it was recorded)
COLUMNS = [*KEY, *METRICS, "batch_sequences", "note", "run", "step", "weights", "model", "commit", "device", "wall_s",
           "timestamp", "command"]
REMEDY = "re-run the evaluation"


def task_problem(value: str) -> str | None:
    """None for a task the registry holds (a row of any other would make a report section, and plots, of its own)."""
    return None if value in TASKS else f"a registered task: {', '.join(TASKS)}"


register_table(TableSchema(TASKS_CSV, tuple(COLUMNS), integers=("train_len", "eval_len", "seed", "step", "examples", "answers",
                                                                 "batch_sequences"),
                           numbers=(*METRICS, "wall_s"), filled=tuple(k for k in KEY if k not in OPTIONAL_KEY),
                           labels=(("task", task_problem), ("rope_scaling", extension_problem)), remedy=REMEDY))


def options_label(options: TaskOptions) -> str:
    """The options that differ from the defaults, "key=value" joined by ";" (empty: the task as registered)."""
    default = type(options)()
    return ";".join(f"{f.name}={getattr(options, f.name)}" for f in dataclasses.fields(options)
                    if getattr(options, f.name) != getattr(default, f.name))


def read_task_results(path: Path) -> pd.DataFrame:
    df = read_table(path, REMEDY, what="task results table", columns=COLUMNS)
    if "rope_scaling" not in df:  # written before extension= reached the tasks: every row without a method
        df["rope_scaling"] = ""
    if missing := [k for k in KEY if k not in df]:
        raise UserError(f"{path} lacks the columns {missing}; it was not written by alibi_lm's task evaluation")
    df = df.reindex(columns=[*COLUMNS, *(c for c in df.columns if c not in COLUMNS)])
    for col in OPTIONAL_KEY:
        df[col] = df[col].astype(object).fillna("").astype(str)
    return df


def cell_draws(path: Path, weights: str | None = None) -> dict[tuple, tuple[float, float]]:
    """Each cell's key (KEY, as key_text) -> (the sequences its row scored with answers, in batches of how many):
    examples (NaN in a row that says not applicable) and batch_sequences (NaN in older rows), for the rows from these
    weights, or every row (weights None)."""
    df = read_task_results(path)  # COLUMNS, weights among them, whatever the file has
    if weights is not None:
        df = df[df["weights"].map(key_text) == key_text(weights)]
    return dict(zip(row_keys(df, KEY), zip(df["examples"].astype(float), df["batch_sequences"].astype(float))))


def upsert_rows(path: Path, rows: list[dict]) -> pd.DataFrame:
    new = pd.DataFrame(rows).reindex(columns=COLUMNS)
    sort_by = ["task", "task_options", "positions", "position", "train_len", "variant", "seed", "eval_len"]
    return replace_keyed(path, new, KEY, read_task_results, sort_by)


# over_training.csv: the weights a run kept every train.keep_checkpoints_every steps, each scored at L, 4L and 16L
OVER_TRAINING_CSV = "over_training.csv"
OVER_KEY = ["task", "task_options", "position", "positions", "train_len", "seed", "step", "eval_len"]
OVER_COLUMNS = [*OVER_KEY, "token_acc", "exact", "examples", "batch_sequences", "run", "weights", "model", "commit",
                "device", "wall_s", "timestamp", "command"]  # model: as in tasks.csv (empty in older rows)
register_table(TableSchema(OVER_TRAINING_CSV, tuple(OVER_COLUMNS), integers=("train_len", "seed", "step", "eval_len", "examples",
                                                                               "batch_sequences"),
                           numbers=("token_acc", "exact", "wall_s"), filled=tuple(k for k in OVER_KEY if k != "task_options"),
                           labels=(("task", task_problem),), remedy=REMEDY))


def read_over_training(path: Path) -> pd.DataFrame:
    df = read_table(path, REMEDY, what="task results table over training", columns=OVER_COLUMNS)
    df = df.reindex(columns=[*OVER_COLUMNS, *(c for c in df.columns if c not in OVER_COLUMNS)])
    df["task_options"] = df["task_options"].astype(object).fillna("").astype(str)
    return df


def upsert_over_training(path: Path, rows: list[dict]) -> pd.DataFrame:
    new = pd.DataFrame(rows).reindex(columns=OVER_COLUMNS)
    return replace_keyed(path, new, OVER_KEY, read_over_training, OVER_KEY)
