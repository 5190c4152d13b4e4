"""A hand-edited results table is refused as a damaged one is (results/tables.py): a copied row (two rows for one
cell), a perplexity missing where the note does not say why, a perplexity or a length not above zero, a perplexity
that is not exp of its loss, an infinite loss, a label no evaluation writes (mode, split, attention, rope_scaling, an
unregistered task), an accuracy or depth outside [0, 1], a count not above zero. Each on a copy of committed rows:
`python -m alibi_lm.results <folder>` prints one line naming the file, the line, the problem and the fix, exits 2
without a traceback and writes nothing; `--check` lists it, `--repair` moves it aside (and asks a person, never a
closed stdin). The tables the project's commands write still pass, and so does an editor's save of one (a
byte-order mark, no line end after the last row). The app runs in the test's process (conftest.run_results_app),
and once as the real command line."""

from __future__ import annotations

import csv
import io
import math
import shutil
import subprocess

import pytest
from conftest import REPO, run_results_app
from test_reliability import command, env, one_line_error, snapshot

from alibi_lm.results import learned_values, retrieval_store, store, tables, task_store  # noqa: F401 - register their tables
from alibi_lm.results.tables import DAMAGED_SUFFIX, SCHEMAS, TableDamaged, check_table, inspect_table
from alibi_lm.tasks import TASKS

COMMITTED = REPO / "results" / "extension" / store.CSV_NAME  # the current header, written by the evaluation
ROWS = 10  # alibi, L = 64, seeds 0 and 1, Lv = 64 .. 1024


def results_command(*args) -> subprocess.CompletedProcess:
    """The real command line, in a process of its own (the other tests run the app in this one: run_results_app)."""
    return subprocess.run([*command("results", []), *map(str, args)], cwd=REPO, env=env(), capture_output=True,
                          text=True, timeout=180, stdin=subprocess.DEVNULL)


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
    "ppl-inf": (lambda t: edit(t, 2, ppl="inf"), 4, "ppl is 'inf', but only a row whose note says 'loss not finite', "
                                                     "or whose loss is past exp's range, has an infinite ppl"),
    "ppl-not-exp-of-loss": (lambda t: edit(t, 2, ppl="10.0", loss="7.75"), 4,
                            "ppl is '10.0' but the row's loss is '7.75', whose exp is 2321.572415: the evaluation "
                            "writes ppl = exp(loss)"),
    "ppl-off-in-the-9th-digit": (lambda t: edit(t, 2, ppl="2321.572417", loss="7.75"), 4,
                                 "ppl is '2321.572417' but the row's loss is '7.75'"),
    "loss-inf-no-note": (lambda t: edit(t, 2, loss="inf"), 4, "loss is 'inf' and the row's note does not say why"),
    "mode-unknown": (lambda t: edit(t, 3, mode="nonoverlap"), 5, "mode is 'nonoverlap', a value the code never writes "
                                                                 "(eval.mode must be one of nonoverlapping, sliding)"),
    "split-unknown": (lambda t: edit(t, 3, split="validation"), 5, "split is 'validation', a value the code never "
                                                                   "writes (eval.split must be one of valid, test)"),
    "attention-unknown": (lambda t: edit(t, 3, attention="sideways"), 5,
                          "attention is 'sideways', a value the code never writes (eval.attention must be one of "
                          "full, bca; with temperature tuning: temperature, bca+temperature)"),
    "rope-scaling-unknown": (lambda t: edit(t, 3, rope_scaling="foo bar"), 5,
                             "rope_scaling is 'foo bar', a value the code never writes (empty, or an extension method: "
                             "streaming, lm_infinite, self_extend, rerope, leaky_rerope, dca, linear, ntk, dynamic, "
                             "yarn, llama3)"),
    "rope-scaling-unknown-option": (lambda t: edit(t, 3, rope_scaling="yarn-foo"), 5,
                                    "rope_scaling is 'yarn-foo', a value the code never writes (yarn, then options as "
                                    "-<key><number> with the keys x)"),
}


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_a_hand_edited_row_is_found_at_its_line(table, damage):
    how, line, problem = DAMAGE[damage]
    how(table)
    found = inspect_table(table, SCHEMAS[store.CSV_NAME])
    assert [d.line for d in found.damage] == [line] and problem in found.damage[0].problem, found.damage
    with pytest.raises(TableDamaged, match=f"^{table}, line {line}: .*re-run the evaluation that wrote it"):
        store.read_results(table)


@pytest.mark.parametrize("damage", ["copied-row", "ppl-nan-no-note", "ppl-negative", "eval-len-zero", "ppl-inf",
                                    "ppl-not-exp-of-loss", "mode-unknown", "rope-scaling-unknown"])
