"""Typed results. Every section returns a list of these; report.py turns them into the CSV (one
record per row, `section` first) and the markdown tables."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from alibi_lm.model import LMConfig

from .stats import Ratio


def _ratio_fields(ratio: Ratio | None, prefix: str = "ratio") -> dict:
    if ratio is None:
        return {}
    return {prefix: ratio.estimate, f"{prefix}_low": ratio.low, f"{prefix}_high": ratio.high,
            f"{prefix}_rounds": ratio.rounds, f"{prefix}_min": ratio.round_min, f"{prefix}_max": ratio.round_max,
            f"{prefix}_dropped": ratio.dropped, f"{prefix}_disturbed": ratio.disturbed}


def _plain_fields(row, skip=()) -> dict:
    return {f.name: getattr(row, f.name) for f in fields(row) if f.name not in skip}


@dataclass
class TrainRow:
    """One model's training throughput at one L (sections 1, 2 and 4)."""

    section: str  # "train": a position scheme; "peers": section 2's models; "internal": a part timed alone
    name: str
    impl: str  # alibi-lm | naive | x-transformers
    softmax: str  # adaptive | plain
    backend: str  # the attention path (sdpa, flex, ...)
    L: int
    batch: int
    lm: LMConfig | None = field(default=None, repr=False)
    step_ms: float | None = None
    tokens_per_s: float | None = None
    rounds: int = 0
    rep_spread: float | None = None  # slowest / fastest step
    ratio: Ratio | None = None  # tokens/s over the baseline's (nope), paired by round
    ratio_to: str = ""
    n_params_flops: float | None = None  # N of the FLOP model
    attention_flops_per_token: float | None = None
    flops_per_token: float | None = None
    note: str = ""  # why there is no measurement
    why: str = ""  # why the attention is `backend` (explain_backend): the reason a scheme has no fused path

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.L

    @property
    def achieved_flops(self) -> float | None:
        if self.flops_per_token is None or self.tokens_per_s is None:
            return None
        return self.flops_per_token * self.tokens_per_s

    def record(self, peak_flops: float) -> dict:
        out = _plain_fields(self, skip=("lm", "ratio"))
        out["tokens_per_step"] = self.tokens_per_step
        out.update(_ratio_fields(self.ratio))
        if self.achieved_flops is not None:
            out["achieved_tflops"] = self.achieved_flops / 1e12
            out["mfu"] = self.achieved_flops / peak_flops
        return out


@dataclass
class PeerRatioRow:
    """alibi-lm's training throughput over a peer's at one L (section 2)."""

    L: int
    ours: str  # "alibi-lm, plain softmax" (like for like) or "alibi" (the preset)
    peer: str  # naive | x-transformers
    comparison: str
    ratio: Ratio
    section: str = "peer_ratio"

    @property
    def name(self) -> str:
        return f"{self.ours} / {self.peer}"

    def record(self, peak_flops: float) -> dict:
        return {"section": self.section, "name": self.name, "L": self.L, "ratio_to": self.peer,
                "comparison": self.comparison, **_ratio_fields(self.ratio)}


@dataclass
class EvalRow:
    """score_stream's throughput for one scheme at one evaluation length (section 3)."""

    name: str
    backend: str
    L: int
    mult: int
    batch: int = 0
    tokens_per_step: int = 0
    step_ms: float | None = None
    tokens_per_s: float | None = None
    rounds: int = 0
    rep_spread: float | None = None
    note: str = ""
    section: str = "eval"

    @property
    def Lv(self) -> int:
        return self.mult * self.L

    def record(self, peak_flops: float) -> dict:
        return {"section": self.section, **_plain_fields(self, skip=("section",)), "Lv": self.Lv}


@dataclass
class MemoryRow:
    """Peak memory of scoring one window of Lv tokens (section 3)."""

    name: str
    L: int
    mult: int
    peak_mem_mb: float | None = None
    base_mem_mb: float | None = None  # before the evaluation: model, runtime
    note: str = ""
    section: str = "eval_memory"

    @property
    def Lv(self) -> int:
        return self.mult * self.L

    @property
    def work_mem_mb(self) -> float | None:
        """What the evaluation itself adds."""
        if self.peak_mem_mb is None or self.base_mem_mb is None:
            return None
        return self.peak_mem_mb - self.base_mem_mb

    def record(self, peak_flops: float) -> dict:
        return {"section": self.section, **_plain_fields(self, skip=("section",)), "Lv": self.Lv,
                "batch": 1, "tokens_per_step": self.Lv, "work_mem_mb": self.work_mem_mb}


