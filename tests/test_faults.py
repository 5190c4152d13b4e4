"""Faults while work runs, through the real command line: a scheduler's stop signals, a file size limit
(RLIMIT_FSIZE, as `ulimit -f` sets it), and a finished run asked for again with other settings."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess

import pandas as pd
import pytest
from test_reliability import (  # noqa: F401 - _no_process_left_behind is an autouse fixture
    REPO,
    Running,
    _no_process_left_behind,
    assert_same_weights,
    command,
    env,
    log_records,
    one_line_error,
    run_cli,
    run_dir_of,
    state_of,
    tiny,
)

from alibi_lm import checkpoint as ckpt
from alibi_lm.stopping import INTERRUPTED_EXIT

pytestmark = pytest.mark.slow


def status_of(run) -> dict:
    return json.loads((run / "status.json").read_text())


def no_temporaries(*folders) -> bool:
    return not [p for f in folders for p in f.rglob(".*.tmp")]


# ---- stop signals ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("sig, pause, stopped_at", [
    (signal.SIGTERM, "status.json@1", 0),   # before the first step, no checkpoint yet: the stop writes one
    (signal.SIGUSR2, "checkpoint.pt@1", 3),  # during the save of step 3: the save completes, then the stop
])
def test_a_stop_signal_checkpoints_and_the_resumed_run_is_bitwise_identical(ws, sig, pause, stopped_at):
    over = {"train.checkpoint_every": 3}
    reference = run_cli("train", tiny(ws, steps=8, name=f"ref-{sig.name}", **over))
    assert reference.returncode == 0, reference.stderr
    name = f"stop-{sig.name}"
    p = Running("train", tiny(ws, steps=8, name=name, **over), pause_in_write=f"{pause}=2")
    p.wait_for("test hook: pausing")
    os.kill(p.proc.pid, sig)
    os.kill(p.proc.pid, sig)  # a second signal while it saves only repeats the request
    assert p.proc.wait(60) == INTERRUPTED_EXIT, p.output
    p.kill()
    lines = p.output.strip().splitlines()
    assert lines[-1].startswith(f"error: training stopped by {sig.name} at step {stopped_at}/8"), p.output
    run = run_dir_of(ws, name)
    assert status_of(run)["status"] == "interrupted" and status_of(run)["step"] == stopped_at
    assert state_of(run)["step"] == stopped_at and no_temporaries(run)
    resumed = run_cli("train", tiny(ws, steps=8, name=name, **over, **{"train.resume": "true"}))
    assert resumed.returncode == 0, resumed.stderr
    assert_same_weights(state_of(run), state_of(run_dir_of(ws, f"ref-{sig.name}")))
    assert log_records(run) == log_records(run_dir_of(ws, f"ref-{sig.name}"))


@pytest.mark.parametrize("debug", [False, True], ids=["one-line", "--debug"])
def test_evaluation_stops_on_sigterm_keeping_every_finished_row(ws, debug):
    """--debug (or HYDRA_FULL_ERROR=1) shows the traceback, and still exits 75: a plan driver or a scheduler
    reads that status as 'stopped, run the same command again', not as a failure."""
    name = f"evalstop-{debug}"
    trained = run_cli("train", tiny(ws, steps=2, name=name))
    assert trained.returncode == 0, trained.stderr
    run = run_dir_of(ws, name)
    args = [f"run={run}", f"paths.results={ws}/results-{name}", "eval.multipliers=[1,2,4]", "eval.max_tokens=256"]
    p = Running("eval", [*args, "--debug"] if debug else args, pause_in_write="extrapolation.csv@2=30")
    p.wait_for("test hook: pausing")
    os.kill(p.proc.pid, signal.SIGTERM)
    assert p.proc.wait(60) == INTERRUPTED_EXIT, p.output
    p.kill()
    stopped = "Interrupted: eval stopped by SIGTERM" if debug else "error: eval stopped by SIGTERM"
    assert stopped in p.output and ("Traceback" in p.output) == debug, p.output
    (table,) = (ws / f"results-{name}").rglob("extrapolation.csv")
    first = pd.read_csv(table)
    assert len(first) == 1 and no_temporaries(ws / f"results-{name}")  # the row being written is dropped whole
    again = run_cli("eval", [*args, "eval.skip_done=true"])
    assert again.returncode == 0, again.stderr
    rows = pd.read_csv(table)
    assert sorted(rows["eval_len"]) == [16, 32, 64]
    assert rows.iloc[0]["wall_s"] == first.iloc[0]["wall_s"]  # the finished row was kept, not scored again


# ---- a file size limit -------------------------------------------------------------------------------------


def run_limited(app: str, args, max_bytes: int) -> subprocess.CompletedProcess:
    """The app with RLIMIT_FSIZE = max_bytes: a write past it fails with EFBIG (Python ignores SIGXFSZ)."""

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))

    return subprocess.run(command(app, args), cwd=REPO, env=env(), capture_output=True, text=True, timeout=180,
                          preexec_fn=limit)


def test_a_file_size_limit_while_checkpointing_is_one_line_and_the_run_resumes(ws):
    base = tiny(ws, steps=4, name="fsize")
    assert run_cli("train", base).returncode == 0
    run = run_dir_of(ws, "fsize")
    before = (run / ckpt.CHECKPOINT).read_bytes()
    more = tiny(ws, steps=8, name="fsize", **{"train.resume": "true"})
    out = run_limited("train", more, len(before) // 2)
    one_line_error(out, 2, "training stopped at step 8", "checkpoint of step 4 is kept", "checkpoint.pt",
                   "File too large", "ulimit -f")
    assert (run / ckpt.CHECKPOINT).read_bytes() == before and no_temporaries(run)
    assert status_of(run)["status"] == "failed"
    assert run_cli("train", more).returncode == 0
    assert state_of(run)["step"] == 8


@pytest.mark.parametrize("what", ["token cache", "results table"])
def test_a_file_size_limit_on_other_files_is_one_line(ws, tmp_path, what):
    if what == "token cache":
        app, args = "train", tiny(ws, steps=2, name="fsize-cache", **{"paths.cache": tmp_path / "cache"})
    else:
        assert run_cli("train", tiny(ws, steps=2, name="fsize-table")).returncode == 0
        app, args = "eval", [f"run={run_dir_of(ws, 'fsize-table')}", f"paths.results={tmp_path}/results",
                                 "eval.max_tokens=256"]
    out = run_limited(app, args, 64)
    errors = [ln for ln in out.stderr.replace("\r", "\n").splitlines() if "%|" not in ln and ln.strip()]  # no bars
    assert out.returncode == 2 and len(errors) == 1 and "Traceback" not in out.stderr, out.stderr
    assert errors[0].startswith("error: cannot write") and "File too large" in errors[0] and "ulimit -f" in errors[0]
    assert no_temporaries(tmp_path)


# ---- a finished run asked for with other settings ------------------------------------------------------------


def test_a_finished_run_is_not_reused_for_a_changed_setting(ws):
    base = tiny(ws, steps=2, name="stale")
    assert run_cli("train", base).returncode == 0
    run = run_dir_of(ws, "stale")
    before = (run / ckpt.CHECKPOINT).read_bytes()
    changed = run_cli("train", [*base, "train.lr=1e-4"])
    one_line_error(changed, 2, f"{run} holds a run trained with other settings", "train.lr=0.001 there, 0.0001 now",
                   "another name=", "delete")
    sweep = run_cli("train", ["-m", "position=alibi", *base, "model.dropout=0.0"])
    one_line_error(sweep, 2, "model.dropout=0.1 there, 0.0 now")
    same = run_cli("train", [*base, "train.threads=2", "train.eval_every=1"])  # how it runs, not what it trains
    assert same.returncode == 0 and "already trained" in same.stdout, same.stderr
    assert (run / ckpt.CHECKPOINT).read_bytes() == before


def test_a_value_of_the_wrong_type_is_one_line(ws):
    out = run_cli("train", tiny(ws, name="types", **{"train.batch_size": "abc"}))
    one_line_error(out, 2, "train.batch_size: Value 'abc' of type 'str' could not be converted to Integer",
                   "give train.batch_size a value of that type")


@pytest.mark.skipif(shutil.which("sbatch") is not None, reason="this machine has SLURM")
def test_a_slurm_sweep_on_a_machine_without_slurm_is_one_line_and_writes_nothing(ws, tmp_path):
    out = run_cli("train", ["-m", "hydra/launcher=slurm", "position=alibi,nope", *tiny(ws, name="slurm"),
                            f"paths.runs={tmp_path}/runs"])
    one_line_error(out, 2, "hydra/launcher=slurm submits to SLURM", "no sbatch", "hydra/launcher=submitit_local")
    assert not (tmp_path / "runs").exists()


def test_a_signal_during_the_last_step_completes_the_run_and_leaves_its_evaluation_to_the_next_command(ws):
    args = tiny(ws, steps=4, name="last", **{"train.evaluate_after": "true", "eval.multipliers": "[1,2]"})
    p = Running("train", args, pause_in_write="checkpoint.pt@1=2")  # the final checkpoint, at step 4
    p.wait_for("test hook: pausing")
    os.kill(p.proc.pid, signal.SIGTERM)
    assert p.proc.wait(60) == INTERRUPTED_EXIT, p.output
    p.kill()
    assert "completed, then SIGTERM stopped it before its evaluation" in p.output
    run = run_dir_of(ws, "last")
    assert status_of(run)["status"] == "completed" and not list(ws.glob("results/last/extrapolation.csv"))
    again = run_cli("train", args)
    assert again.returncode == 0 and "already trained" in again.stdout, again.stderr
    assert len(pd.read_csv(ws / "results" / "last" / "extrapolation.csv")) == 2


def test_a_run_that_diverged_before_its_first_checkpoint_is_retried_with_other_settings(ws):
    args = tiny(ws, steps=4, name="retry")
    diverged = run_cli("train", args, nan_at_step=1)
    assert diverged.returncode == 3 and status_of(run_dir_of(ws, "retry"))["status"] == "failed"
    retried = run_cli("train", [*args, "train.lr=1e-4"])  # the fix the divergence message suggests
    assert retried.returncode == 0, retried.stderr