def test_the_report_of_a_hand_edited_table_is_one_line_and_writes_nothing(table, damage):
    how, line, problem = DAMAGE[damage]
    how(table)
    before = written(table.parent)
    out = run_results_app(table.parent)
    one_line_error(out, 2, f"{table}, line {line}: ", problem, "--repair", "re-run the evaluation that wrote it")
    assert written(table.parent) == before
    check = run_results_app(table.parent, "--check")
    assert check.returncode == 2 and "Traceback" not in check.stdout + check.stderr, check.stdout + check.stderr
    assert f"line {line}: " in check.stdout and problem in check.stdout and "fix: `--repair`" in check.stdout, check.stdout
    assert written(table.parent) == before


def test_the_command_line_reports_a_hand_edited_table_in_one_line_and_writes_nothing(table):
    """The other tests run the app in the test's process; this one runs `python -m alibi_lm.results` itself: one
    line on stderr, exit status 2, no traceback, for the report and for --check, and no file written."""
    how, line, problem = DAMAGE["copied-row"]
    how(table)
    before = written(table.parent)
    one_line_error(results_command(table.parent), 2, f"{table}, line {line}: ", problem, "--repair")
    check = results_command(table.parent, "--check")
    assert check.returncode == 2 and "Traceback" not in check.stdout + check.stderr, check.stdout + check.stderr
    assert f"line {line}: " in check.stdout and problem in check.stdout, check.stdout
    assert written(table.parent) == before


def test_a_table_found_whole_is_parsed_once_and_checked_again_when_its_bytes_change(table, monkeypatch):
    inspected = []
    real_inspect = tables.inspect_table
    monkeypatch.setattr(tables, "inspect_table", lambda path, schema: inspected.append(path) or real_inspect(path, schema))
    check_table(table)
    store.read_results(table)  # the report's second check of the same bytes: not parsed again
    assert inspected == [table]
    copy_row(table, 3)  # the same file, hand-edited after it was found whole
    with pytest.raises(TableDamaged, match=f"^{table}, line {ROWS + 2}: the row repeats the cell of line 5"):
        store.read_results(table)
    assert inspected == [table, table]


def test_repair_keeps_the_first_of_two_copied_rows(table):
    whole = table.read_text()
    copy_row(table, 3)
    repaired = run_results_app(table.parent, "--repair", "--yes")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert table.read_text() == whole
    header_line, copied = whole.splitlines(keepends=True)[0], whole.splitlines(keepends=True)[4]
    assert (table.parent / (store.CSV_NAME + DAMAGED_SUFFIX)).read_text() == header_line + copied


def test_rows_the_evaluation_writes_still_pass(table):
    # a not-applicable cell (no perplexity, the note says why), a failed run scored on purpose (its note says so),
    # a diverged one (a loss past exp's range: ppl inf), one whose loss is inf (no ppl, the note says so), an older
    # table's empty attention, a ppl one rounding from exp(loss), the labels of an extension and of temperature
    # tuning: as the evaluation writes them
    edit(table, 4, ppl="", loss="", tokens="", note="not applicable: position 1023 is past the learned table")
    edit(table, 9, ppl="", loss="nan", note="scored with allow_failed_run=true although status.json says failed")
    edit(table, 8, ppl="inf", loss="710.5", attention="")
    edit(table, 7, ppl="", loss="inf", note="loss not finite (inf)")
    edit(table, 6, ppl=repr(math.nextafter(math.exp(7.75), math.inf)), loss="7.75")
    edit(table, 5, rope_scaling="self_extend-group4-window32", attention="bca+temperature-a0.2-f64")
    assert inspect_table(table, SCHEMAS[store.CSV_NAME]).damage == []
    out = run_results_app(table.parent, "--no-per-position")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stdout + out.stderr
    assert "n/a" in (table.parent / "extrapolation.md").read_text()
    assert run_results_app(table.parent, "--check").returncode == 0


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


