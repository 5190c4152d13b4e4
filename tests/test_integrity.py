"""Nothing written is silently corrupted: damaged results tables, Ctrl-C, a diverging loss, a checkpoint that is
not its run folder's, out-of-range numbers, pickled Hugging Face weights and names that leave their folder, each
through the real command line on a tiny run, each on its own damaged copy: one line on stderr, a non-zero exit, no
traceback, and every file that existed before unchanged (compared by hash) unless the command's job is to change it.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import subprocess

import pandas as pd
import pytest
import torch
from test_reliability import (  # noqa: F401 - _no_process_left_behind is an autouse fixture
    REPO,
    Running,
    _no_process_left_behind,
    command,
    env,
    one_line_error,
    run_cli,
    run_dir_of,
    snapshot,
    state_of,
    tiny,
)

from alibi_lm import checkpoint as ckpt
from alibi_lm.results import store
from alibi_lm.results.tables import DAMAGED_SUFFIX, SCHEMAS, TableDamaged, check_folder, inspect_table
from alibi_lm.stopping import CTRL_C_EXIT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def evaluated(ws):
    """A tiny run, trained and evaluated at L and 2L: runs/table/... and results/table/extrapolation.csv."""
    out = run_cli("train", tiny(ws, steps=4, name="table", **{"train.evaluate_after": "true", "eval.multipliers": "[1,2]"}))
    assert out.returncode == 0, out.stderr
    return ws


def results_copy(ws, name: str):
    """A copy of the evaluated run's results folder, for one test to damage."""
    copy = ws / "damaged" / name / "table"  # evaluation writes to paths.results/<the run's name>/
    shutil.copytree(ws / "results" / "table", copy)
    return copy


def evaluate(ws, results, *extra) -> subprocess.CompletedProcess:
    """python -m alibi_lm.eval of the tiny run into the folder `results` (a results_copy)."""
    return run_cli("eval", [f"run={run_dir_of(ws, 'table')}", f"paths.results={results.parent}", "eval.multipliers=[1,2]",
                            "eval.max_tokens=256", *extra])


