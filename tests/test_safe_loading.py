"""Checkpoints are read as weights and plain data only: a pickled object that would run code is refused with
one line by every app that reads a checkpoint, and never runs. Checkpoints of earlier versions still load."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from test_reliability import one_line_error, run_cli, run_dir_of, tiny

from alibi_lm import checkpoint as ckpt
from alibi_lm.errors import UserError
from alibi_lm.training.distributed import rng_state, set_rng_state


class Payload:
    """What an attacker adds to a shared checkpoint: unpickling it runs a shell command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def plant_payload(run: Path, marker: Path) -> None:
    state = ckpt.load_checkpoint(run)
    state["extra"] = Payload(marker)
    torch.save(state, run / ckpt.CHECKPOINT)


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory) -> tuple[Path, Path]:
    """A workspace with a run trained by the project whose checkpoint.pt then gained a payload; the marker
    file the payload would create."""
    from conftest import write_corpus

    ws = tmp_path_factory.mktemp("safe-loading")
    write_corpus(ws / "data")
    out = run_cli("train", tiny(ws, steps=4, name="poisoned"))
    assert out.returncode == 0, out.stderr
    marker = ws / "PWNED"
    plant_payload(run_dir_of(ws, "poisoned"), marker)
    return ws, marker


def test_the_planted_payload_is_live(tmp_path):
    """The test's own check that its payload works: unpickled in full, it creates its marker."""
    marker = tmp_path / "live"
    torch.save({"extra": Payload(marker)}, tmp_path / "bad.pt")
    torch.load(tmp_path / "bad.pt", weights_only=False)
    assert marker.exists()


@pytest.mark.slow
@pytest.mark.parametrize("app", ["evaluate", "resume", "probes"])
def test_every_app_refuses_a_checkpoint_that_carries_code(poisoned, app):
    ws, marker = poisoned
    run = run_dir_of(ws, "poisoned")
    args = {
        "evaluate": lambda: ("eval", [f"run={run}", f"paths.results={ws}/results", "eval.max_tokens=256"]),
        "resume": lambda: ("train", tiny(ws, steps=6, name="poisoned", **{"train.resume": "true"})),
        "probes": lambda: ("probes", [f"run={run}", f"paths.results={ws}/results"]),
    }[app]
    before = (run / ckpt.CHECKPOINT).read_bytes()
    out = run_cli(*args())
    one_line_error(out, 2, f"{run}/checkpoint.pt holds posix.system", "could run code", "refused")
    assert not marker.exists(), "the payload ran"
    assert (run / ckpt.CHECKPOINT).read_bytes() == before


def test_a_refused_checkpoint_names_the_file_and_the_type(tmp_path):
    marker = tmp_path / "PWNED"
    torch.save({"model": {}, "model_config": {}, "extra": Payload(marker)}, tmp_path / "checkpoint.pt")
    with pytest.raises(UserError, match=r"checkpoint\.pt holds posix\.system, an object that could run code"):
        ckpt.load_checkpoint(tmp_path)
    assert not marker.exists()


@pytest.mark.slow
def test_a_checkpoint_holds_only_what_the_weights_only_unpickler_reads(poisoned):
    """What the Trainer saves loads with torch.load(weights_only=True) and no allowed globals at all."""
    ws, _ = poisoned
    out = run_cli("train", tiny(ws, steps=2, name="clean"))
    assert out.returncode == 0, out.stderr
    state = torch.load(run_dir_of(ws, "clean") / ckpt.CHECKPOINT, weights_only=True)
    assert {"model", "optimizer", "scheduler", "rng", "sampler", "model_config", "config", "step"} <= set(state)
    assert isinstance(state["config"], dict) and isinstance(state["rng"][0]["numpy"], dict)


def test_the_rng_state_round_trips_through_a_weights_only_file(tmp_path):
    random.seed(3), np.random.seed(3), torch.manual_seed(3)
    torch.save({"rng": rng_state()}, tmp_path / "rng.pt")
    expected = (random.random(), np.random.rand(3), torch.rand(3))
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True)["rng"])
    assert random.random() == expected[0]
    assert np.array_equal(np.random.rand(3), expected[1])
    assert torch.equal(torch.rand(3), expected[2])


def test_a_checkpoint_of_an_earlier_version_still_loads_and_restores_its_rng(tmp_path):
    """Earlier versions saved numpy's legacy RNG tuple (an ndarray inside): allowed by name, nothing else is."""
    np.random.seed(5)
    legacy = np.random.get_state()
    expected = np.random.rand(4)
    state = {"model": {}, "model_config": {}, "rng": [{"python": random.getstate(), "numpy": legacy,
                                                        "torch": torch.get_rng_state(), "cuda": None}]}
    torch.save(state, tmp_path / "checkpoint.pt")
    loaded = ckpt.load_checkpoint(tmp_path)
    np.random.seed(0)
    set_rng_state(loaded["rng"][0])
    assert np.array_equal(np.random.rand(4), expected)
