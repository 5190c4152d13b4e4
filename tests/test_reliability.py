"""Bad input, kills, NaN, full disks and no network, through the real command line.

The subprocess tests run `python -m alibi_lm.train` / `python -m alibi_lm.eval` (and torchrun) on a
small synthetic WikiText-style corpus written into tmp, with a tiny model, one thread and the network
variables pointing at a closed port; tests/app.py runs the same apps with test hooks (a pause before a
rename, a NaN loss, a full disk) and the test scheme. They are marked slow (`make test-fast` leaves them out).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import REPO, compose_job
from forked_app import run_python
from omegaconf import OmegaConf

from alibi_lm import checkpoint as ckpt
from alibi_lm.config import check_writable
from alibi_lm.errors import UserError
from alibi_lm.train import check_same_run, resume_wanted

NOWHERE = "http://127.0.0.1:9"  # the discard port: nothing listens, connections are refused at once
L = 16


# ---- helpers ---------------------------------------------------------------------------------------------


def tiny(ws: Path, steps=8, **over) -> list[str]:
    """Overrides for a tiny, fast run whose every output lives under ws, on the CPU also where a GPU is visible:
    these tests pin the CPU's behaviour, bit-for-bit resumes included (tests/test_cuda.py covers CUDA)."""
    args = {
        "model.n_layer": 1, "model.d_model": 32, "model.n_head": 2, "model.d_ff": 64, "model.adaptive_cutoffs": "null",
        "model.dropout": 0.1, "train.seq_len": L, "train.batch_size": 4, "train.max_steps": steps,
        "train.warmup_steps": 2, "train.eval_tokens": 256, "train.eval_every": 4, "train.checkpoint_every": 4,
        "train.progress": "false", "train.threads": 1, "train.device": "cpu", "logger.wandb.mode": "disabled",
        "data": "wikitext2",
        "data.root": ws / "data", "paths.runs": ws / "runs", "paths.results": ws / "results",
        "paths.cache": ws / "cache", "eval.max_tokens": 256, "eval.tokens_per_batch": 512,
    }
    args.update(over)
    return [f"{k}={v}" for k, v in args.items()]


def env(**extra) -> dict:
    """The worktree's package, no network (every endpoint and proxy points at a closed port), one thread."""
    e = {k: v for k, v in os.environ.items() if not k.startswith(("ALIBI_LM_", "WANDB_", "HYDRA_", "HF_"))}
    e.update(PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1", OMP_NUM_THREADS="1", HTTP_PROXY=NOWHERE,
             HTTPS_PROXY=NOWHERE, http_proxy=NOWHERE, https_proxy=NOWHERE, ALL_PROXY=NOWHERE, NO_PROXY="",
             no_proxy="", WANDB_BASE_URL=NOWHERE, HF_ENDPOINT=NOWHERE, ALIBI_LM_HUB_TIMEOUT="1",
             WANDB_SILENT="true")
    e.update({k: str(v) for k, v in extra.items()})
    return e


def command(app: str, args, **hooks) -> list[str]:
    """`python -m alibi_lm.<app> args` (torchrun: 2 processes of the train app); with hooks
    (pause_in_write=..., nan_at_step=..., disk_full_at_save=...) the same through tests/app.py."""
    hooked = [f"--{k.replace('_', '-')}={v}" for k, v in hooks.items()]
    module = "alibi_lm.train" if app == "torchrun" else f"alibi_lm.{app}"
    run = [str(REPO / "tests" / "app.py"), *hooked, module] if hooks else ["-m", module]
    if app == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *run, *map(str, args)]
    return [sys.executable, *run, *map(str, args)]


def run_cli(app: str, args, timeout=180, **hooks) -> subprocess.CompletedProcess:
    """The command run to its end: torchrun as a real process, an app (hooked or not) forked from the test
    process's app server (tests/forked_app.py), which has imported torch and the apps already."""
    argv = command(app, args, **hooks)
    if app == "torchrun":
        return subprocess.run(argv, cwd=REPO, env=env(), capture_output=True, text=True, timeout=timeout)
    return run_python(argv[1:], env(), REPO, timeout)