def results_command(*args, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([*command("results", []), *map(str, args)], cwd=REPO, env=env(), capture_output=True,
                          text=True, timeout=120, input=stdin)


# ---- results tables: checked when read, repaired on purpose ----------------------------------------------------


def cut_last_row(table) -> None:
    text = table.read_text()
    table.write_text(text[: len(text) - len(text.splitlines()[-1]) // 2 - 1])  # half of the last row, no line end


def rename_column(table, old: str, new: str) -> None:
    lines = table.read_text().splitlines(keepends=True)
    table.write_text(",".join(new if c == old else c for c in lines[0].rstrip("\n").split(",")) + "\n" + "".join(lines[1:]))


@pytest.mark.parametrize("damage, needles", [
    (cut_last_row, ["line 3:", "cut short"]),
    (lambda t: rename_column(t, "ppl", "perplexity"), ["line 1:", "perplexity", "renamed?"]),
    (lambda t: None, None),  # the control: the same command on a whole copy scores again and writes
], ids=["cut-last-row", "renamed-column", "whole"])
def test_evaluating_into_a_damaged_table_is_one_line_and_writes_nothing(evaluated, request, damage, needles):
    results = results_copy(evaluated, f"eval-{request.node.callspec.id}")
    table = results / store.CSV_NAME
    damage(table)
    before = snapshot(results)
    out = evaluate(evaluated, results)
    if needles is None:
        assert out.returncode == 0, out.stderr
        assert snapshot(results) != before and inspect_table(table, SCHEMAS[table.name]).damage == []
        return
    one_line_error(out, 2, str(table), *needles, "--check")
    assert snapshot(results) == before


def test_a_number_that_does_not_parse_names_its_line(evaluated):
    table = results_copy(evaluated, "nan-text") / store.CSV_NAME
    rows = table.read_text().splitlines(keepends=True)
    header = rows[0].rstrip("\n").split(",")
    fields = next(csv.reader([rows[2]]))
    fields[header.index("ppl")] = "12.5.3"
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(fields)
    table.write_text(rows[0] + rows[1] + buffer.getvalue())
    found = inspect_table(table, SCHEMAS[store.CSV_NAME])
    assert [(d.line, d.problem) for d in found.damage] == [(3, "ppl is '12.5.3', not a number")]
    with pytest.raises(TableDamaged, match=r"extrapolation.csv, line 3: ppl is '12.5.3', not a number; nothing was"):
        store.read_results(table)


def test_check_lists_the_damage_and_repair_moves_damaged_rows_aside_after_asking(evaluated):
    results = results_copy(evaluated, "check")
    table = results / store.CSV_NAME
    whole = table.read_text()
    cut_last_row(table)
    damaged = table.read_bytes()
    before = snapshot(results)

    check = results_command(results, "--check")
    assert check.returncode == 2 and "Traceback" not in check.stderr, check.stderr
    assert f"{table}: 2 row(s), 1 problem(s)" in check.stdout and "line 3: the row does not parse" in check.stdout, check.stdout
    assert snapshot(results) == before

    declined = results_command(results, "--repair", stdin="n\n")
    assert declined.returncode == 2 and "not repaired" in declined.stdout, declined.stdout + declined.stderr
    assert snapshot(results) == before

    repaired = results_command(results, "--repair", "--yes")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    side = results / (store.CSV_NAME + DAMAGED_SUFFIX)
    kept, cut = whole.splitlines(keepends=True)[:2], damaged.decode().splitlines(keepends=True)[2]
    assert table.read_text() == "".join(kept)  # the whole rows, byte for byte
    assert side.read_text() == kept[0] + cut + "\n"  # the header, then the cut row as it was
    assert results_command(results, "--check").returncode == 0
    again = evaluate(evaluated, results, "eval.skip_done=true")
    assert again.returncode == 0, again.stderr
    assert sorted(pd.read_csv(table)["eval_len"]) == [16, 32]  # the moved row's cell scored again


def test_every_committed_table_reads_whole():
    listed = subprocess.run(["git", "ls-files", "results"], cwd=REPO, capture_output=True, text=True).stdout.split()
    tables = [REPO / p for p in listed if os.path.basename(p) in SCHEMAS]
    assert {t.name for t in tables} >= {"extrapolation.csv"}
    for table in tables:
        assert inspect_table(table, SCHEMAS[table.name]).damage == [], table
    folders = sorted({t.parent for t in tables})
    assert all(check_folder(f, out=io.StringIO()) == 0 for f in folders)


# ---- Ctrl-C ----------------------------------------------------------------------------------------------------


def test_ctrl_c_during_evaluation_keeps_finished_rows_and_exits_130(evaluated):
    results = results_copy(evaluated, "sigint")
    table = results / store.CSV_NAME
    table.unlink()
    args = [f"run={run_dir_of(evaluated, 'table')}", f"paths.results={results.parent}",
            "eval.multipliers=[1,2,4]", "eval.max_tokens=256"]
    p = Running("eval", args, pause_in_write="extrapolation.csv@2=30")
    p.wait_for("test hook: pausing")
    os.kill(p.proc.pid, signal.SIGINT)
    assert p.proc.wait(60) == CTRL_C_EXIT, p.output
    p.kill()
    assert "Traceback" not in p.output and "KeyboardInterrupt" not in p.output, p.output
    errors = [ln for ln in "".join(p.err).splitlines() if ln.startswith("error: ")]
    assert errors == ["error: evaluate stopped by Ctrl-C (SIGINT); every finished checkpoint and results row is kept, "
                      "and the same command continues (train.resume=auto, eval.skip_done=true)"], p.output
    assert len(pd.read_csv(table)) == 1 and not list(results.rglob(".*.tmp"))
