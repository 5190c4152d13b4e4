"""Section 5: what torch's thread count does on a shared machine. Training tokens/s of the ALiBi model at the
first L with 1 and 2 threads (torch.set_num_threads) and with the apps' default (config.default_threads: the free
cores this process may use, looked at when the stretch starts), each without and with a busy process of its own
(a Python busy loop pinned to one of this process's cores, killed afterwards), side by side in one run:
the cells alternate (1, 2, default, then busy, then the reverse), a few seconds each, and a cell's tokens/s is
the median over its repetitions."""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import time

import torch

from alibi_lm.config.device import default_threads

from .common import CpuMeter, sync, zipf_tokens
from .options import Options
from .rows import ThreadRow, default_over_best, thread_ratio
from .training import ours

THREADS = (1, 2)
DEFAULT = "default"  # the cell of the apps' own choice
BUSY_LOOP = "while True: pass"


@contextlib.contextmanager
def busy_core():
    """A Python busy loop on one core of this process's affinity (the last), killed on exit."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    pin = (lambda: os.sched_setaffinity(0, {cores[-1]})) if cores else None
    proc = subprocess.Popen([sys.executable, "-c", BUSY_LOOP], preexec_fn=pin)
    try:
        time.sleep(0.2)  # running before the timing starts
        yield
    finally:
        proc.kill()
        proc.wait()


def timed_steps(step, threads: int | str, seconds: float, device) -> tuple[int, float, float, int]:
    """(steps, wall seconds, other processes' share of the cores meanwhile, threads) of training steps with
    `threads` torch threads (DEFAULT: as the apps choose them now) for about `seconds`, after one untimed step at
    that thread count. The busy loop is this process's child and counts as "other" while it runs (common.CpuMeter
    counts children once they end)."""
    torch.set_num_threads(default_threads()[0] if threads == DEFAULT else threads)
    threads = torch.get_num_threads()
    step()
    sync(device)
    n, meter, t0 = 0, CpuMeter.start(), time.perf_counter()
    while n == 0 or time.perf_counter() - t0 < seconds:
        step()
        n += 1
    sync(device)
    return n, time.perf_counter() - t0, meter.others_share(), threads


def section_threads(opts: Options, log) -> list[ThreadRow]:
    if opts.cuda:
        log("threads (5): CPU only; skipped on CUDA")
        return []
    L = opts.lengths[0]
    batch = max(1, opts.tokens_per_step // L)
    data = torch.from_numpy(zipf_tokens((batch, L + 1), seed=L)).to(opts.device)
    cand, _, _ = ours(opts, "alibi", data[:, :-1], data[:, 1:])
    before = torch.get_num_threads()
    counts = (*THREADS, DEFAULT)
    cells = [(t, False) for t in counts] + [(t, True) for t in reversed(counts)]
    runs: dict[tuple[int | str, bool], list[tuple[int, float, float, int]]] = {c: [] for c in cells}
    log(f"threads (5): alibi at L={L}, batch {batch} x {L}; threads {THREADS} and the default, without and with a "
        f"busy loop, {opts.thread_seconds:g} s per cell, {opts.thread_reps} passes")
    try:
        for rep in range(opts.thread_reps):
            for threads, busy in cells if rep % 2 == 0 else cells[::-1]:
                with busy_core() if busy else contextlib.nullcontext():
                    runs[(threads, busy)].append(timed_steps(cand.step, threads, opts.thread_seconds, opts.device))
    finally:
        torch.set_num_threads(before)
    rows = [ThreadRow(round(statistics.median(t for *_, t in got)), busy, L, batch,
                      statistics.median(n * batch * L / s for n, s, _, _ in got), sum(n for n, *_ in got),
                      round(sum(s for _, s, _, _ in got), 2), len(got), round(statistics.median(o for _, _, o, _ in got), 3),
                      default=threads == DEFAULT)
            for (threads, busy), got in sorted(runs.items(), key=lambda kv: (kv[0][1], str(kv[0][0])))]
    for r in rows:
        log(f"  {r.name}: {r.tokens_per_s:,.0f} tokens/s (other processes {r.others_share:.0%} of the cores)")
    ratios = [(f"{t} thread(s), with / without the busy loop", thread_ratio(rows, (t, True), (t, False))) for t in THREADS]
    ratios += [(f"2 threads / 1{', beside the busy loop' if busy else ''}", thread_ratio(rows, (2, busy), (1, busy)))
               for busy in (False, True)]
    ratios += [(f"default / the best of 1 and 2{', beside the busy loop' if busy else ''}", default_over_best(rows, busy))
               for busy in (False, True)]
    log("  ratios: " + ", ".join(f"{label} {value:.2f}" for label, value in ratios if value is not None))
    return rows
