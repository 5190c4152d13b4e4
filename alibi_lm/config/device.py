"""Where and how a job computes: the device (auto, cpu, cuda[:i], under torchrun each process's GPU), the precision
forwards autocast to, the CPU threads, and whether an output folder can be written."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..errors import UserError, check_choice
from .schemas import PRECISIONS, check_device


def set_cpu_threads(threads: int | None) -> int:
    """torch's intra-op threads: `threads`, else $OMP_NUM_THREADS (which torch reads itself), else the cores this
    process may run on (its affinity: what a cluster job or `taskset` gives it, which can be fewer than the
    machine's cores; more threads than cores makes each step wait for a descheduled thread)."""
    if threads is None and "OMP_NUM_THREADS" not in os.environ and hasattr(os, "sched_getaffinity"):
        threads = len(os.sched_getaffinity(0))
    if threads:
        torch.set_num_threads(int(threads))
    return torch.get_num_threads()


def autocast_dtype(device, precision: str) -> torch.dtype | None:
    """The dtype forwards on `device` autocast to at `precision` (train.precision, the apps' precision): None for
    float32. auto is bf16 on CUDA, float32 elsewhere (a CPU's bf16 matmuls are emulated: slower, not faster)."""
    check_choice("precision", precision, PRECISIONS)
    if precision == "auto":
        precision = "bf16" if torch.device(device).type == "cuda" else "fp32"
    return torch.bfloat16 if precision == "bf16" else None


def resolve_device(name: str, key: str = "device") -> torch.device:
    """auto: CUDA when there is a GPU, else the CPU; under torchrun, this process's GPU."""
    check_device(name, key)
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"{key}={name} but no CUDA device is visible; use {key}=auto or {key}=cpu")
    if name.startswith("cuda:") and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise UserError(f"{key}={name} under torchrun would put every process on one GPU; use {key}=cuda (each process "
                        f"takes its own, LOCAL_RANK's)")
    if name == "cuda" and "LOCAL_RANK" in os.environ:
        local_rank, gpus = int(os.environ["LOCAL_RANK"]), torch.cuda.device_count()
        if local_rank >= gpus:
            processes = os.environ.get("LOCAL_WORLD_SIZE", local_rank + 1)
            raise UserError(f"torchrun started {processes} processes on this machine but {gpus} GPU(s) are visible; "
                            f"use --nproc_per_node={gpus} (one process per GPU) or {key}=cpu")
        return torch.device("cuda", local_rank)
    return torch.device(name)


def check_writable(path, key: str) -> None:
    """`path` is a writable folder or can be created: its nearest existing ancestor is a writable folder."""
    path = Path(path).expanduser().absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())  # at the latest the root
    if not existing.is_dir():
        raise UserError(f"{key}={path} cannot be created: {existing} is a file, not a folder; set {key}=<a folder>")
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "is not writable" if existing == path else f"cannot be created ({existing} is not writable)"
        raise UserError(f"{key}={path} {what}; fix the permissions or set {key}=<a writable folder>")
