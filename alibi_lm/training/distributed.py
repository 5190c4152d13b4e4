"""Distributed training (torchrun / DDP: one process per device, gloo on CPUs, nccl on GPUs) and the random
generators' state that a checkpoint keeps, so that a resumed run continues to the same weights."""

from __future__ import annotations

import logging
import os
import random
import sys

import numpy as np
import torch
import torch.distributed as dist

from ..config import resolve_device


def setup_distributed(device: str = "auto") -> tuple[int, int]:
    """(rank, world_size); initialises the process group when launched by torchrun: nccl where train.device
    resolves to CUDA (each process on its LOCAL_RANK's GPU), gloo on the CPU (train.device=cpu on a machine with
    GPUs too)."""
    if "RANK" in os.environ and not dist.is_initialized():
        resolved = resolve_device(device, "train.device")
        dist.init_process_group("nccl" if resolved.type == "cuda" else "gloo")
        if resolved.type == "cuda":
            torch.cuda.set_device(resolved)
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def end_rank_process() -> None:
    """Under torchrun, end this rank's process once its command has finished well, without the interpreter's
    teardown. Every output is written and flushed by then, and the process group destroyed, yet native threads
    (gloo's among them) can still abort a rank while the interpreter tears down: SIGABRT, "terminate called without
    an active exception", and torchrun reports a run that finished as failed. Outside torchrun: nothing."""
    if "RANK" not in os.environ:  # as setup_distributed decides (torchrun --nproc_per_node=1 included)
        return
    logging.shutdown()  # Hydra's job log
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (torchrun ... | head): the run itself finished well
            pass
    os._exit(0)


def rng_state(device=None) -> dict:
    """Every generator's state as plain data (tensors, numbers, strings), which torch.load(weights_only=True)
    reads back: numpy's key array travels as a tensor. The CUDA generator's only where `device` is a GPU (a run on
    the CPU of a GPU machine opens no CUDA context)."""
    on_cuda = device is not None and torch.device(device).type == "cuda"
    cuda = torch.cuda.get_rng_state(torch.device(device)) if on_cuda else None
    numpy = np.random.get_state(legacy=False)  # {bit_generator, state: {key (624,) uint32, pos}, has_gauss, gauss}
    numpy["state"]["key"] = torch.from_numpy(numpy["state"]["key"].astype(np.int64))
    return {"python": random.getstate(), "numpy": numpy, "torch": torch.get_rng_state(), "cuda": cuda}


def set_rng_state(state: dict, device=None) -> None:
    random.setstate(state["python"])
    numpy = state["numpy"]  # a dict; a legacy tuple in checkpoints of earlier versions
    if isinstance(numpy, dict):
        numpy["state"]["key"] = np.asarray(numpy["state"]["key"], dtype=np.uint32)
    np.random.set_state(numpy)
    torch.set_rng_state(state["torch"])
    cuda = state["cuda"]
    if cuda is not None and device is not None and torch.device(device).type == "cuda":
        device = torch.device(device)
        index = device.index if device.index is not None else torch.cuda.current_device()
        if isinstance(cuda, (list, tuple)):  # earlier checkpoints: every visible GPU's
            cuda = cuda[index] if index < len(cuda) else None
        if cuda is not None:
            torch.cuda.set_rng_state(cuda.cpu(), device)
