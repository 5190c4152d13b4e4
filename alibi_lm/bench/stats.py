"""The statistics of the benchmark: medians of per-round times, and the interval of a throughput ratio.

A ratio A/B of throughputs (tokens/s) is estimated from its per-round ratios r_i = t_B,i / t_A,i over the
rounds that timed both (harness.py's paired rounds):

    estimate = exp(mean(log r_i)),  95% interval = exp(mean(log r_i) +/- t_{0.975, n-1} sd(log r_i) / sqrt(n))

the geometric mean of the paired ratios and a Student-t interval of its log, exponentiated (a ratio
is symmetric on the log scale: A/B and B/A get mirrored intervals).

A round where other processes used more than `quiet` of the cores (common.CpuMeter) is disturbed. Ratios
and medians leave disturbed rounds out as long as at least two quiet rounds remain; otherwise they use
every round and say so (Ratio.disturbed). A verdict against a target (targets.verdict) reads the interval.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace


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

    def throughput(self, name: str, tokens: int) -> tuple[float, float, int, float]:
        """(ms per call, tokens/s, rounds used, slowest / fastest) of a model that processes `tokens` per call,
        from its median time."""
        med = self.median(name)
        return 1e3 * med, tokens / med, len(self.samples(name)), self.spread(name)

    def ratio(self, num: str, den: str) -> Ratio | None:
        """Throughput of num over den (= den's seconds over num's), paired by round."""
        a, b = self.seconds.get(num), self.seconds.get(den)
        if not a or not b or not (a.keys() & b.keys()):
            return None
        shared = a.keys() & b.keys()
        use, disturbed = self._usable(shared)
        r = ratio_interval([b[i] / a[i] for i in use])
        return replace(r, dropped=len(shared) - len(use), disturbed=disturbed)
