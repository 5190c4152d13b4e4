"""The keyed CSV tables of an experiment's results: extrapolation.csv (the evaluation's, KEY), and the
reading and locked, atomic writing that the probes' passkey.csv and context_use.csv share.

results/<experiment>/extrapolation.csv holds one row per evaluated cell (KEY); re-evaluating a cell replaces its
row. attention is full, bca (eval.attention=bca: blockwise causal attention at evaluation), temperature
(eval.temperature_tuning: Llama 4's query temperature) or bca+temperature. rope_scaling is empty
but for a run evaluated with an extension past L (extension=self_extend, extension=yarn, or the older
position.scaling=yarn): the method's label (alibi_lm.extension), the same for every scheme. Also here: the queries
that the report and the plots group rows by (scheme order, protocols, cell stats).
"""

from __future__ import annotations

import dataclasses
import math
import re
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd

from ..checkpoint import atomic_write_text, folder_lock, remove_stale_temporaries
from ..config.schemas import EvalConfig
from ..errors import ConfigError, UserError
from ..extension import METHODS, OPTIONS, RESCALINGS
from ..metrics import perplexity
from ..positions import POSITION_SCHEMES
from ..provenance import HASH_COLUMNS
from .tables import LOSS_NOT_FINITE, NOTE_COLUMN, TableSchema, as_number, check_table, register_table

CSV_NAME = "extrapolation.csv"
KEY = ["position", "train_len", "eval_len", "mode", "stride", "seed", "split", "rope_scaling", "attention"]
# key columns a CSV written before they existed may lack, with their value
OPTIONAL_KEY = {"rope_scaling": "", "attention": "full"}
COLUMNS = [*KEY, "ppl", "loss", "tokens", "run", "step", "weights", "model", "data", "data_sha", "commit", "note", "wall_s",
           "device", "timestamp", "command", "key_ppl", "key_tokens", "longppl_alpha", "longppl_beta"]
# weights: provenance.weights_digest of the model scored; model: provenance.model_digest of its config;
# data_sha: the scored split's sha256 (first 16 hex digits);
# command: the command that made the row (provenance.command_line); key_ppl, key_tokens: LongPPL's key-token
# perplexity and count with its thresholds (eval.longppl; empty without it)
# Nullable integers: a missing stride (nonoverlapping) or token count (not applicable) stays <NA>.
_DTYPES = {"train_len": "Int64", "eval_len": "Int64", "stride": "Int64", "seed": "Int64", "tokens": "Int64",
           "step": "Int64", "ppl": "float64", "loss": "float64", "wall_s": "float64", "key_ppl": "float64",
           "key_tokens": "Int64", "longppl_alpha": "float64", "longppl_beta": "float64"}
# columns only some rows have, written after COLUMNS: a Hugging Face model's word count and word-level perplexity
EXTRA_COLUMNS = {"words": "integer", "word_ppl": "number"}
REMEDY = "re-run the evaluation that wrote it (python -m alibi_lm.eval run=<run folder>)"
# ppl and loss are written at full precision (pandas writes the shortest text that reads back as the same float), so
# the evaluation's ppl = perplexity(loss) reads back within float round-off: rows of older versions, which took
# the exp of a loss one rounding away, differ by a few units in the 16th digit
PPL_REL_TOL = 1e-12


@cache
def eval_setting_problem(key: str, value: str) -> str | None:
    """None when eval.<key>=value is a setting the evaluation takes (EvalConfig's own check, so that its choices
    are the one list), else its refusal: "eval.mode must be one of nonoverlapping, sliding"."""
    try:
        EvalConfig(**{key: value}, stride=1)  # a stride: eval.mode=sliding needs one, nonoverlapping takes any
    except ConfigError as e:
        return str(e).split(", got ")[0]
    return None


def attention_problem(value: str) -> str | None:
    """None for an attention label evaluation.attention_label writes: eval.attention (full, bca); with Llama 4's
    temperature tuning, "temperature" (or "temperature-a<attn_scale>-f<floor_scale>"), alone for full, else after
    "bca+"."""
    window, plus, temperature = value.partition("+")
    if not plus and value.startswith("temperature"):
        window, temperature = "full", value
    tuned = re.fullmatch(r"temperature(-a\S+-f\d+)?", temperature)
    if temperature and not tuned or plus and (window == "full" or not temperature):
        return "full or bca, alone or with temperature tuning: temperature, bca+temperature"
    if problem := eval_setting_problem("attention", window):
        return f"{problem}; with temperature tuning: temperature, bca+temperature"
    return None


