"""The cluster paths of a scheduler's stop signals: Hydra's submitit launcher (a time-limit signal, a requeue)
and DDP (a signal to one rank). Beside test_faults.py, so that the two long files run in parallel."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from test_faults import status_of
from test_reliability import (  # noqa: F401 - _no_process_left_behind is an autouse fixture
    Running,
    _no_process_left_behind,
    assert_same_weights,
    run_cli,
    run_dir_of,
    state_of,
    tiny,
)

pytestmark = pytest.mark.slow


# ---- the cluster path: Hydra's submitit launcher, a time-limit signal, a requeue ------------------------------


def submitit_job_pid(parent: int) -> int | None:
    """The process that runs the job under submitit's local controller (python -m submitit.core._submit)."""
    from test_reliability import _descendants

    for pid in _descendants(parent):
        try:
            if b"submitit.core._submit" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    return None


def test_a_submitit_job_checkpoints_on_the_time_limit_signal_is_requeued_and_ends_bitwise_equal(ws):
    """submitit_local forwards SIGUSR2 to its job near the time limit; here the test sends it to the job process
    itself (what the controller does), mid-training. The job checkpoints, submitit's own handler requeues it,
    and the requeued job resumes to the weights of an uninterrupted run."""
    over = {"train.checkpoint_every": 50, "train.resume": "auto"}
    reference = run_cli("train", tiny(ws, steps=600, name="sub-ref", **over))
    assert reference.returncode == 0, reference.stderr
    sweep = Running("train", ["-m", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10",
                              *tiny(ws, steps=600, name="sub", **over)])
    run = run_dir_of(ws, "sub")
    deadline = time.monotonic() + 120
    while not ((run / "status.json").is_file() and status_of(run).get("step", 0) >= 50):
        assert time.monotonic() < deadline and sweep.proc.poll() is None, sweep.output
        time.sleep(0.05)
    os.kill(submitit_job_pid(sweep.proc.pid), signal.SIGUSR2)
    assert sweep.proc.wait(180) == 0, sweep.output
    sweep.kill()
    logs = "".join(p.read_text() for p in (ws / "runs" / "sub" / ".submitit").rglob("*_log.out"))
    assert "Requeued job" in logs and "resuming" in logs, logs
    segments = status_of(run)["train_segments"]
    assert len(segments) == 2 and 50 <= segments[0]["steps"][1] < 600, segments  # stopped mid-run, then resumed
    assert_same_weights(state_of(run), state_of(run_dir_of(ws, "sub-ref")))


def rank_pid(torchrun_pid: int, rank: int) -> int:
    """The worker of `rank` under torchrun (its environment holds RANK=<rank>)."""
    from test_reliability import _descendants

    for pid in _descendants(torchrun_pid):
        try:
            if f"RANK={rank}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                return pid
        except OSError:
            continue
    raise AssertionError(f"no worker of rank {rank}")


def test_under_ddp_a_signal_to_one_rank_stops_every_rank_after_the_same_step(ws):
    over = {"train.checkpoint_every": 3}
    reference = run_cli("torchrun", tiny(ws, steps=8, name="ddp-ref", **over), timeout=240)
    assert reference.returncode == 0, reference.stdout + reference.stderr
    p = Running("torchrun", tiny(ws, steps=8, name="ddp-stop", **over), pause_in_write="checkpoint.pt@1=3")
    p.wait_for("test hook: pausing", timeout=180)  # rank 0 writes step 3's checkpoint
    os.kill(rank_pid(p.proc.pid, 1), signal.SIGTERM)  # rank 1 alone is told to stop
    p.proc.wait(120)
    p.kill()
    assert p.output.count("error: training stopped by") == 2, p.output  # each rank, after the same step
    run = run_dir_of(ws, "ddp-stop")
    # rank 1 may already have voted "go on" for step 4 (it waits in that all_reduce for rank 0): then both ranks
    # stop after step 4, and the stop writes that step's checkpoint
    stopped = status_of(run)["step"]
    assert status_of(run)["status"] == "interrupted" and stopped in (3, 4) and state_of(run)["step"] == stopped
    resumed = run_cli("torchrun", tiny(ws, steps=8, name="ddp-stop", **over, **{"train.resume": "true"}), timeout=240)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert_same_weights(state_of(run), state_of(run_dir_of(ws, "ddp-ref")))
