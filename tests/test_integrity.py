"""Nothing written is silently corrupted: damaged results tables, Ctrl-C, a diverging loss, a checkpoint that is
not its run folder's, out-of-range numbers, pickled Hugging Face weights and names that leave their folder, each
through the real command line on a tiny run (the report app's table checks in the test's process,
conftest.run_results_app), each on its own damaged copy: one line on stderr, a non-zero exit, no traceback, and every
file that existed before unchanged (compared by hash) unless the command's job is to change it.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import shutil
import signal
import subprocess
import time

import pandas as pd
import pytest
import torch
from conftest import make, run_results_app, write_run
from test_reliability import (  # noqa: F401 - _no_process_left_behind is an autouse fixture
    REPO,
    Running,
    _no_process_left_behind,
    one_line_error,
    run_cli,
    run_dir_of,
    snapshot,
    state_of,
    tiny,
)

from alibi_lm import checkpoint as ckpt
from alibi_lm.model import LMConfig, TransformerLM
from alibi_lm.plans.finished_commit import rows_of_runs_under_way, runs_under_way
from alibi_lm.plans.run_record import cost_row_runs
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

    check = run_results_app(results, "--check")
    assert check.returncode == 2 and "Traceback" not in check.stderr, check.stderr
    assert f"{table}: 2 row(s), 1 problem(s)" in check.stdout and "line 3: the row does not parse" in check.stdout, check.stdout
    assert snapshot(results) == before

    declined = run_results_app(results, "--repair", stdin="n\n")
    assert declined.returncode == 2 and "not repaired" in declined.stdout, declined.stdout + declined.stderr
    assert snapshot(results) == before

    repaired = run_results_app(results, "--repair", "--yes")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    side = results / (store.CSV_NAME + DAMAGED_SUFFIX)
    kept, cut = whole.splitlines(keepends=True)[:2], damaged.decode().splitlines(keepends=True)[2]
    assert table.read_text() == "".join(kept)  # the whole rows, byte for byte
    assert side.read_text() == kept[0] + cut + "\n"  # the header, then the cut row as it was
    assert run_results_app(results, "--check").returncode == 0
    again = evaluate(evaluated, results, "eval.skip_done=true")
    assert again.returncode == 0, again.stderr
    assert sorted(pd.read_csv(table)["eval_len"]) == [16, 32]  # the moved row's cell scored again


def test_reporting_a_folder_that_does_not_exist_says_so_and_creates_nothing(tmp_path):
    missing = tmp_path / "results" / "nope-such"
    out = run_results_app(missing)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip() == (f"error: no results folder {missing}; `python -m alibi_lm.results` (make report) lists "
                                  f"the folders there are, and an experiment's folder appears once it has been evaluated")
    assert not (tmp_path / "results").exists()


def test_reporting_a_run_folder_names_the_folder_its_rows_go_to(tmp_path):
    run = write_run(tmp_path, make("alibi"), name="trial")
    out = run_results_app(run)
    assert out.returncode == 2 and out.stderr.strip() == (
        f"error: {run} is a run folder, not a results folder: `python -m alibi_lm.eval run={run}` writes its rows to "
        f"{tmp_path / 'runs' / 'trial' / 'results' / 'trial'}/; pass that folder")
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint.pt", "config.yaml"]


def test_reporting_a_trials_folder_of_runs_names_its_results_folder(tmp_path):
    """A trial's note names runs/<name>/ (its runs) and runs/<name>/results/<name>/ (its rows): given the first, the
    report app names the second, not "evaluate first"."""
    inner = tmp_path / "runs" / "tasks-custom-x" / "results" / "tasks-custom-x"
    inner.mkdir(parents=True)
    (inner / "tasks.csv").write_text("task\n")
    out = run_results_app(tmp_path / "runs" / "tasks-custom-x")
    assert out.returncode == 2 and out.stderr.strip() == (
        f"error: {tmp_path / 'runs' / 'tasks-custom-x'} holds the runs of tasks-custom-x; its rows (tasks.csv) are in "
        f"{inner}/: pass that folder (make report EXPERIMENT=tasks-custom-x finds it)")


def test_every_committed_table_reads_whole():
    listed = subprocess.run(["git", "ls-files", "results"], cwd=REPO, capture_output=True, text=True).stdout.split()
    tables = [REPO / p for p in listed if os.path.basename(p) in SCHEMAS]
    assert {t.name for t in tables} >= {"extrapolation.csv"}
    for folder in sorted({t.parent for t in tables}):  # --check: every table of the folder, each problem on a line
        out = io.StringIO()
        assert check_folder(folder, out=out) == 0, out.getvalue()


def test_no_committed_row_is_of_a_run_whose_step_has_not_ended():
    """A committed task folder holds the rows of finished runs only: no run still being scored, stopped or failed
    (its RUN_LOG.jsonl) has rows in tasks.csv, over_training.csv, retrieval.csv, learned.csv or training.csv (its
    curve so far), except in a probe's record whose README names each such run as one whose step did not end."""
    listed = subprocess.run(["git", "ls-files", "results"], cwd=REPO, capture_output=True, text=True).stdout.split()
    folders = sorted({(REPO / p).parent for p in listed if p.endswith("/RUN_LOG.jsonl")})
    assert REPO / "results" / "tasks" in folders
    assert rows_of_runs_under_way(REPO / "results" / "tasks") == []
    suite = REPO / "results" / "tasks"  # nor a cost row in RUN_INFO.md (a run has one from the start of its training)
    costed = cost_row_runs((suite / "RUN_INFO.md").read_text())
    assert costed and costed & runs_under_way(suite) == set()
    for folder in folders:
        readme = (folder / "README.md").read_text() if (folder / "README.md").is_file() else ""
        named = {run for _, run in rows_of_runs_under_way(folder) if f"`{run}`" in readme and "did not end" in readme}
        assert {run for _, run in rows_of_runs_under_way(folder)} <= named, folder


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
    assert errors == ["error: eval stopped by Ctrl-C (SIGINT); every finished results row is kept, and the same "
                      "command with eval.skip_done=true scores only the rest"], p.output
    assert len(pd.read_csv(table)) == 1 and not list(results.rglob(".*.tmp"))


