"""The pieces behind tests/test_integrity.py, in-process: a checkpoint is written only when finite and the one
before it can take its place; each kind of table damage is found at its line; a repair keeps every whole row byte
for byte; Ctrl-C's exit status and the second Ctrl-C; ranges and folder names."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys

import pytest
import torch
from conftest import REPO

from alibi_lm import checkpoint as ckpt
from alibi_lm.errors import ConfigError, TrainingDiverged, check_name, check_range
from alibi_lm.results import store
from alibi_lm.results.tables import SCHEMAS, TableDamaged, check_folder, check_table, inspect_table
from alibi_lm.stopping import CTRL_C_EXIT, INTERRUPTED_EXIT, Interrupted, raise_on_stop, status_after, stop_requests

# ---- checkpoints ---------------------------------------------------------------------------------------------


def state(step: int, value: float = 1.0) -> dict:
    weight = torch.full((3,), value)
    return {"model": {"w": weight}, "model_config": {}, "step": step,
            "optimizer": {"state": {0: {"step": torch.tensor(float(step)), "exp_avg": weight.clone()}}, "param_groups": []}}


@pytest.mark.parametrize("where", ["model", "optimizer"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_state_is_never_written(tmp_path, where, bad):
    ckpt.save_checkpoint(tmp_path, state(1))
    before = (tmp_path / ckpt.CHECKPOINT).read_bytes()
    poisoned = state(2)
    tensor = poisoned["model"]["w"] if where == "model" else poisoned["optimizer"]["state"][0]["exp_avg"]
    tensor[1] = bad
    entry = "model.w" if where == "model" else "optimizer.state.0.exp_avg"
    with pytest.raises(TrainingDiverged, match=f"^{entry} is not finite at step 2, so its checkpoint was not written"):
        ckpt.save_checkpoint(tmp_path, poisoned, keep_previous=True)
    assert (tmp_path / ckpt.CHECKPOINT).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [ckpt.CHECKPOINT]  # no temporary, no previous


def test_the_previous_checkpoint_takes_the_place_of_a_withdrawn_one(tmp_path):
    ckpt.save_checkpoint(tmp_path, state(1), keep_previous=True)
    assert not (tmp_path / ckpt.PREVIOUS_CHECKPOINT).exists()  # nothing before the first
    first = (tmp_path / ckpt.CHECKPOINT).read_bytes()
    ckpt.save_checkpoint(tmp_path, state(2, 2.0), keep_previous=True)
    assert (tmp_path / ckpt.PREVIOUS_CHECKPOINT).read_bytes() == first
    assert ckpt.load_checkpoint(tmp_path)["step"] == 2
    assert ckpt.withdraw_checkpoint(tmp_path) is True
    assert (tmp_path / ckpt.CHECKPOINT).read_bytes() == first and not (tmp_path / ckpt.PREVIOUS_CHECKPOINT).exists()
    # with no previous one, the withdrawn checkpoint is set aside: no command takes it for a trained model
    assert ckpt.withdraw_checkpoint(tmp_path) is False
    assert not ckpt.is_run_dir(tmp_path) and (tmp_path / ckpt.SET_ASIDE_CHECKPOINT).read_bytes() == first


def test_a_failed_or_non_finite_run_is_refused_unless_allowed(tmp_path):
    good = state(1)
    assert ckpt.check_usable_run(tmp_path, good, "eval.allow_failed_run", allowed=False) == ""
    nan = state(1, float("nan"))
    with pytest.raises(ckpt.UserError, match=r"is not a trained model: its weights are not finite \(model.w\); .* add "
                                             r"eval.allow_failed_run=true to score it anyway"):
        ckpt.check_usable_run(tmp_path, nan, "eval.allow_failed_run", allowed=False)
    ckpt.write_status(tmp_path, "failed", reason="loss is nan at step 3")
    with pytest.raises(ckpt.UserError, match=r"status.json says failed \(loss is nan at step 3\)"):
        ckpt.check_usable_run(tmp_path, good, "allow_failed_run", allowed=False)
    note = ckpt.check_usable_run(tmp_path, good, "allow_failed_run", allowed=True)
    assert note == "scored with allow_failed_run=true although status.json says failed (loss is nan at step 3)"


@pytest.mark.parametrize("status", ["running", "stopped", "interrupted"])
def test_a_run_whose_training_has_not_ended_is_refused_unless_allowed(tmp_path, status):
    """Ctrl-C at step 222 of 8,000 left a run that evaluation scored into the suite's table as if it were the
    trained one: its rows need the same consent as a failed run's, and say so."""
    ckpt.write_status(tmp_path, status, step=222, steps=8000)
    reason = f"status.json says {status} at step 222 of 8000: its training has not ended (the same train command finishes it)"
    with pytest.raises(ckpt.UserError, match=rf"is not a trained model: {re.escape(reason)}; .* add allow_failed_run=true"):
        ckpt.check_usable_run(tmp_path, state(1), "allow_failed_run", allowed=False)
    assert ckpt.check_usable_run(tmp_path, state(1), "allow_failed_run", allowed=True) == (
        f"scored with allow_failed_run=true although {reason}")
    ckpt.write_status(tmp_path, "completed", step=8000, steps=8000)
    assert ckpt.check_usable_run(tmp_path, state(1), "allow_failed_run", allowed=False) == ""


