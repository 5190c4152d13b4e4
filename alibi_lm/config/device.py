"""Where and how a job computes: the device (auto, cpu, cuda[:i], under torchrun each process's GPU), the precision
forwards autocast to, the CPU threads, and whether an output folder can be written."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import torch

from ..errors import UserError, check_choice
from .schemas import PRECISIONS, check_device

BUSY_SAMPLE_S = 0.25  # how long the start of a job watches the cores it may use


def allowed_cores() -> set[int]:
    """The cores this process may run on (its affinity: what a cluster job or `taskset` gives it, which can be fewer
    than the machine's cores)."""
    return set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


def core_times(cores: set[int]) -> dict[int, tuple[int, int]] | None:
    """core -> (all, idle) jiffies from /proc/stat (idle counts iowait); None where it cannot be read (not Linux)."""
    try:
        with open("/proc/stat") as f:
            lines = [line.split() for line in f if line.startswith("cpu") and line[3:4].isdigit()]
    except OSError:
        return None
    times = {}
    for name, *values in lines:
        if int(name[3:]) in cores:
            ticks = [int(v) for v in values[:8]]  # user nice system idle iowait irq softirq steal (guest is in user)
            times[int(name[3:])] = (sum(ticks), ticks[3] + ticks[4])
    return times


def busy_cores(cores: set[int], seconds: float = BUSY_SAMPLE_S) -> float:
    """How many of `cores` other processes keep busy now: the busy share of each core over `seconds` while this
    process waits, summed; where /proc/stat is not readable, the 1-minute load average's share of these cores."""
    before = core_times(cores)
    if before is None:
        return os.getloadavg()[0] * len(cores) / (os.cpu_count() or 1) if hasattr(os, "getloadavg") else 0.0
    time.sleep(seconds)
    after = core_times(cores) or before
    busy = 0.0
    for core, (total, idle) in before.items():
        if core in after and after[core][0] > total:
            busy += 1 - (after[core][1] - idle) / (after[core][0] - total)
    return busy


def default_threads() -> tuple[int, str]:
    """(threads, why): one per core this process may use that other processes do not keep busy now, at least one.
    More threads than free cores makes every parallel op wait for a descheduled thread: beside one busy process on
    2 cores, 2 threads train several times slower than 1 (make bench, section 5)."""
    cores = allowed_cores()
    busy = busy_cores(cores)
    threads = max(1, min(len(cores), math.floor(len(cores) - busy + 0.5)))  # half a core free counts as free
    return threads, (f"{threads} CPU thread{'s' if threads > 1 else ''}: {len(cores)} core(s) this process may use, "
                     f"{busy:.1f} of them kept busy by other processes at the start (train.threads=N sets it)")


def apply_cpu_threads(threads: int | None, trained: int | None = None) -> tuple[int, str]:
    """torch's intra-op threads, set, and why: `threads`, else $OMP_NUM_THREADS (which torch reads itself), else
    `trained` (a resume: the threads of the steps before its checkpoint, as CPU kernels split their sums by thread
    and another count would change the weights' last bits), else default_threads() (the free cores this process
    may use)."""
    if threads:
        torch.set_num_threads(int(threads))
        return torch.get_num_threads(), f"{torch.get_num_threads()} CPU thread(s): train.threads"
    if "OMP_NUM_THREADS" in os.environ:
        return torch.get_num_threads(), f"{torch.get_num_threads()} CPU thread(s): OMP_NUM_THREADS"
    if trained:
        torch.set_num_threads(int(trained))
        return trained, (f"{trained} CPU thread(s): as the steps before the checkpoint, so that the run continues to "
                         f"the same weights (train.threads=N sets it)")
    threads, why = default_threads()
    torch.set_num_threads(threads)
    return torch.get_num_threads(), why


def set_cpu_threads(threads: int | None) -> int:
    """apply_cpu_threads without the reason: the threads torch now uses."""
    return apply_cpu_threads(threads)[0]


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