@pytest.mark.parametrize("name, column, value, problem", [
    ("passkey.csv", "acc", "7.5", "acc is '7.5'; it is a fraction in [0, 1] in every row the code writes"),
    ("passkey.csv", "acc", "inf", "acc is 'inf'; it is a fraction in [0, 1] in every row the code writes"),
    ("passkey.csv", "depth", "7.0", "depth is '7.0'; it is a fraction in [0, 1] in every row the code writes"),
    ("passkey.csv", "trials", "-2", "trials is '-2'; it is above zero in every row the code writes"),
    # the committed row's note ("curve up to context 128 only: ...") does not say why a loss would be infinite
    ("context_use.csv", "loss", "inf", "loss is 'inf' and the row's note does not say why (only a row whose note says "
                                       "the loss was not finite, or names a failed run scored on purpose, has an "
                                       "infinite loss)"),
    ("context_use.csv", "count", "-253", "count is '-253'; it is above zero in every row the code writes"),
    ("tasks.csv", "exact", "2.5", "exact is '2.5'; it is a fraction in [0, 1] in every row the code writes"),
    ("tasks.csv", "exact", "-1", "exact is '-1'; it is a fraction in [0, 1] in every row the code writes"),
    ("tasks.csv", "task", "cpy", f"task is 'cpy', a value the code never writes (a registered task: {', '.join(TASKS)})"),
    ("tasks.csv", "rope_scaling", "foo bar", "rope_scaling is 'foo bar', a value the code never writes (empty, or an "
                                             "extension method: "),
])
def test_values_outside_what_the_probes_and_the_task_evaluation_write_are_refused(tmp_path, name, column, value,
                                                                                   problem):
    source = next(p for p in sorted((REPO / "results").glob(f"*/{name}")))
    table = tmp_path / "results" / source.parent.name / name
    table.parent.mkdir(parents=True)
    shutil.copyfile(source, table)
    assert inspect_table(table, SCHEMAS[name]).damage == []
    edit(table, 0, **{column: value})
    found = inspect_table(table, SCHEMAS[name])
    assert [d.line for d in found.damage] == [2] and found.damage[0].problem.startswith(problem), found.damage
    with pytest.raises(TableDamaged, match=f"^{table}, line 2: "):
        check_table(table)


TASK_FOLDER = REPO / "results" / "tasks-probe-d64"  # tasks.csv, retrieval.csv and learned.csv: a small task suite


@pytest.mark.parametrize("name, column, value, problem", [
    # the Wilson interval of an accuracy above 1 raised a math domain error after some of the plots were rewritten
    ("tasks.csv", "exact", "2.5", "exact is '2.5'; it is a fraction in [0, 1]"),
    ("tasks.csv", "task", "cpy", "task is 'cpy', a value the code never writes"),  # its own plot, tasks-cpy-L64.png
    ("learned.csv", "value", "abc", "value is 'abc', not a number"),  # read after every plot is written
])
def test_the_task_report_refuses_a_damaged_table_before_it_writes_a_file(tmp_path, name, column, value, problem):
    folder = tmp_path / "results" / TASK_FOLDER.name
    folder.mkdir(parents=True)
    for table in TASK_FOLDER.glob("*.csv"):
        shutil.copyfile(table, folder / table.name)
    edit(folder / name, 0, **{column: value})
    before = written(folder)
    out = run_results_app(folder)
    one_line_error(out, 2, f"{folder / name}, line 2: {problem}", "nothing was written", "--repair")
    assert written(folder) == before


def test_a_byte_order_mark_is_read_past_and_left_out_of_a_rewrite(table):
    whole = table.read_text()
    table.write_text("\ufeff" + whole, encoding="utf-8")  # an editor's "UTF-8 with BOM"
    assert inspect_table(table, SCHEMAS[store.CSV_NAME]).damage == []
    assert store.read_results(table)["position"].tolist() == ["alibi"] * ROWS
    assert run_results_app(table.parent, "--check").returncode == 0
    copy_row(table, 3)  # a copied row to repair: write_rows writes the BOM back, as the header's first character
    assert table.read_bytes().startswith(b"\xef\xbb\xbfposition,")
    repaired = run_results_app(table.parent, "--repair", "--yes")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert table.read_bytes() == whole.encode()  # no BOM, every whole row as it was


def test_a_whole_last_row_without_its_line_end_is_a_row(table):
    whole = table.read_text()
    table.write_text(whole.removesuffix("\n"))  # an editor's save
    assert inspect_table(table, SCHEMAS[store.CSV_NAME]).damage == []
    check = run_results_app(table.parent, "--check")
    assert check.returncode == 0 and f"{table}: {ROWS} row(s), whole" in check.stdout, check.stdout + check.stderr
    header, rows = read_rows(table)
    write_rows(table, header, rows[:-1])
    with table.open("a") as f:
        f.write(",".join(rows[-1][:12]))  # a row cut short after its 12th field (position .. run: no quotes)
    found = inspect_table(table, SCHEMAS[store.CSV_NAME])
    assert [(d.line, d.problem) for d in found.damage] == [
        (ROWS + 1, f"the row has 12 fields, the header {len(header)} (cut short, or a field split)")]


def test_repair_with_no_one_to_answer_changes_nothing(table):
    copy_row(table, 3)
    before = written(table.parent)
    out = run_results_app(table.parent, "--repair", stdin="")  # stdin empty and not a terminal, as < /dev/null
    text = out.stdout + out.stderr
    assert out.returncode == 2 and "Traceback" not in text and "EOFError" not in text, text
    assert ("  not repaired: --repair asks before it moves rows, and no one answered (stdin is not a terminal, or it "
            "ended); run it in a terminal to answer, or add --yes to repair without asking") in out.stdout.splitlines()
    assert written(table.parent) == before
