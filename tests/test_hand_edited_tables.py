"""A hand-edited results table is refused as a damaged one is (results/tables.py): a copied row (two rows for one
cell), a perplexity missing where the note does not say why, a perplexity or a length not above zero. Each on a copy
of committed rows: `python -m alibi_lm.results <folder>` prints one line naming the file, the line, the problem and
the fix, exits 2 without a traceback and writes nothing; `--check` lists it, `--repair` moves it aside. The tables
the project's commands write still pass."""

from __future__ import annotations

import csv
import io
import shutil
import subprocess

import pytest
from conftest import REPO
from test_reliability import command, env, one_line_error, snapshot

from alibi_lm.results import learned_values, retrieval_store, store, task_store  # noqa: F401 - register their tables
from alibi_lm.results.tables import DAMAGED_SUFFIX, SCHEMAS, TableDamaged, check_table, inspect_table

COMMITTED = REPO / "results" / "extension" / store.CSV_NAME  # the current header, written by the evaluation
ROWS = 10  # alibi, L = 64, seeds 0 and 1, Lv = 64 .. 1024


def results_command(*args, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([*command("results", []), *map(str, args)], cwd=REPO, env=env(), capture_output=True,
                          text=True, timeout=180, input=stdin)


def written(folder) -> dict:
    """snapshot() of every file but the folder's .lock (taken to read the table under it, and ignored by git)."""
    return {f: v for f, v in snapshot(folder).items() if not f.endswith("/.lock")}


def read_rows(path) -> tuple[list[str], list[list[str]]]:
    header, *rows = list(csv.reader(io.StringIO(path.read_text(), newline="")))
    return header, rows


def write_rows(path, header: list[str], rows: list[list[str]]) -> None:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows([header, *rows])
    path.write_text(buffer.getvalue())


@pytest.fixture
def table(tmp_path):
    """The first ROWS rows of a committed extrapolation.csv, as written, in results/<experiment>/ of tmp_path."""
    folder = tmp_path / "results" / "hand-edited"
    folder.mkdir(parents=True)
    lines = COMMITTED.read_text().splitlines(keepends=True)
    (folder / store.CSV_NAME).write_text("".join(lines[: ROWS + 1]))
    return folder / store.CSV_NAME


def edit(path, row: int, **fields) -> None:
    """Set fields of the row'th row (0-based; its line is row + 2)."""
    header, rows = read_rows(path)
    for column, value in fields.items():
        rows[row][header.index(column)] = value
    write_rows(path, header, rows)


def copy_row(path, row: int, **fields) -> None:
    """Append a copy of the row'th row (with fields changed): a copy and paste by hand."""
    header, rows = read_rows(path)
    copy = list(rows[row])
    for column, value in fields.items():
        copy[header.index(column)] = value
    write_rows(path, header, [*rows, copy])


DAMAGE = {
    # damage: (how, its line, what the one line says)
    "copied-row": (lambda t: copy_row(t, 3), ROWS + 2, "repeats the cell of line 5"),
    "copied-row-64.0": (lambda t: copy_row(t, 0, eval_len="64.0"), ROWS + 2, "repeats the cell of line 2"),
    "copied-row-no-attention": (lambda t: copy_row(t, 1, attention=""), ROWS + 2, "repeats the cell of line 3"),
    "ppl-nan-no-note": (lambda t: edit(t, 2, ppl="nan"), 4, "ppl is 'nan' and the row's note does not say why"),
    "ppl-empty-no-note": (lambda t: edit(t, 2, ppl="", loss=""), 4, "ppl is empty and the row's note does not say why"),
    "ppl-negative": (lambda t: edit(t, 4, ppl="-5"), 6, "ppl is '-5'; it is above zero"),
    "ppl-zero": (lambda t: edit(t, 4, ppl="0"), 6, "ppl is '0'; it is above zero"),
    "eval-len-zero": (lambda t: edit(t, 6, eval_len="0"), 8, "eval_len is '0'; it is above zero"),
    "train-len-negative": (lambda t: edit(t, 6, train_len="-64"), 8, "train_len is '-64'; it is above zero"),
}


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_a_hand_edited_row_is_found_at_its_line(table, damage):
    how, line, problem = DAMAGE[damage]
    how(table)
    found = inspect_table(table, SCHEMAS[store.CSV_NAME])
    assert [d.line for d in found.damage] == [line] and problem in found.damage[0].problem, found.damage
    with pytest.raises(TableDamaged, match=f"^{table}, line {line}: .*re-run the evaluation that wrote it"):
        store.read_results(table)


@pytest.mark.parametrize("damage", ["copied-row", "ppl-nan-no-note", "ppl-negative", "eval-len-zero"])
def test_the_report_of_a_hand_edited_table_is_one_line_and_writes_nothing(table, damage):
    how, line, problem = DAMAGE[damage]
    how(table)
    before = written(table.parent)
    out = results_command(table.parent)
    one_line_error(out, 2, f"{table}, line {line}: ", problem, "--repair", "re-run the evaluation that wrote it")
    assert written(table.parent) == before
    check = results_command(table.parent, "--check")
    assert check.returncode == 2 and "Traceback" not in check.stdout + check.stderr, check.stdout + check.stderr
    assert f"line {line}: " in check.stdout and problem in check.stdout and "fix: `--repair`" in check.stdout, check.stdout
    assert written(table.parent) == before


def test_repair_keeps_the_first_of_two_copied_rows(table):
    whole = table.read_text()
    copy_row(table, 3)
    repaired = results_command(table.parent, "--repair", "--yes")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert table.read_text() == whole
    header_line, copied = whole.splitlines(keepends=True)[0], whole.splitlines(keepends=True)[4]
    assert (table.parent / (store.CSV_NAME + DAMAGED_SUFFIX)).read_text() == header_line + copied


def test_rows_the_evaluation_writes_still_pass(table):
    # a not-applicable cell (no perplexity, the note says why), a failed run scored on purpose (its note says so),
    # a diverged one (inf), an older table's empty attention: as the evaluation writes them
    edit(table, 4, ppl="", loss="", tokens="", note="not applicable: position 1023 is past the learned table")
    edit(table, 9, ppl="", loss="nan", note="scored with allow_failed_run=true although status.json says failed")
    edit(table, 8, ppl="inf", attention="")
    assert inspect_table(table, SCHEMAS[store.CSV_NAME]).damage == []
    out = results_command(table.parent, "--no-per-position")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stdout + out.stderr
    assert "n/a" in (table.parent / "extrapolation.md").read_text()
    assert results_command(table.parent, "--check").returncode == 0


@pytest.mark.parametrize("name, damage, problem", [
    ("tasks.csv", lambda t: copy_row(t, 0), "the row repeats line 2"),  # no declared key: a row repeated whole
    ("tasks.csv", lambda t: edit(t, 0, eval_len="0"), "eval_len is '0'; it is above zero"),
    ("learned.csv", lambda t: copy_row(t, 0, value="0.5"), "repeats the cell of line 2"),
    ("retrieval.csv", lambda t: edit(t, 0, distance="0"), "distance is '0'; it is above zero"),
])
def test_every_registered_table_refuses_a_copied_row_and_a_zero_length(tmp_path, name, damage, problem):
    source = next(p for p in sorted((REPO / "results").glob(f"*/{name}")))
    folder = tmp_path / "results" / source.parent.name
    folder.mkdir(parents=True)
    table = folder / name
    shutil.copyfile(source, table)
    assert inspect_table(table, SCHEMAS[name]).damage == []
    damage(table)
    found = inspect_table(table, SCHEMAS[name])
    assert len(found.damage) == 1 and problem in found.damage[0].problem, found.damage
    with pytest.raises(TableDamaged, match=f"^{table}, line {found.damage[0].line}: "):
        check_table(table)
