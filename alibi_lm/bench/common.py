"""What every section shares: the model configs (Hydra, as alibi_lm.train composes them), the
synthetic token ids, the device helpers and the machine's description."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from omegaconf import open_dict

from alibi_lm.config import compose, model_config
from alibi_lm.positions import POSITION_SCHEMES

from ..plans import checkout_root
from ..plans.variants import VARIANTS, model_overrides

ROOT = checkout_root()  # results/, runs/
VOCAB = 33278  # word-level WikiText-2
BASELINE = "nope"  # every scheme's training throughput is compared with it


def registered_schemes() -> list[str]:
    """Every scheme in the registry, alphabetical, the baseline last: new schemes need no edit here."""
    return sorted(POSITION_SCHEMES, key=lambda s: (s == BASELINE, s))


def benchmarked_schemes() -> list[str]:
    """The registry's schemes and the variants of alibi_lm/plans/variants.py (fox+rope, irope, alibi+ssmax, ...), the
    baseline last: what make bench measures by default."""
    schemes = registered_schemes()
    return [*schemes[:-1], *VARIANTS, schemes[-1]]


def lm_config(model: str, scheme: str, seq_len: int, overrides=(), max_positions: int | None = None):
    """(LMConfig, Hydra cfg). max_positions raises a scheme's table (a `max_len` option, as learned
    has) so that it can be run that long: its rows past seq_len are untrained, for speed and memory."""
    # the real config of `python -m alibi_lm.train model=<model> position=<scheme> train.seq_len=<seq_len>` (or
    # the overrides of a variant, alibi_lm/plans/variants.py)
    layers = int(compose("train", [f"model={model}"]).model.n_layer)
    cfg = compose("train", [f"model={model}", *model_overrides(scheme, layers, seq_len), f"train.seq_len={seq_len}",
                            *overrides])
    if max_positions is not None and "max_len" in cfg.position:
        with open_dict(cfg):
            cfg.position.max_len = max(max_positions, cfg.position.max_len)
    return model_config(cfg, VOCAB), cfg


def attention_path(model, device) -> str:
    """The attention path a model's forward takes in its current mode, as the report names it: flex, sdpa, or
    explicit (a content-aware scheme's scores computed per query block with its content bias, no fused kernel).
    Asked under the bench's autocast, as its steps run: in training on CUDA the gradient probe builds bf16 kernels."""
    with amp_context(device):
        return model.attention_paths(device)[model.cfg.position]["path"]


def attention_why(model, device) -> str:
    """Why the model's main scheme takes attention_path (explain_backend's reason, e.g. attention dropout)."""
    with amp_context(device):
        return model.attention_paths(device)[model.cfg.position]["why"]


def zipf_tokens(shape, seed: int) -> np.ndarray:
    """Token ids with p(id) ~ 1 / (id + 1): ids are frequency ranks, as the word tokenizer's are."""
    p = 1.0 / np.arange(1, VOCAB + 1)
    return np.random.default_rng(seed).choice(VOCAB, size=shape, p=p / p.sum()).astype(np.int64)


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def amp_context(device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def host_kind(device) -> str:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return "cuda-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return f"cpu-{len(os.sched_getaffinity(0))}core"


def describe_failure(e: BaseException) -> str:
    """One short cell for a model that could not run (out of memory, a kernel that does not compile)."""
    if isinstance(e, torch.cuda.OutOfMemoryError) or "can't allocate memory" in str(e):
        return "out of memory"
    first = (str(e).splitlines() or [""])[0]
    return f"failed: {type(e).__name__}: {first[:120]}"


def _busy_cpu_seconds() -> float:
    """CPU seconds all processes have been busy since boot (user, nice, system, irq, softirq, steal)."""
    try:
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return float("nan")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (ticks + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@dataclass
class CpuMeter:
    """How much of the machine other processes used while a section ran: with 2 torch threads on 2
    cores, a step slows down far more than the CPU it loses (each parallel op waits for a descheduled
    thread), and not alike for every model, so timings are only comparable on a quiet machine."""

    wall: float
    busy: float
    own: float

    @classmethod
    def start(cls) -> CpuMeter:
        return cls(time.perf_counter(), _busy_cpu_seconds(), _own_cpu_seconds())

    def others_share(self) -> float:
        """Share of all cores used by other processes since start (0 = quiet, 1 = every core busy)."""
        wall = time.perf_counter() - self.wall
        others = (_busy_cpu_seconds() - self.busy) - (_own_cpu_seconds() - self.own)
        return max(0.0, others) / max(wall * (os.cpu_count() or 1), 1e-9)
