"""results/<experiment>/retrieval.csv: each head's attention on the token an answer copies, by distance (measured by
alibi_lm/eval/retrieval.py), and what the task report reads from it: each head's curve, its reach (the farthest
distance bin at which it still puts REACH_ATTENTION on the source) and, for heads with a slope, slope x reach."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .store import key_text, read_table, replace_keyed, row_keys
from .tables import TableSchema, register_table
from .task_store import REMEDY

RETRIEVAL_CSV = "retrieval.csv"
KEY = ["task", "task_options", "position", "positions", "train_len", "eval_len", "seed", "distance", "layer", "head"]
# model: the model's digest (provenance.model_digest), as in tasks.csv: a row is replaced only by one of the same
# model (results.store.check_same_model); empty in rows written before it was recorded
COLUMNS = [*KEY, "attention", "token_acc", "answers", "slope", "run", "step", "weights", "model", "commit", "device",
           "wall_s", "timestamp", "command"]
register_table(TableSchema(RETRIEVAL_CSV, tuple(COLUMNS), integers=(*KEY[4:], "answers", "step"),
                           numbers=("attention", "token_acc", "slope", "wall_s"),
                           filled=tuple(k for k in KEY if k != "task_options"), key=tuple(KEY), positive=("distance",),
                           remedy=REMEDY))
# A head may read the copied token through its neighbour (s + 1, which the first layer told what precedes it): the
# measured attention is the mass on s - 1 .. s + 1. Seen in the passkey's 2-layer ALiBi model: a retrieval head
# split 0.36 / 0.58 between a digit and the one after it.
SOURCE_WINDOW = 1
REACH_ATTENTION = 0.5  # a head "reaches" a distance where its mean attention on the copied token is at least this


def distance_bin(distance: np.ndarray) -> np.ndarray:
    """The lower edge of each distance's power-of-two bin: 1, 2, 2, 4, 4, 4, 4, 8, ..."""
    return 2 ** np.floor(np.log2(np.maximum(distance, 1))).astype(np.int64)


def read_retrieval(path: Path) -> pd.DataFrame:
    df = read_table(path, REMEDY, what="retrieval table", columns=COLUMNS)
    df = df.reindex(columns=[*COLUMNS, *(c for c in df.columns if c not in COLUMNS)])  # an older table: its order
    df["task_options"] = df["task_options"].astype(object).fillna("").astype(str)
    return df


def measured_lengths(path: Path, identity: dict, weights: str) -> set[str]:
    """The eval lengths (as key_text) at which retrieval.csv holds this run's rows from these weights: read once for
    all lengths, the other runs' rows dropped first (a row per distance, layer and head: the biggest table)."""
    df = read_retrieval(path)
    df = df[df.reindex(columns=["weights"])["weights"].map(key_text) == key_text(weights)]  # none: an old table
    run = tuple(key_text(v) for v in identity.values())
    return {key[-1] for key in row_keys(df, [*identity, "eval_len"]) if key[:-1] == run}


def has_rows(path: Path, identity: dict, eval_len: int, weights: str) -> bool:
    """Whether retrieval.csv holds this run's rows at eval_len from these weights."""
    return key_text(eval_len) in measured_lengths(path, identity, weights)


def write_rows(path: Path, rows: list[dict]) -> None:
    """Replace this run's rows at their eval length (bins that no longer occur go too) with `rows`."""
    new = pd.DataFrame(rows).reindex(columns=COLUMNS)
    stale = [k for k in KEY if k not in ("distance", "layer", "head")]
    sort_by = ["task", "task_options", "positions", "position", "train_len", "seed", "eval_len", "distance", "layer",
               "head"]
    replace_keyed(path, new, stale, read_retrieval, sort_by)


def attention_curves(part: pd.DataFrame) -> pd.DataFrame:
    """(layer, head) x distance bin: the mean attention on the source over `part`'s rows (one scheme; pooled over
    their seeds and eval lengths, weighted by answers)."""
    weighted = part.assign(mass=part["attention"] * part["answers"])
    grouped = weighted.groupby(["layer", "head", "distance"])[["mass", "answers"]].sum()
    return (grouped["mass"] / grouped["answers"]).unstack("distance")


def reach(curves: pd.DataFrame) -> pd.Series:
    """Per (layer, head): the largest distance bin whose attention >= REACH_ATTENTION; 0 where none is."""
    reached = curves.ge(REACH_ATTENTION)
    return pd.Series([max((int(d) for d, ok in row.items() if ok), default=0) for _, row in reached.iterrows()],
                     index=curves.index, dtype=float)


def reach_by_seed(part: pd.DataFrame) -> pd.DataFrame:
    """(layer, head) x seed: each seed's reach (its own curves)."""
    return pd.DataFrame({seed: reach(attention_curves(rows)) for seed, rows in part.groupby("seed")})


def best_heads(part: pd.DataFrame) -> pd.DataFrame:
    """One scheme's rows -> per seed (index): its own best head ("layer.head": the most attention on the source summed
    over distances), that head's curve (a column per distance bin) and its reach. Heads are compared within a run
    only: head 1.2 of one seed has nothing in common with head 1.2 of another (fixed ALiBi slopes aside)."""
    out = {}
    for seed, rows in part.groupby("seed"):
        curves = attention_curves(rows)  # (layer, head) x distance
        layer, head = curves.sum(axis=1).idxmax()
        out[seed] = {"head": f"{layer}.{head}", **curves.loc[(layer, head)], "reach": reach(curves).loc[(layer, head)]}
    return pd.DataFrame.from_dict(out, orient="index")


def sloped_heads(part: pd.DataFrame) -> pd.DataFrame:
    """The heads of one scheme's rows that have a slope (ALiBi's layers, also in a mix): per (layer, head), the curve
    pooled over seeds and, per seed, its slope, reach and slope x reach (each seed's own learned slope)."""
    rows = part[part["slope"].notna()]
    if rows.empty:
        return pd.DataFrame()
    curves, reaches = attention_curves(rows), reach_by_seed(rows)
    slopes = rows.groupby(["layer", "head", "seed"])["slope"].first().unstack("seed")  # (layer, head) x seed
    return pd.concat({"curve": curves, "reach": reaches, "slope": slopes, "slope_x_reach": slopes * reaches}, axis=1)