def extension_problem(value: str) -> str | None:
    """None for a rope_scaling label an extension writes (its label()): '' for none, else the method (alibi_lm.extension
    METHODS) with the options given explicitly, each -<option><number> (-x<factor> for a rescaling: yarn-x4)."""
    method, _, _ = value.partition("-")
    if method not in METHODS:
        return f"empty, or an extension method: {', '.join(METHODS)}"
    keys = ["x"] if method in RESCALINGS else [f.name for f in dataclasses.fields(OPTIONS[method])]
    options = rf"(-({'|'.join(keys)})-?(\d+\.?\d*(e[+-]?\d+)?|inf|nan))*"
    if not re.fullmatch(options, value[len(method):]):
        return f"{method}, then options as -<key><number> with the keys {', '.join(keys)}"
    return None


def perplexity_problem(row: dict[str, str]) -> str | None:
    """A ppl that is not what the evaluation writes beside the row's loss: perplexity(loss) (inf past a float's range),
    or an infinite one where the note does not say the loss was not finite."""
    ppl, loss = as_number(row.get("ppl", "")), as_number(row.get("loss", ""))
    if ppl is None or math.isnan(ppl) or (math.isinf(ppl) and LOSS_NOT_FINITE in row.get(NOTE_COLUMN, "")):
        return None  # no ppl: metric_problem says whether the note explains why
    expected = None if loss is None or math.isnan(loss) else perplexity(loss)
    if math.isinf(ppl) and expected != math.inf:
        return (f"ppl is {row['ppl']!r}, but only a row whose note says {LOSS_NOT_FINITE!r}, or whose loss is past "
                f"exp's range, has an infinite ppl")
    if expected is not None and not math.isclose(ppl, expected, rel_tol=PPL_REL_TOL):
        return (f"ppl is {row['ppl']!r} but the row's loss is {row['loss']!r}, whose exp is {expected:.10g}: the "
                f"evaluation writes ppl = exp(loss)")
    return None


SCHEMA = register_table(TableSchema(
    CSV_NAME, (*COLUMNS, *EXTRA_COLUMNS),
    integers=(*(c for c, t in _DTYPES.items() if t == "Int64"), *(c for c, t in EXTRA_COLUMNS.items() if t == "integer")),
    numbers=(*(c for c, t in _DTYPES.items() if t == "float64"), *(c for c, t in EXTRA_COLUMNS.items() if t == "number")),
    filled=("position", "eval_len", "mode", "split"),  # Hugging Face: no seed, maybe no L
    # one row per cell; a perplexity (and its count) above zero, missing only where the note says why (not applicable,
    # a failed run scored on purpose): an empty ppl reads as "n/a" in the report
    key=tuple(KEY), key_defaults=tuple(OPTIONAL_KEY.items()),
    positive=("stride", "ppl", "tokens", "key_ppl", "words", "word_ppl"), metrics=("ppl",),
    # the labels only the evaluation's settings give (a position scheme may be a user's own: any name)
    labels=(("mode", lambda v: eval_setting_problem("mode", v)), ("split", lambda v: eval_setting_problem("split", v)),
            ("attention", attention_problem), ("rope_scaling", extension_problem)),
    row_checks=(perplexity_problem,), remedy=REMEDY))


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    # The same dtypes whether a row came from a dict or from the CSV, so that keys compare equal
    # (stride 16 vs 16.0, missing stride as <NA>) and integers are written without ".0"; a missing column is NaN.
    df = df.reindex(columns=[*COLUMNS, *(c for c in df.columns if c not in COLUMNS)])
    for col, missing in OPTIONAL_KEY.items():
        df[col] = df[col].astype(object).fillna(missing)
    for col in ("position", "mode", "split", *OPTIONAL_KEY):
        df[col] = df[col].astype(str)
    for col, dtype in _DTYPES.items():
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(dtype)
    return df


def has_row(csv_path: Path, key: dict, weights: str, data_sha: str) -> bool:
    """Whether the CSV already holds a row for this key (a scored or a not-applicable cell) computed from these
    weights (provenance.weights_digest) on this data (data_sha: the scored split's sha256, 16 hex digits); a row
    from other weights or data, or from before those columns existed, is not. Keys compare as replace_keyed's do."""
    return scored_key(key, weights, data_sha) in scored_keys(csv_path)


SCORED_COLUMNS = [*KEY, "weights", "data_sha"]