def memory_growth(a: MemoryRow | None, b: MemoryRow | None) -> float | None:
    """What the evaluation adds at b's length over a's (16L over 8L): 2 for linear growth, 4 for (Lv, Lv) tensors."""
    if a is None or b is None or a.work_mem_mb is None or b.work_mem_mb is None:
        return None
    return b.work_mem_mb / max(a.work_mem_mb, 1e-9)


@dataclass
class ThreadRow:
    """Training tokens/s with `threads` torch threads, without or with a busy process of its own (section 5)."""

    threads: int
    busy: bool  # our busy loop held one core meanwhile (without it the machine is as others leave it)
    L: int
    batch: int
    tokens_per_s: float
    steps: int  # timed steps, over every repetition
    seconds: float  # their wall time
    reps: int  # timed stretches of about --thread-seconds each; tokens/s is their median
    others_share: float = float("nan")  # median share of the cores other processes (the busy loop included) used
    default: bool = False  # the count the apps choose (config.default_threads, at each stretch's start): the median's
    section: str = "threads"

    @property
    def name(self) -> str:
        count = f"{self.threads} thread{'s' if self.threads > 1 else ''}"
        return f"{f'default ({count})' if self.default else count}{' + busy loop' if self.busy else ''}"

    def record(self, peak_flops: float) -> dict:
        return {"section": self.section, "name": self.name, **_plain_fields(self, skip=("section",)),
                "tokens_per_step": self.batch * self.L}


def thread_ratio(rows: list[ThreadRow], a: tuple[int | str, bool], b: tuple[int | str, bool]) -> float | None:
    """tokens/s of cell a (threads, busy) over cell b's; threads "default" is the apps' own choice."""
    got = {("default" if r.default else r.threads, r.busy): r.tokens_per_s for r in rows}
    return got[a] / got[b] if a in got and b in got and got[b] else None


def default_over_best(rows: list[ThreadRow], busy: bool) -> float | None:
    """tokens/s with the default thread count over the best of the fixed counts, beside the busy loop or not."""
    best = max((r.tokens_per_s for r in rows if not r.default and r.busy == busy), default=None)
    default = next((r.tokens_per_s for r in rows if r.default and r.busy == busy), None)
    return default / best if best and default is not None else None


@dataclass
class StartupRow:
    """Median wall seconds of one command's start-up (section 7): `import torch`, --help, a one-line config error."""

    name: str
    command: str
    seconds: float  # the median over the repetitions
    reps: int
    section: str = "startup"

    def record(self, peak_flops: float) -> dict:
        return {"section": self.section, **_plain_fields(self, skip=("section",))}


@dataclass
class TargetRow:
    """One line of the targets table."""

    target: str
    measured: str
    verdict: str  # met | NOT met | undecided (...) | – (reported, no target here)
    note: str = ""


@dataclass
class Peak:
    """The machine's measured peak FLOP/s and what it came from, and one model-sized matmul for scale."""

    flops: float
    how: str
    layer_matmul_flops: float | None = None


@dataclass
class Results:
    """Everything one run measured."""

    train: list[TrainRow]
    peer_ratios: list[PeerRatioRow]
    eval: list[EvalRow]
    memory: list[MemoryRow]
    peak: Peak
    wall_s: float
    started: str
    commit: str = "unknown"  # of the code that ran, taken before any output is written
    load: tuple[float, float] = (float("nan"), float("nan"))  # 1-minute load average at the start and the end
    others_cpu: dict[str, float] = field(default_factory=dict)  # section -> share of the cores other processes used
    threads: list[ThreadRow] = field(default_factory=list)  # section 5
    startup: list[StartupRow] = field(default_factory=list)  # section 7

    def train_row(self, name: str, L: int) -> TrainRow | None:
        return next((r for r in self.train if r.name == name and r.L == L), None)

    def memory_row(self, name: str, mult: int) -> MemoryRow | None:
        return next((r for r in self.memory if r.name == name and r.mult == mult), None)

    def records(self) -> list[dict]:
        rows = [*self.train, *self.peer_ratios, *self.eval, *self.memory, *self.threads, *self.startup]
        return [r.record(self.peak.flops) for r in rows]