def test_ctrl_c_during_training_checkpoints_at_the_step_boundary_and_exits_130(ws):
    over = {"train.checkpoint_every": 3}
    p = Running("train", tiny(ws, steps=8, name="ctrl-c", **over), pause_in_write="checkpoint.pt@1=2")
    p.wait_for("test hook: pausing")  # saving step 3
    os.kill(p.proc.pid, signal.SIGINT)  # the save completes, then the run stops
    assert p.proc.wait(60) == CTRL_C_EXIT, p.output
    p.kill()
    assert "Traceback" not in p.output and "KeyboardInterrupt" not in p.output, p.output
    errors = [ln for ln in "".join(p.err).splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: training stopped by SIGINT at step 3/8"), p.output
    run = run_dir_of(ws, "ctrl-c")
    status = json.loads((run / "status.json").read_text())
    assert (status["status"], status["step"], state_of(run)["step"]) == ("stopped", 3, 3)
    resumed = run_cli("train", tiny(ws, steps=8, name="ctrl-c", **over, **{"train.resume": "true"}))
    assert resumed.returncode == 0, resumed.stderr
    assert state_of(run)["step"] == 8 and not (run / ckpt.PREVIOUS_CHECKPOINT).exists()


def test_a_second_ctrl_c_exits_at_once_and_keeps_the_last_checkpoint(ws):
    over = {"train.checkpoint_every": 3}
    p = Running("train", tiny(ws, steps=8, name="ctrl-c-twice", **over), pause_in_write="checkpoint.pt@2=60")
    p.wait_for("test hook: pausing")  # saving step 6: step 3's checkpoint is the one on disk
    run = run_dir_of(ws, "ctrl-c-twice")
    kept = (run / ckpt.CHECKPOINT).read_bytes()
    os.kill(p.proc.pid, signal.SIGINT)
    time.sleep(1)
    os.kill(p.proc.pid, signal.SIGINT)
    assert p.proc.wait(30) == CTRL_C_EXIT, p.output  # not the 60 s of the paused save
    p.kill()
    assert "Traceback" not in p.output and "KeyboardInterrupt" not in p.output, p.output
    errors = [ln for ln in "".join(p.err).splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "stopped at once by a second Ctrl-C; its checkpoint of step 3 is kept" in errors[0]
    assert (run / ckpt.CHECKPOINT).read_bytes() == kept and not list(run.glob(".*.tmp"))
    status = json.loads((run / "status.json").read_text())
    assert (status["status"], status["step"], state_of(run)["step"]) == ("stopped", 3, 3)
    resumed = run_cli("train", tiny(ws, steps=8, name="ctrl-c-twice", **over, **{"train.resume": "true"}))
    assert resumed.returncode == 0, resumed.stderr


# ---- a diverging loss ------------------------------------------------------------------------------------------


def finite(state: dict) -> bool:
    return ckpt.non_finite_state(state) is None


def test_a_diverging_run_keeps_its_last_finite_checkpoint_and_is_not_evaluated_unless_asked(ws):
    over = {"train.lr": 1e4, "train.warmup_steps": 1, "train.checkpoint_every": 1, "train.eval_every": 100}
    out = run_cli("train", tiny(ws, steps=8, name="diverge", **over))
    line = one_line_error(out, 3, "at step", "training stopped", "lower train.lr")
    run = run_dir_of(ws, "diverge")
    state, status = state_of(run), json.loads((run / "status.json").read_text())
    assert status["status"] == "failed" and status["diverged"] is True and finite(state), line
    # the kept checkpoint's weights made a finite loss at the step after it (its log line, written with the next
    # checkpoint, before that one was withdrawn); the diverged step came after
    losses = {r["step"]: r["loss"] for r in map(json.loads, (run / "log.jsonl").read_text().splitlines())}
    assert math.isfinite(losses[state["step"] + 1]) and status["step"] > state["step"] + 1, (line, losses)
    assert not (run / ckpt.PREVIOUS_CHECKPOINT).exists() or finite(ckpt.load_checkpoint(run / ckpt.PREVIOUS_CHECKPOINT))

    before = snapshot(ws / "runs" / "diverge", ws / "results")
    args = [f"run={run}", f"paths.results={ws}/results", "eval.multipliers=[1]", "eval.max_tokens=256"]
    refused = run_cli("eval", args)
    one_line_error(refused, 2, "is not a trained model: status.json says failed", "allow_failed_run=true")
    resumed = run_cli("train", tiny(ws, steps=8, name="diverge", **over, **{"train.resume": "true"}))
    one_line_error(resumed, 2, "diverged in training", "resuming it would diverge again")
    probed = run_cli("probes", [f"run={run}", f"paths.results={ws}/results", "probe=passkey"])
    one_line_error(probed, 2, "is not a trained model", "allow_failed_run=true")
    assert snapshot(ws / "runs" / "diverge", ws / "results") == before

    allowed = run_cli("eval", [*args, "allow_failed_run=true"])
    assert allowed.returncode == 0, allowed.stderr
    (row,) = pd.read_csv(ws / "results" / "diverge" / store.CSV_NAME).to_dict("records")
    assert row["note"].startswith("scored with allow_failed_run=true although status.json says failed")
    # the row were a finished training's (another machine's, committed): the unfinished run does not replace it
    table = ws / "results" / "diverge" / store.CSV_NAME
    table.write_text(table.read_text().replace(str(row["weights"]), "0123456789abcdef"))
    before = table.read_bytes()
    again = run_cli("eval", [*args, "allow_failed_run=true"])
    one_line_error(again, 2, "from other weights (0123456789abcdef)", "paths.results=<another folder>")
    assert table.read_bytes() == before


# ---- a checkpoint that is not its run folder's ------------------------------------------------------------------


def foreign_checkpoint(run, d_model: int = 64) -> dict:
    """The run's checkpoint with another model in it (wider), as consistent as one of its own: weights, model
    config and training config agree."""
    state = ckpt.load_checkpoint(run)
    cfg = LMConfig(**{**state["model_config"], "d_model": d_model})
    state.update(model=TransformerLM(cfg).state_dict(), model_config=dataclasses.asdict(cfg), optimizer={})
    state["config"]["model"].update(d_model=d_model)
    return state


@pytest.mark.parametrize("app", ["eval", "probes"])
@pytest.mark.parametrize("damage, needle", [
    ("foreign", "model.d_model=64 in the checkpoint, 32 in config.yaml"),
    ("edited L", "train.seq_len=16 in the checkpoint, 32 in config.yaml"),
])
def test_a_checkpoint_that_is_not_its_run_folders_is_refused(evaluated, app, damage, needle):
    copy = evaluated / "foreign" / f"{app}-{damage.replace(' ', '-')}" / "table" / "alibi-L16-seed0"
    shutil.copytree(run_dir_of(evaluated, "table"), copy)
    if damage == "foreign":
        torch.save(foreign_checkpoint(copy), copy / ckpt.CHECKPOINT)
    else:
        config = copy / "config.yaml"
        config.write_text(config.read_text().replace("seq_len: 16", "seq_len: 32", 1))
    results = evaluated / "foreign" / f"{app}-{damage.replace(' ', '-')}" / "results"
    shutil.copytree(evaluated / "results" / "table", results / "table")
    before = snapshot(copy.parent, results)
    extra = ["eval.multipliers=[1,2]", "eval.max_tokens=256"] if app == "eval" else ["probe=passkey"]
    out = run_cli(app, [f"run={copy}", f"paths.results={results}", *extra])
    one_line_error(out, 2, "does not belong to its run folder", needle)
    assert snapshot(copy.parent, results) == before


# ---- numbers out of range, names that leave their folder, pickled weights ----------------------------------------


@pytest.mark.parametrize("app, over, needle", [
    ("eval", {"eval.max_tokens": -1000}, "eval.max_tokens must be >= 1, got -1000"),
    ("train", {"train.weight_decay": -0.1}, "train.weight_decay must be >= 0, got -0.1"),
    ("train", {"train.betas": "[0.9,1.5]"}, "train.betas[1] must be in [0, 1), got 1.5"),
    ("train", {"name": "../outside"}, "name='../outside' is not a folder name"),
    ("train", {"name": "/tmp/outside"}, "name='/tmp/outside' is not a folder name"),
    ("eval", {"hf.experiment": "a/b"}, "hf.experiment='a/b' is not a folder name"),
])
def test_out_of_range_numbers_and_names_that_leave_their_folder_are_one_line(evaluated, app, over, needle):
    before = snapshot(evaluated / "runs", evaluated / "results")
    args = tiny(evaluated, **{"name": "table", **over}) if app == "train" else \
        [f"run={run_dir_of(evaluated, 'table')}", f"paths.results={evaluated}/results", *(f"{k}={v}" for k, v in over.items())]
    one_line_error(run_cli(app, args), 2, needle)
    assert snapshot(evaluated / "runs", evaluated / "results") == before
    assert not (evaluated / "outside").exists() and not os.path.exists("/tmp/outside")


class Payload:
    """What an attacker ships as pytorch_model.bin: unpickling it runs a shell command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_hugging_face_folder_with_pickled_weights_is_refused_and_never_unpickled(ws, tmp_path):
    transformers = pytest.importorskip("transformers")
    folder, marker = tmp_path / "pickled", tmp_path / "PWNED"
    transformers.GPT2Config(vocab_size=97, n_embd=16, n_layer=1, n_head=2, n_positions=64).save_pretrained(folder)
    torch.save({"transformer.wte.weight": torch.zeros(97, 16), "extra": Payload(marker)}, folder / "pytorch_model.bin")
    before = snapshot(folder)
    out = run_cli("eval", [f"run=hf:{folder}", "data=wikitext2", f"data.root={ws}/data", f"paths.results={tmp_path}/r",
                           "eval.lengths=[16]"])
    one_line_error(out, 2, "holds its weights pickled (pytorch_model.bin)", "save_pretrained", f"run=hf:{folder}-st")
    assert not marker.exists() and snapshot(folder) == before and not (tmp_path / "r").exists()
