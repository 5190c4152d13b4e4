"""Timing: paired rounds (the statistics of their times are in stats.py).

A round times every active model once, in an order that alternates direction from round to round,
so that models compared with each other ran seconds apart under the same background load, and
measures other processes' share of the cores meanwhile (common.CpuMeter). After `min_rounds`, a model
keeps being timed only while a ratio it is part of has an interval wider than +/-tolerance; the rounds
stop when none is, or at `max_rounds` or the time budget. Stopping on the interval itself makes its
coverage slightly less than the nominal 95%; the minimum of rounds keeps the standard deviation from
being judged on too few.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .common import CpuMeter, describe_failure, sync
from .stats import Timings


@dataclass
class RoundPlan:
    """How many rounds: at least min_rounds, then until every pair is within tolerance."""

    min_rounds: int
    max_rounds: int
    tolerance: float = 0.05
    warmup: int = 2
    budget_s: float = math.inf  # stop starting rounds after this many seconds
    quiet: float | None = 0.05  # others' share of the cores above which a round is disturbed; None: not measured


def _call(fn: Callable[[], object], device) -> tuple[float | None, str | None]:
    """(seconds, None), or (None, why) when fn raised."""
    try:
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        return time.perf_counter() - t0, None
    except Exception as e:  # noqa: BLE001  (recorded in the table instead of ending the run)
        if device.type == "cuda":
            import torch

            torch.cuda.empty_cache()
        return None, describe_failure(e)


def open_pairs(timings: Timings, pairs: Sequence[tuple[str, str]], tolerance: float) -> list[tuple[str, str]]:
    """The pairs of live models whose ratio is not yet within tolerance."""
    live = [(a, b) for a, b in pairs if a in timings.seconds and b in timings.seconds]
    return [(a, b) for a, b in live if not ((r := timings.ratio(a, b)) and r.within(tolerance))]


def warm_up(fns: dict[str, Callable[[], object]], warmup: int, device, timings: Timings, log) -> None:
    for name, fn in fns.items():
        for _ in range(warmup):
            _, why = _call(fn, device)
            if why:
                timings.failed[name] = why
                log(f"  {name}: {why}")
                break
        else:
            timings.seconds[name] = {}


def run_rounds(fns: dict[str, Callable[[], object]], pairs: Sequence[tuple[str, str]], plan: RoundPlan, device,
               log: Callable[[str], None] = lambda _: None, meter: Callable[[], CpuMeter] = CpuMeter.start) -> Timings:
    """Warm every model up, then paired rounds (module docstring). A model that raises is dropped."""
    timings = Timings(quiet=plan.quiet)
    warm_up(fns, plan.warmup, device, timings, log)
    t0 = time.perf_counter()
    for r in range(plan.max_rounds):
        active = list(timings.seconds)
        if r >= plan.min_rounds:
            still = open_pairs(timings, pairs, plan.tolerance)
            if not still or time.perf_counter() - t0 > plan.budget_s:
                break
            active = [n for n in active if any(n in pair for pair in still)]
        cpu = meter() if plan.quiet is not None else None
        for name in active if r % 2 == 0 else active[::-1]:
            seconds, why = _call(fns[name], device)
            if why:
                timings.failed[name] = why
                timings.seconds.pop(name)
                log(f"  {name}: {why}")
            else:
                timings.seconds[name][r] = seconds
        if cpu is not None:
            timings.others[r] = cpu.others_share()
        timings.rounds = r + 1
    return timings