def scored_keys(csv_path: Path) -> set[tuple]:
    """Every row's key with its weights and data (has_row's), read once for all of a run's lengths."""
    return set(row_keys(read_results(csv_path), SCORED_COLUMNS))


def scored_targets(csv_path: Path) -> dict[tuple, float]:
    """Every row's key with its weights and data (scored_key) -> the targets it scored (tokens; NaN in a row that
    says not applicable), read once for all of a run's lengths."""
    df = read_results(csv_path)
    return dict(zip(row_keys(df, SCORED_COLUMNS), df["tokens"].astype(float))) if not df.empty else {}


def scored_key(key: dict, weights: str, data_sha: str) -> tuple:
    wanted = {**OPTIONAL_KEY, **key, "weights": weights, "data_sha": data_sha}
    return tuple(key_text(wanted[k]) for k in SCORED_COLUMNS)


def key_text(v) -> str:
    """A key value as text that compares equal whether it came from a row dict or from the CSV (16, 16.0, "16")."""
    if pd.isna(v):  # None, pd.NA, NaN
        return ""
    integral = isinstance(v, np.integer) or (isinstance(v, (float, np.floating)) and float(v).is_integer())
    return str(int(v)) if integral else str(v)


def row_keys(df: pd.DataFrame, cols: list[str]) -> pd.Series:
    """Each row's key as a tuple of key_text; a column the CSV lacks (written before it existed) reads as empty.
    Column by column (a row-wise apply builds a Series per row: seconds for a results table of thousands of rows)."""
    if df.empty:
        return pd.Series([], dtype=object)
    columns = df.reindex(columns=cols)
    texts = [[key_text(v) for v in columns[c].tolist()] for c in cols]
    return pd.Series(list(zip(*texts)), index=df.index, dtype=object)


def read_table(path: Path, remedy: str, what: str = "table", columns: list[str] = ()) -> pd.DataFrame:
    """The CSV at path as written (HASH_COLUMNS as text); no rows (with these columns) when it is missing or empty. A
    damaged one is a one-line UserError: a table with a schema (tables.py) names the line and what is wrong with it
    (TableDamaged), any other "... fix or delete it and <remedy>"."""
    path = Path(path)
    try:
        check_table(path, remedy)
        return pd.read_csv(path, dtype=HASH_COLUMNS) if path.is_file() else pd.DataFrame(columns=columns)
    except pd.errors.EmptyDataError:
        return pd.DataFrame(columns=columns)
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not a readable {what} ({str(e).splitlines()[0]}); fix or delete it and "
                        f"{remedy}") from None


def replace_keyed(path: Path, new: pd.DataFrame, key: list[str], read, sort_by: list[str] | None = None) -> pd.DataFrame:
    """Write the CSV at path (read(path): its rows) with every old row whose `key` columns equal a row of `new`'s
    dropped and `new` appended (several new rows may share a key: a curve); sorted by sort_by if given.
    Locked and atomic; the one writer of extrapolation.csv, passkey.csv and context_use.csv."""
    path = Path(path)
    with folder_lock(path.parent):  # jobs of several runs at once take turns at the CSV
        remove_stale_temporaries(path.parent, path.name)  # a killed writer's: no one else writes now
        old = read(path)
        check_same_model(path, old, new, key)
        old = old[~row_keys(old, key).isin(set(row_keys(new, key)))]
        df = pd.concat([old, new], ignore_index=True) if not old.empty else new
        if sort_by:
            df = df.sort_values(sort_by, na_position="first")
        atomic_write_text(path, df.to_csv(index=False))
    return df


def drop_rows(path: Path, read, drop) -> int:
    """Remove the rows of the CSV at path (read(path)) for which drop(df) is True; locked and atomic, as
    replace_keyed. How many it removed (the file is not rewritten when none)."""
    path = Path(path)
    if not path.is_file():
        return 0
    with folder_lock(path.parent):
        remove_stale_temporaries(path.parent, path.name)
        df = read(path)
        gone = drop(df) if not df.empty else pd.Series(False, index=df.index)
        if gone.any():
            atomic_write_text(path, df[~gone].to_csv(index=False))
    return int(gone.sum())