def test_config_differences_name_each_entry_that_differs():
    recorded = {"model": {"d_model": 32, "n_head": 2, "attention": "auto"}, "train": {"seq_len": 16, "lr": 0.1}}
    written = {"model": {"d_model": 64, "n_head": 2, "attention": "sdpa"}, "train": {"seq_len": 32, "lr": 0.1}}
    assert ckpt.config_differences(recorded, written, ("model.", "train.seq_len"), ignore=("model.attention",)) == [
        "model.d_model=32 in the checkpoint, 64 in config.yaml", "train.seq_len=16 in the checkpoint, 32 in config.yaml"]
    assert ckpt.config_differences(recorded, recorded, ("model.",)) == []


# ---- tables --------------------------------------------------------------------------------------------------

HEADER = ",".join(store.COLUMNS) + "\n"
ROW = dict(position="alibi", train_len="16", eval_len="32", mode="nonoverlapping", stride="", seed="0", split="valid",
           rope_scaling="", attention="full", ppl="123.5", loss="4.816241156068032", tokens="256", run="runs/x", step="4")


def row(**over) -> str:
    values = {**ROW, **over}
    return ",".join(values.get(c, "") for c in store.COLUMNS) + "\n"


N = len(store.COLUMNS)
CUT = row(eval_len="64")[:-20]  # cut inside "256": no field is quoted, so its fields are its commas + 1


@pytest.mark.parametrize("text, line, problem", [
    (HEADER + row() + CUT, 3, f"the row has {CUT.count(',') + 1} fields, the header {N}"),
    (HEADER.replace("ppl", "perplexity") + row(), 1, "the header has column(s) this table never has: perplexity"),
    (HEADER.replace("loss", "ppl") + row(), 1, "the header repeats the column(s) ppl"),
    (HEADER.replace("position,", "") + row()[6:], 1, "the header lacks the key column(s) position"),
    (HEADER + row() + "\n" + row(eval_len="64"), 3, "the line is empty"),
    (HEADER + row(eval_len="3.5"), 2, "eval_len is '3.5', not a whole number"),
    (HEADER + row(ppl="12,0"), 2, f"the row has {N + 1} fields, the header {N}"),
    (HEADER + row(ppl="abc"), 2, "ppl is 'abc', not a number"),
    (HEADER + row(mode=""), 2, "mode is empty"),
    (HEADER + row(command='"python -m x'), 2, "the row does not parse as CSV"),
])
def test_each_kind_of_damage_is_found_at_its_line(tmp_path, text, line, problem):
    table = tmp_path / store.CSV_NAME
    table.write_text(text)
    found = inspect_table(table, SCHEMAS[store.CSV_NAME])
    assert [d.line for d in found.damage] == [line] and found.damage[0].problem.startswith(problem), found.damage
    with pytest.raises(TableDamaged, match=f"^{table}, line {line}: "):
        check_table(table)


