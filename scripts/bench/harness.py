"""Timing: paired rounds, and the interval of a throughput ratio.

A round times every active model once, in an order that alternates direction from round to round,
so that models compared with each other ran seconds apart under the same background load. A ratio
A/B of throughputs (tokens/s) is estimated from its per-round ratios r_i = t_B,i / t_A,i over the
rounds that timed both:

    estimate = exp(mean(log r_i)),  95% interval = exp(mean(log r_i) +/- t_{0.975, n-1} sd(log r_i) / sqrt(n))

the geometric mean of the paired ratios and a Student-t interval of its log, exponentiated (a ratio
is symmetric on the log scale: A/B and B/A get mirrored intervals). After `min_rounds`, a model
keeps being timed only while a ratio it is part of has an interval wider than +/-tolerance
(exp(half-width) - 1 > tolerance); the rounds stop when none is, or at `max_rounds` or the time
budget, whichever comes first. Stopping on the interval itself makes its coverage slightly less than
the nominal 95%; the minimum of rounds keeps the standard deviation from being judged on too few.

Every round also measures how much of the cores other processes used meanwhile (common.CpuMeter). A
round where they used more than `quiet` (default 5%) is disturbed: with every core's thread in use,
a step then slows down far more than the CPU it loses, and not alike for every model. Ratios and
medians leave disturbed rounds out (and the rounds go on) as long as at least two quiet rounds
remain; otherwise they use every round and say so (Ratio.disturbed).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from .common import CpuMeter, describe_failure, sync


def t_quantile(p: float, df: int) -> float:
    """Quantile of Student's t with df degrees of freedom (p in (0.5, 1)). df 1 and 2 in closed form;
    from df 3 the Cornish-Fisher expansion in 1/df around the normal quantile (Abramowitz & Stegun
    26.7.5): within 0.004 of the exact value at df 3, 0.001 from df 4 on."""
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = statistics.NormalDist().inv_cdf(p)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


@dataclass(frozen=True)
class Ratio:
    """A throughput ratio from paired rounds: estimate and 95% interval, the per-round range."""

    estimate: float
    low: float
    high: float
    rounds: int
    round_min: float
    round_max: float
    dropped: int = 0  # disturbed rounds left out
    disturbed: bool = False  # fewer than two quiet rounds: computed from disturbed ones

    @property
    def half_width(self) -> float:
        """Relative half-width of the interval (its upper side, the wider one): 0.05 means +/-5%."""
        return self.high / self.estimate - 1

    def within(self, tolerance: float) -> bool:
        return self.rounds >= 2 and self.half_width <= tolerance

    def text(self, spec: str = ".3f", tolerance: float | None = None) -> str:
        """'0.973 [0.951–0.996]', with a † when the interval is wider than +/-tolerance and a ‡ when
        it comes from disturbed rounds."""
        mark = ("†" if tolerance is not None and not self.within(tolerance) else "") + ("‡" if self.disturbed else "")
        if self.rounds < 2:
            return f"{self.estimate:{spec}} [one round]{mark}"
        return f"{self.estimate:{spec}} [{self.low:{spec}}–{self.high:{spec}}]{mark}"


def ratio_interval(per_round: Sequence[float], level: float = 0.95) -> Ratio:
    """Geometric mean of paired per-round ratios with a t-interval of the mean log (module docstring)."""
    if not per_round:
        raise ValueError("no paired rounds")
    logs = [math.log(r) for r in per_round]
    n, mean = len(logs), statistics.fmean(logs)
    half = t_quantile(0.5 + level / 2, n - 1) * statistics.stdev(logs) / math.sqrt(n) if n > 1 else math.inf
    return Ratio(math.exp(mean), math.exp(mean - half), math.exp(mean + half), n, min(per_round), max(per_round))


@dataclass
class Timings:
    """Seconds per call of each model, by round; models that raised, with why; other processes'
    share of the cores in each round."""

    seconds: dict[str, dict[int, float]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    rounds: int = 0
    others: dict[int, float] = field(default_factory=dict)
    quiet: float | None = None  # a round where others' share is above this is disturbed

    def disturbed_rounds(self) -> set[int]:
        if self.quiet is None:
            return set()
        return {r for r, share in self.others.items() if share > self.quiet}

    def _usable(self, rounds) -> tuple[list[int], bool]:
        """The quiet rounds among `rounds` if at least two, else all of them (and True)."""
        rounds = sorted(rounds)
        quiet = [r for r in rounds if r not in self.disturbed_rounds()]
        return (quiet, False) if len(quiet) >= 2 else (rounds, len(quiet) < len(rounds))

    def samples(self, name: str) -> list[float]:
        use, _ = self._usable(self.seconds[name])
        return [self.seconds[name][r] for r in use]

    def median(self, name: str) -> float:
        return statistics.median(self.samples(name))

    def spread(self, name: str) -> float:
        values = self.samples(name)
        return max(values) / min(values)

    def ratio(self, num: str, den: str) -> Ratio | None:
        """Throughput of num over den (= den's seconds over num's), paired by round."""
        a, b = self.seconds.get(num), self.seconds.get(den)
        if not a or not b or not (a.keys() & b.keys()):
            return None
        shared = a.keys() & b.keys()
        use, disturbed = self._usable(shared)
        r = ratio_interval([b[i] / a[i] for i in use])
        return replace(r, dropped=len(shared) - len(use), disturbed=disturbed)


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