def check_same_model(path: Path, old: pd.DataFrame, new: pd.DataFrame, key: list[str]) -> None:
    """A row is replaced only by a row of the same model (the `model` column, provenance.model_digest): a cell
    that holds another model's row (another run folder of the same name, scheme, L and seed) is refused, so two
    models can never share a row. Rows written before the column existed (empty) may be replaced."""
    if "model" not in old or "model" not in new or old.empty:
        return
    theirs: dict[tuple, set[str]] = {}
    for cell, model in zip(row_keys(old, key), old["model"].map(key_text)):
        if model:
            theirs.setdefault(cell, set()).add(model)
    for cell, model in zip(row_keys(new, key), new["model"].map(key_text)):
        other = theirs.get(cell, set()) - {model} if model else set()
        if other:
            shown = ", ".join(f"{k}={v}" for k, v in zip(key, cell) if v != "")
            raise other_model_error(path, other, model, shown)


def other_model_error(path: Path, other: set[str], model: str, whose: str) -> UserError:
    """The one line that refuses to write a model's rows where `path` holds `other` models' rows for `whose`."""
    return UserError(f"{path} holds rows of another model ({', '.join(sorted(other))}, this one is {model}) for "
                     f"{whose}; a different model needs its own results folder: evaluate it with paths.results=<another "
                     f"folder> (or train it under another name=)")


def check_no_other_weights(csv: Path, theirs: pd.Series, provenance: dict, note: str) -> None:
    """One line that refuses a run that did not finish (scored on purpose: `note`) where `csv` holds its rows from
    other weights than provenance's (`theirs`: the weights column of its rows there), a finished training's, as a plan
    commits them."""
    other = set(theirs.map(key_text)) - {"", key_text(provenance["weights"])}
    if not other:
        return
    raise UserError(f"{csv} holds rows of {provenance['run']} from other weights ({', '.join(sorted(other))}); this "
                     f"run is being {note}, and its rows would replace that training's: score it into "
                     f"paths.results=<another folder>, or finish its training first (train.resume=auto)")


def check_planned_rows(csv_path: Path, rows: list[dict]) -> None:
    """Before they are computed: rows with these keys and `model` could be written into csv_path (check_same_model
    against what it holds now), so that a refused write costs no scoring and replaces no file beside it."""
    if Path(csv_path).is_file() and rows:
        check_same_model(Path(csv_path), read_results(csv_path), _typed(pd.DataFrame(rows)), KEY)


def read_results(csv_path: Path) -> pd.DataFrame:
    df = read_table(csv_path, REMEDY, what="results table", columns=COLUMNS)
    if missing := [k for k in KEY if k not in df and k not in OPTIONAL_KEY]:
        raise UserError(f"{csv_path} lacks the columns {missing}; it was not written by alibi_lm.eval")
    return _typed(df)


def upsert_rows(csv_path: Path, rows: list[dict]) -> pd.DataFrame:
    """Add rows to the CSV, replacing any row with the same KEY (the newest wins); atomic and locked."""
    new = _typed(pd.DataFrame(rows)).drop_duplicates(subset=KEY, keep="last")
    sort_by = ["mode", "stride", "split", "position", "rope_scaling", "attention", "train_len", "seed", "eval_len"]
    return replace_keyed(csv_path, new, KEY, read_results, sort_by)


def scheme_order(names) -> list[str]:
    """The registry's order (the paper's, for its schemes), an inference-time extension ("rope+yarn") right after
    its scheme; names the registry does not know last."""
    def key(name):
        base = name.split("+")[0]
        if base not in POSITION_SCHEMES and base.split("-")[0] in POSITION_SCHEMES:
            base = base.split("-")[0]  # a windowed run (rope-w64), after its scheme as rope+nope4 is
        return [*POSITION_SCHEMES, base].index(base), base, name  # an unknown scheme: len(POSITION_SCHEMES)

    return sorted(set(names), key=key)


def cell_stats(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Mean, std and n of finite perplexities per cell; n = 0 marks an evaluated, not applicable cell."""
    finite = df.assign(ppl=df["ppl"].where(np.isfinite(df["ppl"])))
    return finite.groupby(by)["ppl"].agg(mean="mean", std="std", n="count").reset_index()


def protocols(df: pd.DataFrame) -> list[tuple[tuple[str, object, str], pd.DataFrame]]:
    """((mode, stride, split), its rows) per protocol present, the paper's main one (nonoverlapping, valid) first."""
    groups = df.groupby(["mode", "stride", "split"], dropna=False, sort=False)  # a missing stride is a protocol
    return sorted(groups, key=lambda g: (g[0][0] != "nonoverlapping", g[0][2] != "valid", g[0][2],
                                        -1 if pd.isna(g[0][1]) else int(g[0][1])))


def protocol_name(mode: str, stride, split: str) -> str:
    return (mode if pd.isna(stride) else f"{mode}, stride {int(stride)}") + f", {split}"