def test_whole_tables_pass_as_written_and_in_an_older_header(tmp_path):
    table = tmp_path / store.CSV_NAME
    store.upsert_rows(table, [{k: v for k, v in ROW.items()} | {"ppl": float("inf"), "loss": "800.0"},
                              {**ROW, "eval_len": 64, "ppl": None, "note": 'a "quoted",\nmultiline note'}])
    assert inspect_table(table, SCHEMAS[store.CSV_NAME]).damage == []
    table.write_text(HEADER + row(position="hf:gpt2", seed="", train_len=""))  # a Hugging Face model: no seed, no L
    assert inspect_table(table, SCHEMAS[store.CSV_NAME]).damage == []
    # an earlier version's header (before rope_scaling, attention, weights, data_sha and command): read, and
    # migrated to the current header by the next write
    old = [c for c in store.COLUMNS if c not in ("rope_scaling", "attention", "weights", "data_sha", "command")]
    table.write_text(",".join(old) + "\n" + ",".join({**ROW}.get(c, "") for c in old) + "\n")
    assert store.read_results(table)["attention"].tolist() == ["full"]
    store.upsert_rows(table, [{**ROW, "eval_len": 64}])
    assert table.read_text().splitlines()[0] == HEADER.strip() and len(store.read_results(table)) == 2


def test_repair_keeps_whole_rows_byte_for_byte_and_moves_the_rest_after_asking(tmp_path):
    table = tmp_path / store.CSV_NAME
    good = [row(eval_len="16"), row(eval_len="32", note='"a, quoted\nnote"'), row(eval_len="64")]
    bad = [row(eval_len="x"), row(eval_len="128")[:-9]]
    table.write_text(HEADER + good[0] + bad[0] + good[1] + good[2] + bad[1])
    before = table.read_bytes()
    out = io.StringIO()
    assert check_folder(tmp_path, repair=True, ask=lambda prompt: "n", out=out) == 2
    assert table.read_bytes() == before and "not repaired" in out.getvalue()
    assert check_folder(tmp_path, repair=True, ask=lambda prompt: "y", out=out) == 0
    assert table.read_text() == HEADER + "".join(good)
    assert (tmp_path / "extrapolation.csv.damaged").read_text() == HEADER + bad[0] + bad[1] + "\n"
    assert check_folder(tmp_path, out=io.StringIO()) == 0


def test_a_damaged_header_is_not_repaired(tmp_path):
    table = tmp_path / store.CSV_NAME
    table.write_text(HEADER.replace("ppl", "perplexity") + row())
    before, out = table.read_bytes(), io.StringIO()
    assert check_folder(tmp_path, repair=True, yes=True, out=out) == 2
    assert table.read_bytes() == before and "fix the header by hand" in out.getvalue()


# ---- Ctrl-C --------------------------------------------------------------------------------------------------


def test_ctrl_c_stops_with_130_and_a_scheduler_signal_with_75():
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN in a job started in the background (nohup, CI runners)
    for sig, status in ((signal.SIGINT, CTRL_C_EXIT), (signal.SIGTERM, INTERRUPTED_EXIT)):
        with pytest.raises(Interrupted) as stopped, raise_on_stop("evaluate", "run it again"):
            os.kill(os.getpid(), sig)
        assert stopped.value.exit_status == status
    assert str(stopped.value) == "evaluate stopped by SIGTERM; run it again"
    assert (status_after(signal.SIGINT), status_after(signal.SIGTERM)) == ("stopped", "interrupted")
    assert signal.getsignal(signal.SIGINT) is before  # put back


def test_a_second_ctrl_c_raises_at_once_only_where_asked():
    with stop_requests("gone at once") as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.signal == signal.SIGINT  # the first is a request, polled between steps
        with pytest.raises(Interrupted, match="^gone at once$") as second:
            os.kill(os.getpid(), signal.SIGINT)
    assert second.value.exit_status == CTRL_C_EXIT
    with stop_requests() as stop:  # a plan driver's: every signal only repeats the request
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
    assert stop.signal == signal.SIGINT