class Running:
    """A command-line process whose output threads collect, so that a test can wait for a line (the pause
    hook's) and then kill -9 it with every process it started."""

    started: list[Running] = []

    def __init__(self, app: str, args, **hooks):
        Running.started.append(self)
        self.proc = subprocess.Popen(command(app, args, **hooks), cwd=REPO, env=env(), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.out, self.err, self.cond = [], [], threading.Condition()
        self.readers = [threading.Thread(target=self._read, args=(s, b), daemon=True)
                        for s, b in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for t in self.readers:
            t.start()

    def _read(self, stream, lines):
        for line in stream:
            with self.cond:
                lines.append(line)
                self.cond.notify_all()

    def wait_for(self, text: str, timeout=120) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not any(text in ln for ln in self.out + self.err):
                finished = self.proc.poll() is not None and not any(t.is_alive() for t in self.readers)
                if finished or time.monotonic() > deadline:
                    break
                self.cond.wait(0.2)
            else:
                return
        self.kill()
        pytest.fail(f"no line with {text!r}; rc={self.proc.returncode}\n{self.output}")

    def kill(self) -> None:
        """kill -9 the process and all its descendants (torchrun's workers have their own process groups)."""
        if self.proc.returncode is None:
            for pid in [*_descendants(self.proc.pid), self.proc.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.proc.wait(30)
        for t in self.readers:
            t.join(5)

    @property
    def output(self) -> str:
        return "".join(self.out) + "".join(self.err)


@pytest.fixture(autouse=True)
def _no_process_left_behind():
    """A test that fails before its kill must not leave a paused process (and its run folder lock) behind."""
    yield
    while Running.started:
        Running.started.pop().kill()


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def one_line_error(result, status: int, *needles: str) -> str:
    """The command failed with `status`, one line `error: ...` on stderr holding every needle, no traceback."""
    text = f"rc={result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == status, text
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), text
    assert "Traceback" not in result.stdout + result.stderr, text
    for needle in needles:
        assert needle in lines[0], text
    return lines[0]


def snapshot(*roots: Path) -> dict:
    """Every file under roots (hidden ones too) -> (size, mtime, sha1)."""
    files = {}
    for root in roots:
        for p in sorted(Path(root).rglob("*")) if Path(root).exists() else []:
            if p.is_file():
                files[str(p)] = (p.stat().st_size, p.stat().st_mtime_ns, hashlib.sha1(p.read_bytes()).hexdigest())
    return files


def state_of(run_dir: Path) -> dict:
    return ckpt.load_checkpoint(run_dir / ckpt.CHECKPOINT)


def assert_same_weights(a: dict, b: dict) -> None:
    assert a["step"] == b["step"]
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), f"{k} differs"
    for sa, sb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        for k in sa:
            assert torch.equal(sa[k], sb[k]), f"optimizer {k} differs"


def log_records(run_dir: Path) -> list[dict]:
    """log.jsonl without the wall-clock fields."""
    records = [json.loads(ln) for ln in (run_dir / "log.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in records]


def run_dir_of(ws: Path, name: str, position="alibi", seed=0) -> Path:
    return ws / "runs" / name / f"{position}-L{L}-seed{seed}"


# ---- bad input: one line, non-zero status, nothing written ------------------------------------------------


@pytest.fixture(scope="module")
def table_ws(ws) -> Path:
    """A trained and evaluated run (so that runs/ and results/ hold files), broken copies of it outside runs/,
    and bad corpora."""
    out = run_cli("train", tiny(ws, steps=4, name="table", **{"train.evaluate_after": "true",
                                                              "eval.multipliers": "[1,2]"}))
    assert out.returncode == 0, out.stderr
    run = run_dir_of(ws, "table")
    broken = ws / "broken"
    for name in ("truncated", "flipped", "mismatch"):
        shutil.copytree(run, broken / name)
    blob = (run / "checkpoint.pt").read_bytes()
    (broken / "truncated" / "checkpoint.pt").write_bytes(blob[: len(blob) // 2])
    flipped = bytearray(blob)
    flipped[len(blob) // 2] ^= 0x10  # one bit inside a tensor: torch.load alone would not notice
    (broken / "flipped" / "checkpoint.pt").write_bytes(bytes(flipped))
    state = torch.load(run / "checkpoint.pt", weights_only=True)
    state["model_config"]["d_model"] = 64  # the weights are 32 wide
    torch.save(state, broken / "mismatch" / "checkpoint.pt")
    for name in ("nosplit", "empty", "binary"):
        shutil.copytree(ws / "data", ws / "bad" / name)
    (ws / "bad" / "nosplit" / "wikitext-2" / "wiki.test.tokens").unlink()
    (ws / "bad" / "empty" / "wikitext-2" / "wiki.valid.tokens").write_bytes(b"")
    (ws / "bad" / "binary" / "wikitext-2" / "wiki.valid.tokens").write_bytes(bytes(range(256)) * 40)
    (ws / "a_file").write_text("not a folder\n")
    return ws


# (id, app, overrides given the workspace, needles of the one-line message); exit status 2 for all. One case per
# way a command fails (Hydra, a config check, a sweep's cell, data, a run folder, the file system): the config
# checks themselves, one message each, are test_configs' in-process table.
BAD_INPUT = [
    ("unknown position", "train", lambda w: ["position=foo"], ["unknown position 'foo'", "choose one of alibi, "]),
    ("unknown model", "train", lambda w: ["model=huge"], ["unknown model 'huge'", "paper, small, synthetic, tiny"]),
    ("unknown data set", "train", lambda w: ["data=wikitext5"], ["unknown data 'wikitext5'", "wikitext2"]),
    ("unknown tokenizer", "train", lambda w: ["tokenizer=sentencepiece"], ["unknown tokenizer", "bpe, fairseq, word"]),
    ("misspelled key", "train", lambda w: ["train.seqlen=16"], ["unknown config key 'train.seqlen'"]),
    ("misspelled key (evaluate)", "eval", lambda w: ["eval.multiplier=[1]"], ["'eval.multiplier'"]),
    ("bad cell of a sweep", "train", lambda w: ["-m", "position=alibi,rope", "model.d_model=30", "model.n_head=2"],
     ["rope needs an even head dimension"]),
    ("seq_len 0", "train", lambda w: ["train.seq_len=0"], ["train.seq_len must be >= 1, got 0"]),
    ("eval length 0", "eval", lambda w: ["eval.lengths=[0]", f"run={run_dir_of(w, 'table')}"],
     ["eval.lengths must hold finite numbers >= 1"]),
    ("no data folder, no hub", "train", lambda w: [f"data.root={w}/nowhere", "data.hub_path=null"],
     ["nowhere/wikitext-2 does not exist", "data.hub_path is not set", "data.root="]),
    ("no data folder, hub unreachable", "train", lambda w: [f"data.root={w}/nowhere"],
     ["does not exist", f"hub ({NOWHERE}) is unreachable"]),
    ("missing split", "train", lambda w: [f"data.root={w}/bad/nosplit"], ["missing split file", "wiki.test.tokens"]),
    ("empty split", "train", lambda w: [f"data.root={w}/bad/empty"], ["wiki.valid.tokens is empty"]),
    ("binary split", "train", lambda w: [f"data.root={w}/bad/binary"],
     ["wiki.valid.tokens is not a UTF-8 text file"]),
    ("vocab too large for dtype", "train",
     lambda w: ["tokenizer=bpe", "tokenizer.vocab_size=70000", "tokenizer.token_dtype=uint16"],
     ["70,000 types does not fit tokenizer.token_dtype=uint16", "tokenizer.token_dtype=uint32"]),
    ("resume without checkpoint", "train", lambda w: ["name=table", "seed=7", "train.resume=true"],
     ["train.resume=true but there is no checkpoint to resume", "seed7/checkpoint.pt does not exist"]),
    ("resume with another model", "train", lambda w: ["name=table", "train.resume=true", "model.d_model=64"],
     ["holds a run trained with other settings", "model.d_model=32 there, 64 now"]),
    ("runs under a file", "train", lambda w: [f"paths.runs={w}/a_file/runs"], ["a_file is a file, not a folder"]),
    ("evaluate: not a run", "eval", lambda w: [f"run={w}/data"], ["is not a run folder", "config.yaml"]),
    ("evaluate: no such run", "eval", lambda w: [f"run={w}/nowhere"], ["nowhere does not exist"]),
    ("evaluate: truncated checkpoint", "eval", lambda w: [f"run={w}/broken/truncated"],
     ["broken/truncated/checkpoint.pt is truncated or corrupt"]),
    ("evaluate: corrupt checkpoint", "eval", lambda w: [f"run={w}/broken/flipped"],
     ["broken/flipped/checkpoint.pt is truncated or corrupt"]),
    ("evaluate: checkpoint vs model", "eval", lambda w: [f"run={w}/broken/mismatch"],
     ["does not belong to its run folder"]),
    ("evaluate: results under a file", "eval", lambda w: [f"run={run_dir_of(w, 'table')}",
                                                               f"paths.results={w}/a_file/results"],
     ["a_file is a file, not a folder"]),
]


@pytest.fixture(scope="module")
def bad_input_results(table_ws):
    """Run every case (a few at a time), with snapshots of runs/ and results/ before and after."""
    ws = table_ws
    before = snapshot(ws / "runs", ws / "results")

    def one(case):
        _, app, args, _ = case
        base = tiny(ws, steps=4) if app == "train" else [f"paths.runs={ws}/runs", f"paths.results={ws}/results",
                                                         "device=cpu"]
        return run_cli(app, [*base, *args(ws)], timeout=120)

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        results = dict(zip((c[0] for c in BAD_INPUT), pool.map(one, BAD_INPUT)))
    print(f"{len(BAD_INPUT)} bad-input commands in {time.monotonic() - t0:.1f} s")
    return results, before, snapshot(ws / "runs", ws / "results")


@pytest.mark.slow
@pytest.mark.parametrize("case", BAD_INPUT, ids=[c[0] for c in BAD_INPUT])
def test_bad_input_is_one_line_and_exit_2(bad_input_results, case):
    name, _, _, needles = case
    one_line_error(bad_input_results[0][name], 2, *needles)


@pytest.mark.slow
def test_bad_input_changes_no_file_under_runs_or_results(bad_input_results):
    _, before, after = bad_input_results
    assert before, "the fixture run wrote nothing?"
    assert after == before


@pytest.mark.slow
def test_debug_switch_shows_the_traceback(table_ws):
    out = run_cli("eval", [f"run={table_ws}/broken/truncated", "--debug"])
    assert out.returncode != 0 and "Traceback" in out.stderr and "truncated or corrupt" in out.stderr


# ---- kills: the checkpoint on disk is always whole, and a resume ends on the same weights ------------------


@pytest.mark.slow
def test_kill_9_at_several_points_then_resume_is_bitwise_identical(ws):
    steps, over = 12, {"train.checkpoint_every": 4}
    ref = run_cli("train", tiny(ws, steps=steps, name="ref", **over))
    assert ref.returncode == 0, ref.stderr
    run = run_dir_of(ws, "kill")

    # 1. kill -9 while the second checkpoint (step 8) is being written: the one of step 4 stays whole
    p = Running("train", tiny(ws, steps=steps, name="kill", **over), pause_in_write="checkpoint.pt@2=300")
    p.wait_for("test hook: pausing")
    assert list(run.glob(".checkpoint.pt.*.tmp")), "the new checkpoint should be in its temporary file"
    # meanwhile a second process on the same run folder is refused (a sweep started twice)
    twice = run_cli("train", tiny(ws, steps=steps, name="kill", **over, **{"train.resume": "true"}))
    one_line_error(twice, 2, "is being trained by pid")
    p.kill()
    assert state_of(run)["step"] == 4
    assert json.loads((run / "status.json").read_text())["status"] == "running"

    # 2. resume; kill -9 while log.jsonl is written at step 8, before that step's checkpoint
    p = Running("train", tiny(ws, steps=steps, name="kill", **over, **{"train.resume": "true"}),
                pause_in_write="log.jsonl@1=300")
    p.wait_for("test hook: pausing")
    p.kill()
    assert state_of(run)["step"] == 4
    assert [r["step"] for r in log_records(run)][:4] == [1, 2, 3, 4]

    # 3. resume; kill -9 while status.json says "completed" (its fourth write, after "running" at the start and
    # after the checkpoints of steps 8 and 12): final checkpoint, status running
    p = Running("train", tiny(ws, steps=steps, name="kill", **over, **{"train.resume": "true"}),
                pause_in_write="status.json@4=300")
    p.wait_for("test hook: pausing")
    p.kill()
    assert state_of(run)["step"] == steps
    assert json.loads((run / "status.json").read_text())["status"] == "running"

    # 4. resume: nothing left to train; it completes and keeps its validation perplexity
    last = run_cli("train", tiny(ws, steps=steps, name="kill", **over, **{"train.resume": "true"}))
    assert last.returncode == 0, last.stderr
    assert f"at step {steps}/{steps}" in last.stdout and "validation perplexity at L=16: not" not in last.stdout
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "completed" and status["val_ppl"] is not None
    assert not list(run.glob(".*.tmp")), "the temporary files of killed writes are cleaned up"

    ref_dir = run_dir_of(ws, "ref")
    assert_same_weights(state_of(ref_dir), state_of(run))
    assert log_records(run) == log_records(ref_dir)  # every step once, with bitwise equal losses


@pytest.mark.slow
def test_nan_loss_stops_keeps_the_last_good_checkpoint_and_marks_the_run_failed(ws):
    out = run_cli("train", tiny(ws, steps=12, name="nan"), nan_at_step=7)
    line = one_line_error(out, 3, "loss is nan at step 7", "last good checkpoint (step 4) is kept")
    assert "train.lr" in line
    run = run_dir_of(ws, "nan")
    assert state_of(run)["step"] == 4
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "failed" and "nan" in status["reason"]


@pytest.mark.slow
def test_disk_full_while_checkpointing_is_one_line_and_keeps_the_previous_checkpoint(ws):
    # The real command line with torch.save failing as a full disk makes it fail (ENOSPC on the second save).
    out = run_cli("train", tiny(ws, steps=12, name="full"), disk_full_at_save=2)
    one_line_error(out, 2, "training stopped at step 8", "checkpoint of step 4 is kept", "No space left on device",
                   "free some space", "train.resume=true")
    run = run_dir_of(ws, "full")
    assert state_of(run)["step"] == 4
    assert not list(run.glob(".*.tmp"))
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "failed" and "No space left" in status["reason"]


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores permission bits; see the a_file cases of the table "
                                                 "and test_unwritable_folder_is_reported_before_any_work")
def test_unwritable_runs_folder_is_one_line(ws, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        out = run_cli("train", tiny(ws, steps=4, **{"paths.runs": locked / "runs"}))
        one_line_error(out, 2, "paths.runs=", "is not writable")
    finally:
        locked.chmod(0o700)


@pytest.mark.slow
def test_wandb_offline_with_no_network_does_not_block(ws):
    out = run_cli("train", tiny(ws, steps=4, name="offline", **{"logger.wandb.mode": "offline"}), timeout=150)
    assert out.returncode == 0, out.stdout + out.stderr
    run = run_dir_of(ws, "offline")
    assert json.loads((run / "status.json").read_text())["status"] == "completed"
    assert list((run / "wandb").glob("offline-run-*")), "wandb wrote its offline run for `wandb sync`"


@pytest.mark.slow
def test_a_scheme_defined_in_the_tests_trains_and_evaluates_through_the_command_line(ws):
    """Adding a scheme is one module and one YAML: tests/example_scheme.py and tests/configs/position/example.yaml
    (tests/app.py imports the one and puts the other on the config search path) make position=example a choice
    of the real command line, with its option position.scale, checked like the built-in ones."""

    def app(*args):
        cmd = [sys.executable, str(REPO / "tests" / "app.py"), "alibi_lm.train", *map(str, args)]
        return subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=180)

    over = {"train.evaluate_after": "true", "eval.multipliers": "[1,2]"}
    out = app(*tiny(ws, steps=4, name="plugin", **over), "position=example", "position.scale=0.25")
    assert out.returncode == 0, out.stderr
    config = OmegaConf.load(run_dir_of(ws, "plugin", "example") / "config.yaml")
    assert config.model.position == "example" and config.model.position_options == {"scale": 0.25}
    rows = pd.read_csv(ws / "results" / "plugin" / "extrapolation.csv")
    assert set(rows["position"]) == {"example"} and sorted(rows["eval_len"]) == [16, 32] and rows["ppl"].gt(0).all()
    one_line_error(app(*tiny(ws, steps=4, name="plugin2"), "position=example", "position.scale=0"), 2,
                   "position.scale must be > 0")
    assert not (ws / "runs" / "plugin2").exists()


# ---- kills during evaluation and sweeps: results/ is never partial or duplicated ---------------------------


@pytest.mark.slow
def test_kill_9_during_evaluation_then_skip_done_scores_only_the_rest(table_ws):
    ws, run = table_ws, run_dir_of(table_ws, "table")
    results = ws / "results_kill"
    args = [f"run={run}", f"paths.results={results}", "device=cpu", "eval.multipliers=[1,2,4,8]",
            "eval.max_tokens=256"]
    csv = results / "table" / "extrapolation.csv"
    p = Running("eval", args, pause_in_write="extrapolation.csv@3=300")  # after 2 of 4 lengths
    p.wait_for("test hook: pausing")
    p.kill()
    first = pd.read_csv(csv)
    assert sorted(first["eval_len"]) == [16, 32]
    again = run_cli("eval", [*args, "eval.skip_done=true"])
    assert again.returncode == 0, again.stderr
    df = pd.read_csv(csv)
    assert sorted(df["eval_len"]) == [16, 32, 64, 128] and not df.duplicated(["eval_len"]).any()
    kept = df[df["eval_len"] <= 32].sort_values("eval_len").reset_index(drop=True)
    pd.testing.assert_frame_equal(kept, first.sort_values("eval_len").reset_index(drop=True))  # not re-scored
    assert not list(csv.parent.glob(".*.tmp")) and (csv.parent / "extrapolation.md").is_file()


@pytest.mark.slow
def test_a_sweeps_rows_name_each_cells_command_with_the_users_config_folder(ws, tmp_path):
    """The command column of a sweep's rows is its cell's, and runs as written: with the user's config folder
    (--config-dir, which the apps pass to Hydra as hydra.searchpath), where the experiment named is found."""
    (tmp_path / "mine" / "experiment").mkdir(parents=True)
    (tmp_path / "mine" / "experiment" / "mine.yaml").write_text("# @package _global_\nname: mine\nseed: 0\n")
    args = ["-m", "--config-dir", tmp_path / "mine", "experiment=mine", "name=mine", "position=alibi,nope",
            *tiny(ws, steps=2), "train.evaluate_after=true", "eval.multipliers=[1]"]
    done = run_cli("train", args)
    assert done.returncode == 0, done.stderr
    rows = pd.read_csv(ws / "results" / "mine" / "extrapolation.csv")
    commands = dict(zip(rows["position"], rows["command"]))
    assert set(commands) == {"alibi", "nope"} and all(f"position={p} " in c for p, c in commands.items())
    assert all("hydra.searchpath=" in c and "alibi,nope" not in c for c in commands.values())
    again = subprocess.run(shlex.split(commands["nope"].replace("python", sys.executable, 1)), cwd=REPO, env=env(),
                           capture_output=True, text=True, timeout=180)
    assert again.returncode == 0 and "is already trained" in again.stdout, again.stderr  # the same run, found again


def test_kill_9_during_a_sweep_then_rerun_finishes_only_what_is_missing(ws):
    args = ["-m", "position=alibi,nope", *tiny(ws, steps=8, name="sweep"), "train.resume=auto",
            "train.evaluate_after=true", "eval.multipliers=[1,2]"]
    csv = ws / "results" / "sweep" / "extrapolation.csv"
    p = Running("train", args, pause_in_write="nope-L16-seed0/checkpoint.pt=300")
    p.wait_for("test hook: pausing")
    p.kill()
    first = pd.read_csv(csv)
    assert set(first["position"]) == {"alibi"} and len(first) == 2
    # each row names its cell's command (position=alibi), not the sweep's (position=alibi,nope), which made both cells
    assert set(first["command"].str.contains(" position=alibi ")) == {True} and "alibi,nope" not in first["command"][0]
    alibi = run_dir_of(ws, "sweep", "alibi")
    alibi_state = (alibi / "checkpoint.pt").read_bytes()

    again = run_cli("train", args)
    assert again.returncode == 0, again.stderr
    assert "is already trained" in again.stdout and "already in" in again.stdout
    df = pd.read_csv(csv)
    assert len(df) == 4 and not df.duplicated(["position", "eval_len"]).any()
    assert sorted(map(tuple, df[["position", "eval_len"]].values.tolist())) == [
        ("alibi", 16), ("alibi", 32), ("nope", 16), ("nope", 32)]
    pd.testing.assert_frame_equal(df[df["position"] == "alibi"].reset_index(drop=True), first)  # not re-scored
    assert (alibi / "checkpoint.pt").read_bytes() == alibi_state  # the finished cell was not touched
    for position in ("alibi", "nope"):
        assert json.loads((run_dir_of(ws, "sweep", position) / "status.json").read_text())["status"] == "completed"


# ---- DDP on CPU (gloo): one writer, and a killed DDP run resumes to the same weights ------------------------


@pytest.mark.slow
def test_ddp_two_processes_train_and_resume_after_kill(ws):
    over = {"train.checkpoint_every": 4}
    # abort_at_exit: a rank whose teardown aborts (as gloo's threads can) after its run finished well fails nothing
    ref = run_cli("torchrun", tiny(ws, steps=8, name="ddp", **over), timeout=240, abort_at_exit=1)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    assert ref.stdout.count("done: ") == 1  # rank 0 alone reports and writes
    state = state_of(run_dir_of(ws, "ddp"))
    assert state["step"] == 8 and len(state["rng"]) == 2 and [s["rank"] for s in state["sampler"]] == [0, 1]
    assert state["cpu_threads"] == [1, 1]  # each rank's threads, which its resume takes again

    p = Running("torchrun", tiny(ws, steps=8, name="ddpkill", **over), pause_in_write="checkpoint.pt@2=300")
    p.wait_for("test hook: pausing", timeout=180)
    p.kill()  # torchrun and both workers
    killed = run_dir_of(ws, "ddpkill")
    assert state_of(killed)["step"] == 4
    resumed = run_cli("torchrun", tiny(ws, steps=8, name="ddpkill", **over, **{"train.resume": "true"}),
                      timeout=240)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming" in resumed.stdout
    assert_same_weights(state, state_of(killed))


# ---- in-process: the pieces ---------------------------------------------------------------------------------


def test_atomic_write_disk_full_keeps_the_old_file_and_says_so(tmp_path, monkeypatch):
    target = tmp_path / "checkpoint.pt"
    ckpt.save_checkpoint(tmp_path, {"model": {"w": torch.ones(3)}, "model_config": {}, "step": 1})

    def full(obj, f, *args, **kwargs):
        f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(UserError, match=r"cannot write .*checkpoint.pt \(No space left on device\); free some"):
        ckpt.save_checkpoint(tmp_path, {"model": {}, "model_config": {}, "step": 2})
    assert ckpt.load_checkpoint(target)["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]


def test_atomic_write_gives_the_mode_open_would(tmp_path):
    ckpt.atomic_write_text(tmp_path / "a.txt", "x")
    (tmp_path / "b.txt").write_text("x")
    assert (tmp_path / "a.txt").stat().st_mode == (tmp_path / "b.txt").stat().st_mode


def test_corrupt_checkpoints_are_user_errors(tmp_path):
    path = tmp_path / "checkpoint.pt"
    torch.save({"model": {"w": torch.arange(4096.0)}, "model_config": {}}, path)
    blob = path.read_bytes()
    rng = random.Random(0)
    variants = [b"", b"not a zip", blob[:100], blob[: len(blob) // 2], blob[:-1]]
    for _ in range(20):
        damaged = bytearray(blob)
        damaged[rng.randrange(len(blob) // 4, 3 * len(blob) // 4)] ^= 1 << rng.randrange(8)
        variants.append(bytes(damaged))
    for v in variants:
        path.write_bytes(v)
        with pytest.raises(UserError, match="is truncated or corrupt"):
            ckpt.load_checkpoint(path)


def test_checkpoint_config_reads_the_config_without_the_weights(tmp_path):
    path = tmp_path / "checkpoint.pt"
    config = {"train": {"seq_len": 16, "lr": 1e-3}, "model": {"position": "alibi"}}
    torch.save({"model": {"w": torch.arange(4096.0)}, "model_config": {}, "config": config}, path)
    assert ckpt.checkpoint_config(path) == ckpt.load_checkpoint(path)["config"] == config
    blob = bytearray(path.read_bytes())
    at = blob.index(torch.arange(4096.0).numpy().tobytes()[4000:4016])  # inside the tensor's bytes
    blob[at] ^= 1
    path.write_bytes(bytes(blob))
    with pytest.raises(UserError, match="is truncated or corrupt"):  # the load that uses the weights checks them
        ckpt.load_checkpoint(path)
    assert ckpt.checkpoint_config(path) == config  # never read
    torch.save({"model": {}, "model_config": {}}, path)
    assert ckpt.checkpoint_config(path) is None


@pytest.mark.parametrize("text", ["{}", "null", "[1, 2]", '"completed"', '{"status": 3}', "{not json", "\xff\xfe"])
def test_a_damaged_status_json_reads_as_missing(tmp_path, text):
    (tmp_path / "status.json").write_bytes(text.encode("latin-1"))
    assert ckpt.read_status(tmp_path) == {"status": "missing"}
    assert not resume_wanted("auto", tmp_path)  # no checkpoint either: a fresh start, not a traceback


def test_a_file_where_an_output_folder_should_be_is_named_as_such(tmp_path):
    from alibi_lm.errors import write_error

    (tmp_path / "per_position").write_text("a file")
    for make in (lambda: (tmp_path / "per_position").mkdir(parents=True, exist_ok=True),  # EEXIST
                 lambda: (tmp_path / "per_position" / "x.csv").write_text("")):  # ENOTDIR
        with pytest.raises(OSError) as e:
            make()
        message = str(write_error(tmp_path / "per_position", e.value))
        assert "a file stands where a folder of the output should be: move it away" in message, message
        assert "permissions" not in message


def test_second_lock_on_a_run_folder_is_refused(tmp_path):
    with ckpt.lock_run(tmp_path):
        with pytest.raises(UserError, match=f"is being trained by pid {os.getpid()}"):
            with ckpt.lock_run(tmp_path):
                pass
    with ckpt.lock_run(tmp_path):  # released
        pass


def test_unwritable_folder_is_reported_before_any_work(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is a file, not a folder"):
        check_writable(tmp_path / "file" / "runs", "paths.runs")
    # root passes os.access for any folder; emulate a folder without write permission
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == tmp_path else real_access(p, mode))
    with pytest.raises(UserError, match=r"paths.runs=.*/runs cannot be created \(.* is not writable\)"):
        check_writable(tmp_path / "runs", "paths.runs")


def test_run_folder_checks(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(UserError, match="no checkpoint to resume"):
        resume_wanted(True, run)
    assert resume_wanted("auto", run) is False
    run.mkdir()
    (run / "checkpoint.pt").write_bytes(b"x")
    with pytest.raises(UserError, match="already holds a checkpoint .status: missing.; add train.resume=true"):
        resume_wanted(False, run)
    ckpt.write_status(run, "completed")
    assert resume_wanted(False, run) is False  # a finished run: the app skips it
    assert resume_wanted("auto", run) is True
    job = compose_job("train", "model.d_model=32", "train.resume=true")
    (run / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(job)))
    check_same_run(job, run)
    with pytest.raises(UserError, match=r"other settings \(model.d_model=32 there, 64 now\)"):
        check_same_run(compose_job("train", "model.d_model=64", "train.resume=true"), run)
    check_same_run(compose_job("train", "model.d_model=32", "model.attn_query_block=64"), run)  # how, not what
    old = OmegaConf.load(run / "config.yaml")
    del old.tokenizer["token_dtype"]  # a key config.yaml predates is not a difference
    (run / "config.yaml").write_text(OmegaConf.to_yaml(old))
    check_same_run(compose_job("train", "model.d_model=32", "tokenizer.token_dtype=uint32"), run)


def test_a_run_whose_config_yaml_is_gone_is_checked_against_its_checkpoints_copy(tmp_path):
    """config.yaml deleted or damaged by hand: the settings check reads the copy checkpoint.pt keeps, so a changed
    setting is still refused and the same one still reused."""
    from conftest import compose_job

    from alibi_lm.errors import UserError
    from alibi_lm.training.trainer import Trainer

    settings = ["experiment=tasks", "task=copy", "task.symbols=4", "position=alibi", "model.n_layer=1", "model.d_model=32",
                "model.d_ff=64", "train.seq_len=16", "train.batch_size=4", "train.max_steps=4", "train.warmup_steps=2",
                "train.eval_every=4", "train.checkpoint_every=4", "train.progress=false", "train.evaluate_after=false",
                f"paths.runs={tmp_path / 'runs'}"]
    Trainer(compose_job("train", *settings), tmp_path / "run").run()
    for damage in ("delete", "garble"):
        config = tmp_path / "run" / "config.yaml"
        config.unlink() if damage == "delete" else config.write_text("train: [unclosed\n")
        with pytest.raises(UserError, match=r"other settings \(train.lr=0.001 there, 0.0001 now; as its checkpoint.pt records\)"):
            check_same_run(compose_job("train", *settings, "train.lr=1e-4"), tmp_path / "run")
        check_same_run(compose_job("train", *settings, "train.threads=2"), tmp_path / "run")  # how it runs: the same


def test_atomic_write_keeps_a_read_only_file(tmp_path):
    table = tmp_path / "results.csv"
    table.write_text("kept\n")
    table.chmod(0o444)  # a table the user protects; the folder stays writable, and root passes access checks
    with pytest.raises(UserError, match=rf"{table} is read-only, so it is kept as it is; .*chmod u\+w"):
        ckpt.atomic_write_text(table, "replaced\n")
    assert table.read_text() == "kept\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.csv"]
    table.chmod(0o644)
    ckpt.atomic_write_text(table, "replaced\n")
    assert table.read_text() == "replaced\n"
