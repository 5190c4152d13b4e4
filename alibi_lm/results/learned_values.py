"""results/<experiment>/learned.csv: the learned scalars of every evaluated run beside their initial values
(TransformerLM.learned_values: learned ALiBi slopes, FIRE's threshold L_thr and c, Scalable-Softmax's s per layer
and head), so that where they go is read from committed rows, not from run folders. The evaluation of a trained
run (language modelling or a synthetic task) writes them; the reports show them per scheme, mean ± std over
seeds (learned_table).
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import torch

from ..positions import build_position_scheme
from ..provenance import command_line
from .markdown import cell_text, markdown_table
from .store import key_text, read_table, replace_keyed, row_keys, scheme_order
from .tables import TableSchema, register_table
from .task_store import REMEDY

LEARNED_CSV = "learned.csv"
KEY = ["task", "task_options", "position", "positions", "train_len", "seed", "name"]
COLUMNS = [*KEY, "value", "initial", "run", "step", "weights", "commit", "timestamp", "command"]
register_table(TableSchema(LEARNED_CSV, tuple(COLUMNS), integers=("train_len", "seed", "step"), numbers=("value", "initial"),
                           filled=tuple(k for k in KEY if k != "task_options"), key=tuple(KEY), remedy=REMEDY))


def initial_values(model) -> dict[str, float]:
    """learned_values() as the model started them: its scheme built afresh with the same options (torch's random
    state untouched), Scalable-Softmax at model.ssmax_init."""
    cfg = model.cfg
    with torch.random.fork_rng(devices=[]):
        fresh = build_position_scheme(cfg.position, cfg.n_head, cfg.d_model, cfg.n_layer, **dict(cfg.position_options))
    values = dict(fresh.learned_values())
    values.update({name: float(model.cfg.ssmax_init) for name in model.learned_values() if name.startswith("ssmax_s_")})
    return values


def learned_recorded(model, results_dir: Path, identity: dict, provenance: dict) -> bool:
    """Whether learned.csv holds this run's learned values from these weights (or the model learns none)."""
    values = model.learned_values()
    if not values:
        return True
    base = {"task": "lm", "task_options": "", "positions": "sequential", **identity}
    old = read_learned(Path(results_dir) / LEARNED_CSV)
    wanted = tuple(key_text(v) for v in [*(base[k] for k in KEY[:-1]), provenance.get("weights")])
    same = row_keys(old, [*KEY[:-1], "weights"]).map(lambda key: key == wanted)  # not ==: a tuple of len(old) would pair up
    return set(old.loc[same.astype(bool), "name"]) == set(values)


def record_learned(model, results_dir: Path, identity: dict, provenance: dict) -> int:
    """Replace this run's rows of learned.csv (identity: KEY without name) by its learned values now; the count
    written (0 when it learns none, or when the rows are there from these weights: a rerun leaves the file alone)."""
    if learned_recorded(model, results_dir, identity, provenance):
        return 0
    values = model.learned_values()
    base = {"task": "lm", "task_options": "", "positions": "sequential", **identity}
    path = Path(results_dir) / LEARNED_CSV
    initial, now = initial_values(model), datetime.now(timezone.utc).isoformat(timespec="seconds")
    rows = [dict(base, name=name, value=value, initial=initial.get(name), **provenance, timestamp=now,
                 command=command_line()) for name, value in values.items()]
    new = pd.DataFrame(rows).reindex(columns=COLUMNS)
    replace_keyed(path, new, KEY[:-1], read_learned, KEY)
    return len(rows)


def read_learned(path: Path) -> pd.DataFrame:
    df = read_table(path, REMEDY, what="learned-values table", columns=COLUMNS)
    df["task_options"] = df["task_options"].astype(object).fillna("").astype(str)
    return df


def learned_table(df: pd.DataFrame, label) -> str:
    """Rows (scheme, value name), columns the initial value and each task's learned value, mean ± std (n) over
    seeds. label(row) -> the scheme's name in the table (the tasks' report marks randomized positions)."""
    df = df.assign(label=[label(r) for _, r in df.iterrows()],
                   column=[t + (f" ({o})" if o else "") for t, o in zip(df["task"], df["task_options"])])
    columns = list(dict.fromkeys(df["column"]))
    rows = []
    for scheme in scheme_order(df["label"].unique()):
        part = df[df["label"] == scheme]
        for name in dict.fromkeys(part["name"]):
            one = part[part["name"] == name]
            rows.append([scheme, name, f"{one['initial'].mean():.4g}",
                         *(cell_text(one.loc[one["column"] == c, "value"], 3) for c in columns)])
    return markdown_table(["scheme", "learned value", "initial", *columns], rows)


def learned_section(results_dir: Path, label=lambda row: row["position"]) -> list[str]:
    """The report's section on learned.csv, if the folder has one."""
    df = read_learned(Path(results_dir) / LEARNED_CSV)
    if df.empty:
        return []
    return ["## Learned values\n", "Each run's learned scalars after training (learned.csv), beside the value they "
            "started from; mean ± std (n) over seeds. ALiBi's slopes: `alibi_slope_<head>`; FIRE: `fire_threshold` "
            "(L_thr) and `fire_c`; Scalable-Softmax: `ssmax_s_<layer>_<head>`.\n", learned_table(df, label)]


__all__ = ["LEARNED_CSV", "initial_values", "learned_section", "learned_table", "read_learned", "record_learned"]
