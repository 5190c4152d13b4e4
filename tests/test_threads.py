"""CPU threads that fit the cores a process may use (train.threads, config.set_cpu_threads)."""

from __future__ import annotations

import os

import pytest
import torch

from alibi_lm.config import set_cpu_threads


@pytest.fixture(autouse=True)
def _restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_without_a_setting_the_threads_are_the_cores_this_process_may_use(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3}, raising=False)  # as `taskset -c 3` gives
    torch.set_num_threads(2)
    assert set_cpu_threads(None) == 1 == torch.get_num_threads()


def test_omp_num_threads_is_left_to_torch_and_a_setting_wins(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    torch.set_num_threads(2)
    assert set_cpu_threads(None) == 2
    assert set_cpu_threads(1) == 1


@pytest.mark.parametrize("threads", [0, -1])
def test_a_thread_count_below_one_is_a_config_error(threads):
    from alibi_lm.config import TrainConfig
    from alibi_lm.errors import ConfigError

    with pytest.raises(ConfigError, match=f"train.threads must be >= 1, got {threads}"):
        TrainConfig(threads=threads)
