"""Every results table's schema, and the check a table passes each time it is read.

A table (extrapolation.csv, tasks.csv, retrieval.csv, learned.csv, passkey.csv, context_use.csv) is read only
when its header is the one this version writes, or an earlier version's (some of the same columns, written before
the others existed, its key among them: its rows read with the missing columns empty, and the next write of the
table migrates it to the current header), and
every row parses: as many fields as the header, whole numbers and numbers where the schema has them, its key
filled in, a last line without its line end only when it is whole; and every row holds what its writer writes:
lengths, counts (and the schema's other positive columns) above zero, accuracies and depths in [0, 1], losses finite
and its metrics filled in unless its note says why not (not applicable, a failed run scored on purpose, a loss not
finite), only labels its writer writes (the schema's `labels`), what the row's own numbers imply (`row_checks`: a
perplexity is exp of its loss), and no two rows for one cell (the same key; a table without a declared key: the
same row twice, as a copy and paste leaves it). Anything else is a TableDamaged error naming the file, the line and
what is wrong, and nothing is written: a damaged table is never rewritten with its damage (pandas would read a cut row as a row
of missing values, and a renamed column as a new one).

`python -m alibi_lm.results <folder> --check` lists every problem of the folder's tables; `--repair` moves the
damaged rows, as they were, to `<table>.damaged` beside it, after asking (or with --yes), and rewrites the table
without them (locked and atomic, as every write of a table). A damaged header is not repaired: it says which
columns the table needs.

The rows are split by the standard library's csv module (records and their line numbers) and the fields by its
int and float; the tables are then read by pandas. A byte-order mark (an editor's save as "UTF-8 with BOM") is not
part of the header: it is read past, and a rewrite leaves it out.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from ..checkpoint import atomic_write_text, folder_lock, remove_stale_temporaries
from ..errors import UserError

DAMAGED_SUFFIX = ".damaged"


# Sequence lengths: above zero wherever a table has them (and fills them in), whatever its schema declares.
LENGTH_COLUMNS = ("train_len", "eval_len")
# Counts of what a row scored (the passkey's trials, a context bin's targets): above zero wherever a table has them
# as whole numbers, as lengths are: a row that scored nothing is a not-applicable row (empty), never a zero. Not a
# task's `examples`, the test sequences with an answer: a short flip-flop cell of a few sequences may draw no read.
COUNT_COLUMNS = ("trials", "count")
# Fractions wherever a table has them as numbers: accuracies (per token, per answer, greedy, by chance) and the
# passkey's depth in the filler; the task report's Wilson interval needs them in [0, 1].
FRACTION_COLUMNS = ("acc", "acc_nokey", "acc_other", "exact", "exact_nokey", "token_acc", "greedy", "greedy_agree",
                    "chance_token", "chance_exact", "depth")
# Mean losses wherever a table has them as numbers: finite, unless the row's note says why: one of NOT_FINITE_NOTES
# (other notes, "curve up to context 128 only", do not).
FINITE_COLUMNS = ("loss",)
LOSS_NOT_FINITE = "loss not finite"  # the evaluation's note of a row whose loss is inf or nan: "loss not finite (inf)"
# ... and the note of a failed run scored on purpose (checkpoint.check_usable_run: "scored with allow_failed_run=true
# although ..."), whose numbers may be anything
NOT_FINITE_NOTES = (LOSS_NOT_FINITE, "allow_failed_run=true")
NOTE_COLUMN = "note"  # why a row has no metrics: "not applicable: ...", a failed run scored on purpose


@dataclass(frozen=True)
class TableSchema:
    """A results table by its file name: the header the code writes, the columns of whole numbers and of numbers
    (either may be empty: not applicable), the columns every row fills in, and what every written row holds:
    key: the columns that name a row's cell (one row per cell; empty: no declared key, and only a row repeated
    whole is refused), with key_defaults, the value an empty key field stands for (as the reader fills it in);
    positive: numbers above zero when filled in (besides LENGTH_COLUMNS and COUNT_COLUMNS, always);
    metrics: the numbers a row fills in unless its note (NOTE_COLUMN) says why not;
    labels: (column, check) pairs: check(value) of a filled-in value is None for a value the table's writer writes,
    else the values it writes, in words;
    row_checks: checks of a whole row (column -> field text) that are None, or what is wrong with it;
    remedy: what writes the table's rows again (the one line's fix, after --repair)."""

    name: str
    columns: tuple[str, ...]
    integers: tuple[str, ...] = ()
    numbers: tuple[str, ...] = ()
    filled: tuple[str, ...] = ()
    key: tuple[str, ...] = ()
    key_defaults: tuple[tuple[str, str], ...] = ()
    positive: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ()
    labels: tuple[tuple[str, Callable[[str], str | None]], ...] = ()
    row_checks: tuple[Callable[[dict[str, str]], str | None], ...] = ()
    remedy: str = ""

    def __post_init__(self):
        unknown = {*self.integers, *self.numbers, *self.filled, *self.key, *(c for c, _ in self.key_defaults),
                   *self.positive, *self.metrics, *(c for c, _ in self.labels)}
        unknown -= {*self.columns}
        assert not unknown, f"{self.name}: {sorted(unknown)} are not columns"
        not_numbers = {*self.positive, *self.metrics} - {*self.integers, *self.numbers}
        assert not not_numbers, f"{self.name}: {sorted(not_numbers)} are not number columns"
        assert not self.metrics or NOTE_COLUMN in self.columns, f"{self.name}: metrics need a {NOTE_COLUMN} column"

    @cached_property
    def above_zero(self) -> frozenset[str]:
        """The columns whose filled-in values must be above zero: positive, and every length the table has."""
        return frozenset({*self.positive, *(c for c in (*LENGTH_COLUMNS, *COUNT_COLUMNS) if c in self.integers)})

    @cached_property
    def in_unit_interval(self) -> frozenset[str]:
        """The columns whose filled-in values lie in [0, 1]: every FRACTION_COLUMNS number the table has."""
        return frozenset(c for c in FRACTION_COLUMNS if c in self.numbers)

    @cached_property
    def never_infinite(self) -> tuple[str, ...]:
        """The columns never infinite unless the row's note says why: every FINITE_COLUMNS number the table has, in
        a stable order (a row's first such problem is the one named)."""
        return tuple(sorted(c for c in FINITE_COLUMNS if c in self.numbers))

    # Lookups of every field of every row (a table of the suite has 10^5 rows): sets and dicts built once, not per field
    @cached_property
    def label_check(self) -> dict[str, Callable[[str], str | None]]:
        return dict(self.labels)

    @cached_property
    def key_default(self) -> dict[str, str]:
        return dict(self.key_defaults)

    @cached_property
    def integer_columns(self) -> frozenset[str]:
        return frozenset(self.integers)

    @cached_property
    def number_columns(self) -> frozenset[str]:
        return frozenset(self.numbers)

    @cached_property
    def filled_columns(self) -> frozenset[str]:
        return frozenset(self.filled)


SCHEMAS: dict[str, TableSchema] = {}


def register_table(schema: TableSchema) -> TableSchema:
    """Declare a table's schema (by its module, at import): every read of a file of that name is checked."""
    SCHEMAS[schema.name] = schema
    return schema


class TableDamaged(UserError):
    """A results table that does not parse as its schema: one line with the file, the line and the problem."""


@dataclass
class Damage:
    line: int  # 1-based, in the file
    problem: str


@dataclass
class Inspection:
    """A table as the csv module splits it: its header, each record with its first line and its text as in the file,
    and what is wrong (header problems on line 1)."""

    header: list[str] = field(default_factory=list)
    records: list[tuple[int, str, list[str]]] = field(default_factory=list)  # (line, raw text, fields)
    damage: list[Damage] = field(default_factory=list)

    def damaged_lines(self) -> set[int]:
        return {d.line for d in self.damage}


def header_problem(header: list[str], schema: TableSchema) -> str | None:
    """Why a header is neither the current one nor an older one, or None. An older header (an earlier version's,
    written before some columns existed) holds only the table's columns, each once, its key among them."""
    if tuple(header) == schema.columns:
        return None
    if duplicated := sorted({c for c in header if header.count(c) > 1}):
        return f"the header repeats the column(s) {', '.join(duplicated)}"
    if unknown := [c for c in header if c not in schema.columns]:
        return f"the header has column(s) this table never has: {', '.join(unknown)} (renamed?)"
    if missing := [c for c in schema.filled if c not in header]:
        return f"the header lacks the key column(s) {', '.join(missing)}"
    return None


def as_number(value: str) -> float | None:
    """A field as a number (None: not one), as every check of this module reads it."""
    try:
        return float(value)  # the standard library's parser: 16, 16.0, 1e-3, inf, nan
    except ValueError:
        return None


def field_problem(value: str, column: str, schema: TableSchema) -> str | None:
    if value == "":
        return f"{column} is empty" if column in schema.filled_columns else None
    number = as_number(value)
    if column in schema.integer_columns and (number is None or not number.is_integer()):
        return f"{column} is {value!r}, not a whole number"
    if column in schema.number_columns and number is None:
        return f"{column} is {value!r}, not a number"
    if number is not None and column in schema.above_zero and not number > 0 and not math.isnan(number):
        return f"{column} is {value!r}; it is above zero in every row the code writes"
    if number is not None and column in schema.in_unit_interval and not 0 <= number <= 1 and not math.isnan(number):
        return f"{column} is {value!r}; it is a fraction in [0, 1] in every row the code writes"
    if (check := schema.label_check.get(column)) is not None and (written := check(value)) is not None:
        return f"{column} is {value!r}, a value the code never writes ({written})"
    return None


def _missing(value: str) -> bool:
    """An empty field, or one that says NaN (the metric was not measured)."""
    number = as_number(value)
    return value.strip() == "" or (number is not None and math.isnan(number))


def metric_problem(row: dict[str, str], schema: TableSchema) -> str | None:
    """A metric missing from a row whose note does not say why (the report would show it as not applicable)."""
    if row.get(NOTE_COLUMN, "").strip():
        return None
    for column in schema.metrics:
        if column in row and _missing(row[column]):
            shown = "empty" if row[column] == "" else f"{row[column]!r}"
            return (f"{column} is {shown} and the row's {NOTE_COLUMN} does not say why (only a row whose note says "
                    f"not applicable, names a failed run scored on purpose, or a loss not finite, has no {column})")
    return None


def infinite_problem(row: dict[str, str], schema: TableSchema) -> str | None:
    """A number that is never infinite (a loss) but is, in a row whose note does not say why."""
    if any(note in row.get(NOTE_COLUMN, "") for note in NOT_FINITE_NOTES):
        return None
    for column in schema.never_infinite:
        if (number := as_number(row.get(column, ""))) is not None and math.isinf(number):
            return (f"{column} is {row[column]!r} and the row's {NOTE_COLUMN} does not say why (only a row whose note "
                    f"says the loss was not finite, or names a failed run scored on purpose, has an infinite {column})")
    return None


def _key_text(value: str, column: str, schema: TableSchema) -> str:
    """A key field as the reader compares it: 16, 16.0 and 1.6e1 alike; empty as its default."""
    if value == "":
        return schema.key_default.get(column, "")
    number = as_number(value) if column in schema.integer_columns or column in schema.number_columns else None
    if number is not None and math.isfinite(number):
        return str(int(number)) if number.is_integer() else repr(number)
    return value


def duplicate_damage(found: Inspection, schema: TableSchema) -> list[Damage]:
    """Each whole row that repeats an earlier row's cell (its key; without a declared key, the whole row): the later
    one is the damage, so that a repair keeps the first."""
    seen: dict[tuple, int] = {}
    damage = []
    bad = found.damaged_lines()
    for line, _, fields in found.records:
        if line in bad or len(fields) != len(found.header):
            continue
        row = dict(zip(found.header, fields))
        if schema.key:
            cell = tuple(_key_text(row.get(c, ""), c, schema) for c in schema.key)
        else:
            cell = tuple(fields)
        if cell in seen:
            if schema.key:
                shown = ", ".join(f"{c}={v}" for c, v in zip(schema.key, cell) if v != "")
                damage.append(Damage(line, f"the row repeats the cell of line {seen[cell]} ({shown}): one cell has "
                                           f"one row (a copied row?)"))
            else:
                damage.append(Damage(line, f"the row repeats line {seen[cell]} (a copied row?)"))
        else:
            seen[cell] = line
    return damage


def inspect_table(path: Path, schema: TableSchema) -> Inspection:
    """Split the table at path into records (csv) and list what is wrong with its header and each row."""
    # utf-8-sig: an editor's byte-order mark is not part of the first column's name (UnicodeDecodeError: the
    # caller's one line)
    text = Path(path).read_bytes().decode("utf-8-sig")
    lines = io.StringIO(text, newline="").readlines()  # as the csv reader sees them: its line_num counts these
    found = Inspection()
    if not text:
        return found  # no header: a table with no rows
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    start = 1
    try:
        for fields in reader:
            raw = "".join(lines[start - 1 : reader.line_num])
            if start == 1:
                found.header = fields
                if (problem := header_problem(fields, schema)) is not None:
                    found.damage.append(Damage(1, problem))
            else:
                found.records.append((start, raw, fields))
                if (problem := row_problem(fields, found.header, schema)) is not None:
                    found.damage.append(Damage(start, problem))
            start = reader.line_num + 1
    except csv.Error as e:
        found.damage.append(Damage(start, f"the row does not parse as CSV ({e}: cut short, or a stray quote)"))
        found.records.append((start, "".join(lines[start - 1 :]), []))
        return found
    # A last line without its line end (an editor's save) whose fields are all there and valid is a whole row; one
    # cut short lacks fields, and row_problem has said so.
    if not any(d.line == 1 for d in found.damage):  # a damaged header: its rows' columns are not known
        found.damage += duplicate_damage(found, schema)
        found.damage.sort(key=lambda d: d.line)
    return found


def row_problem(fields: list[str], header: list[str], schema: TableSchema) -> str | None:
    if not fields:
        return "the line is empty"
    if len(fields) != len(header):
        return f"the row has {len(fields)} fields, the header {len(header)} (cut short, or a field split)"
    for column, value in zip(header, fields):
        if column in schema.columns and (problem := field_problem(value, column, schema)) is not None:
            return problem
    row = dict(zip(header, fields))
    problems = (metric_problem(row, schema), infinite_problem(row, schema), *(check(row) for check in schema.row_checks))
    return next((problem for problem in problems if problem is not None), None)


def damage_message(path: Path, damage: Damage, total: int, remedy: str = "") -> str:
    """The one line of a damaged table: the file, the line, the problem and the fix (the damaged rows moved aside,
    then `remedy`: the command that wrote them, run again)."""
    more = f" (and {total - 1} more problem(s))" if total > 1 else ""
    then = f"; then {remedy}" if remedy else ""
    return (f"{path}, line {damage.line}: {damage.problem}{more}; nothing was written. See every problem with "
            f"`python -m alibi_lm.results {Path(path).parent} --check`; `--repair` moves damaged rows to "
            f"{Path(path).name}{DAMAGED_SUFFIX}{then}")


# The tables this process found whole, as (path, digest of their bytes): a report checks every table it reads up front
# (check_tables) and again as it reads each one (store.read_table); the same bytes are not parsed twice. Keyed on
# the content, so a table changed in between (a writer, an edit) is checked again.
_WHOLE_TABLES: set[tuple[str, str]] = set()


def check_table(path: Path, remedy: str = "") -> None:
    """Raise TableDamaged (one line: file, line, problem, and the fix: `remedy`, e.g. "re-run the evaluation")
    unless the table at path parses as its schema; a table without a registered schema, or no file, passes."""
    schema = SCHEMAS.get(Path(path).name)
    if schema is None or not Path(path).is_file():
        return
    whole = (str(Path(path).resolve()), hashlib.blake2b(Path(path).read_bytes(), digest_size=16).hexdigest())
    if whole in _WHOLE_TABLES:
        return
    found = inspect_table(path, schema)
    if found.damage:
        raise TableDamaged(damage_message(path, found.damage[0], len(found.damage), remedy))
    _WHOLE_TABLES.add(whole)


def table_files(folder: Path) -> list[Path]:
    """The folder's results tables (those with a schema), in a stable order."""
    return sorted(p for p in Path(folder).iterdir() if p.is_file() and p.name in SCHEMAS)


def check_folder(folder: Path, repair: bool = False, yes: bool = False, ask=None, out=None) -> int:
    """`--check` (and `--repair`): every table of the folder, each problem on a line of `out` (default: sys.stdout as
    it is when called, so that a redirection holds); 0 when all are whole (or repaired), else 2. A repair asks first
    (`ask`: the reply, None for none; default the terminal's) unless `yes`."""
    folder, out = Path(folder), out or sys.stdout
    if not folder.is_dir():
        raise UserError(f"{folder} is not a folder; pass results/<experiment>")
    ask = ask or terminal_answer
    tables = table_files(folder)
    if not tables:
        raise UserError(f"{folder} holds none of the results tables ({', '.join(sorted(SCHEMAS))})")
    status = 0
    for path in tables:
        try:
            found = inspect_table(path, SCHEMAS[path.name])
        except UnicodeDecodeError as e:
            line = e.object[: e.start].count(b"\n") + 1  # the bytes decoded: after a BOM, if any
            found = Inspection(damage=[Damage(line, "the line is not UTF-8 text")])
        print(f"{path}: {len(found.records)} row(s), " + ("whole" if not found.damage else
              f"{len(found.damage)} problem(s)"), file=out)
        for d in found.damage:
            print(f"  line {d.line}: {d.problem}", file=out)
        if found.damage and not repair:
            print(f"  fix: `--repair` moves the damaged rows to {path.name}{DAMAGED_SUFFIX}; then re-run the command "
                  f"that wrote them (the evaluation, or the probes) to write them again", file=out)
        if found.damage and not (repair and repair_table(path, found, yes, ask, out)):
            status = 2
    return status


def repair_table(path: Path, found: Inspection, yes: bool, ask, out) -> bool:
    """Move the damaged rows of path to path.damaged (appended, as they were in the file) and rewrite the table
    without them, under the folder's lock; True when done. A damaged header is not repaired."""
    if any(d.line == 1 for d in found.damage):
        print(f"  not repaired: fix the header by hand (this table's columns: {','.join(SCHEMAS[path.name].columns)}),"
              f" or move {path.name} aside", file=out)
        return False
    bad = found.damaged_lines()
    side = path.with_name(path.name + DAMAGED_SUFFIX)
    if not yes:
        reply = ask(f"move {len(bad)} damaged row(s) of {path} to {side} and rewrite it without them? [y/N] ")
        if reply is None:
            print("  not repaired: --repair asks before it moves rows, and no one answered (stdin is not a terminal, "
                  "or it ended); run it in a terminal to answer, or add --yes to repair without asking", file=out)
            return False
        if reply.strip().lower() not in ("y", "yes"):
            print("  not repaired", file=out)
            return False
    with folder_lock(path.parent):
        remove_stale_temporaries(path.parent, path.name)
        found = inspect_table(path, SCHEMAS[path.name])  # again, holding the lock: a writer may have come between
        if any(d.line == 1 for d in found.damage):
            return False
        bad = found.damaged_lines()
        header_text = ",".join(found.header) + "\n"
        moved = "".join(raw if raw.endswith(("\n", "\r")) else raw + "\n" for line, raw, _ in found.records if line in bad)
        old_side = side.read_text(encoding="utf-8-sig") if side.is_file() else header_text
        atomic_write_text(side, old_side + moved)  # first: a kill between the two writes loses no row
        kept = "".join(raw for line, raw, _ in found.records if line not in bad)
        first_line = io.StringIO(path.read_text(encoding="utf-8-sig"), newline="").readline()  # without a BOM
        atomic_write_text(path, first_line + kept)
    print(f"  repaired: {len(bad)} row(s) moved to {side}", file=out)
    return True


def terminal_answer(prompt: str) -> str | None:
    """The reply typed at the terminal; None when stdin is not a terminal (a pipe, /dev/null) or ends: a repair
    rewrites a table, so only a person who saw the problems listed confirms it (or --yes)."""
    if not sys.stdin.isatty():
        return None
    try:
        return input(prompt)
    except EOFError:  # Ctrl-D
        return None


def check_tables(folder: Path, names) -> None:
    """check_table of each table named that the folder holds, with its schema's remedy: a report reads several
    tables, and checking them all first refuses a damaged one before any of its files is rewritten."""
    for name in names:
        check_table(Path(folder) / name, SCHEMAS[name].remedy if name in SCHEMAS else "")