# ---- ranges and names ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("value, low, high, open_, message", [
    (-1000, 1, None, False, "eval.max_tokens must be >= 1, got -1000"),
    (0.0, 0, None, True, "eval.max_tokens must be > 0, got 0.0"),
    (1.5, 0, 1, False, "eval.max_tokens must be in [0, 1], got 1.5"),
    (float("nan"), 0, None, False, "eval.max_tokens must be a finite number >= 0, got nan"),
    (float("inf"), 0, None, False, "eval.max_tokens must be a finite number >= 0, got inf"),
])
def test_a_number_out_of_range_names_key_value_and_range(value, low, high, open_, message):
    with pytest.raises(ConfigError, match=f"^{message}$".replace("[", r"\[").replace("]", r"\]")):
        check_range("eval.max_tokens", value, low, high, low_open=open_)
    check_range("eval.max_tokens", None, 1)  # not set
    check_range("eval.max_tokens", low if not open_ else low + 1, low, high, low_open=open_)


@pytest.mark.parametrize("name", ["../x", "/tmp/x", "a/b", "..", ".", "", "a\\b"])
def test_a_name_is_one_path_component(name):
    with pytest.raises(ConfigError, match="is not a folder name: it must be one path component"):
        check_name("name", name)
    check_name("name", "quick-custom-1a2b3c4d")


def test_every_table_the_package_writes_is_checked_when_read():
    from alibi_lm.probes.report import CONTEXT_CSV, PASSKEY_CSV
    from alibi_lm.results.learned_values import LEARNED_CSV
    from alibi_lm.results.retrieval_store import RETRIEVAL_CSV
    from alibi_lm.results.task_store import OVER_TRAINING_CSV, TASKS_CSV

    written = {store.CSV_NAME, TASKS_CSV, OVER_TRAINING_CSV, RETRIEVAL_CSV, LEARNED_CSV, PASSKEY_CSV, CONTEXT_CSV}
    assert written <= set(SCHEMAS), f"tables without a registered schema: {sorted(written - set(SCHEMAS))}"


def test_ctrl_c_while_the_command_line_is_checked_is_one_line_and_exit_130(tmp_path):
    script = ("import os, signal, sys, time\nfrom alibi_lm import cli\n"
              "def check(job, out):\n    os.kill(os.getpid(), signal.SIGINT)\n    time.sleep(5)\n"
              "sys.argv = ['train', 'experiment=quick']\ncli.main('train', lambda job, d: None, check)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 130, out.stderr
    assert out.stderr.strip().splitlines() == ["error: train stopped by Ctrl-C (SIGINT); nothing was written yet; run "
                                               "the same command again"]
    assert not any(tmp_path.iterdir())  # nothing written


SIGNED_OPTIONS = {("position", "fox", "gate_bias_init")}  # a forget gate's initial bias: any sign is a valid choice


def numeric_options():
    import dataclasses
    import typing

    from alibi_lm.positions import POSITION_SCHEMES
    from alibi_lm.tasks import TASKS

    for kind, registry in (("position", POSITION_SCHEMES), ("task", TASKS)):
        for name, entry in registry.items():
            hints = typing.get_type_hints(entry.Options)
            for f in dataclasses.fields(entry.Options):
                if hints[f.name] in (int, float) and (kind, name, f.name) not in SIGNED_OPTIONS:
                    yield kind, name, f.name, hints[f.name]


@pytest.mark.parametrize("kind, name, field, kind_of", list(numeric_options()),
                         ids=lambda v: v if isinstance(v, str) else None)
def test_every_numeric_option_of_a_scheme_or_task_has_a_range(kind, name, field, kind_of):
    from alibi_lm.positions import POSITION_SCHEMES
    from alibi_lm.tasks import TASKS

    options = (POSITION_SCHEMES if kind == "position" else TASKS)[name].Options
    with pytest.raises(ConfigError, match=field):
        options(**{field: kind_of(-10**9)})


def test_the_latest_run_is_named_when_no_run_is_given(tmp_path, capsys):
    """eval without run= scored the newest run folder without saying which; an error then named a folder never given."""
    for name, age in (("old-L16-seed0", 100), ("new-L16-seed0", 0)):
        (tmp_path / name).mkdir()
        (tmp_path / name / ckpt.CHECKPOINT).write_bytes(b"x")
        (tmp_path / name / "config.yaml").write_text("name: x\n")
        os.utime(tmp_path / name / ckpt.CHECKPOINT, (1e9 - age, 1e9 - age))
    assert ckpt.latest_run(tmp_path) == tmp_path / "new-L16-seed0"
    assert capsys.readouterr().out == f"note: no run= given: the latest run under {tmp_path}/, {tmp_path / 'new-L16-seed0'}\n"
