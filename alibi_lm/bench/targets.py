"""The benchmark's targets (training ratios to nope and to x-transformers, evaluation memory at 16L over 8L, MFU,
the wall time of make bench) and their verdicts. A ratio's verdict reads its 95% interval: met when the
whole interval is at or above the target, NOT met when it is all below, undecided when it straddles
the target (the estimate's side is said)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from alibi_lm.positions import POSITION_SCHEMES, PositionScheme

from .common import BASELINE, VOCAB
from .options import Options
from .rows import MemoryRow, Results, TargetRow, default_over_best, memory_growth
from .startup import startup_ratio
from .stats import Ratio

# What each scheme adds to a training step, for the reason column when a ratio misses its target.
# A scheme not listed here is described from the hooks it overrides (scheme_cost).
COST_NOTES = {
    "t5": "a learned bias: its (H, L, L) gradient is summed over the batch in every layer",
    "rope": "rotating queries and keys: 4 elementwise kernels forward and backward per layer",
    "learned": "an embedding lookup and its gradient",
    "sinusoidal": "a (L, D) table computed per forward",
    "alibi": "a cached (1, H, L, L) bias added to the scores",
    "cope": "explicit attention per query block: sigmoid gates of q k, their reverse cumulative sums, and q @ e "
            "interpolated at those positions, in every layer (no fused kernel)",
    "fox": "explicit attention per query block with a (B, H, tq, tk) bias from cumulative log forget gates of each "
           "layer's input (no fused kernel)",
    # the variants of alibi_lm/plans/variants.py
    "fox+rope": "fox's explicit attention, plus rotating queries and keys",
    "irope": "rope in every layer but the last, which has no positions",
    "irope-window": "rope in every layer but the last, with a sliding window: an explicit (L, L) mask instead of "
                    "SDPA's causal kernel, and the scores of keys outside the window still computed",
    "alibi+ssmax": "alibi's bias and the queries times s_h log n: a new (1, H, L, L) mask per layer (the cached "
                   "bias cannot be shared) and no FlexAttention",
    "nope+ssmax": "the queries times s_h log n per layer (SDPA keeps its causal kernel)",
    "rope+qk_norm": "rope plus two RMSNorms per layer on queries and keys",
    "alibi+learn_slopes": "alibi's bias rebuilt every forward from the learned slopes, with its gradient",
}


@dataclass(frozen=True)
class Targets:
    ratio_default: float = 0.90  # every scheme's training tokens/s over nope's, new schemes included
    ratio_by_scheme: dict[str, float] = field(default_factory=lambda: {"alibi": 0.97})
    vs_xtransformers: float = 1.3  # alibi-lm over x-transformers, training tokens/s
    mem_16_over_8: float = 2.2  # the evaluation's memory at 16L over 8L
    mfu_alibi: float = 0.40  # a GPU target
    wall_s: float = 900  # make bench on 2 CPU cores
    default_threads_busy: float = 0.8  # default-thread training tokens/s beside a busy process over the best fixed count
    default_threads_idle: float = 0.95  # ... on cores left idle: no worse than the 2 threads of the earlier default
    startup: float = 1.5  # --help and a config error over `import torch`

    def ratio_goal(self, scheme: str) -> float:
        return self.ratio_by_scheme.get(scheme, self.ratio_default)


TARGETS = Targets()


def verdict(ratio: Ratio, goal: float) -> str:
    if ratio.rounds >= 2 and ratio.low >= goal:
        return "met"
    if ratio.rounds >= 2 and ratio.high < goal:
        return "NOT met"
    side = "≥" if ratio.estimate >= goal else "<"
    return f"undecided (interval straddles {goal:g}; estimate {side} {goal:g})"


def scheme_cost(scheme: str) -> str:
    if scheme in COST_NOTES:
        return COST_NOTES[scheme]
    cls = POSITION_SCHEMES.get(scheme)
    if cls is None:
        return "n/a"
    parts = []
    if cls.embedding is not PositionScheme.embedding:
        parts.append("a (L, D) vector added at the input")
    if cls.rotate is not PositionScheme.rotate:
        parts.append("queries and keys transformed in every layer")
    if cls.score_bias is not PositionScheme.score_bias:
        parts.append("an (H, L, L) score bias, " + ("fixed and cached across steps" if cls.static_bias else
                                                   "computed every forward (with its gradient if learned)"))
    return "; ".join(parts) or "nothing the model sees (like nope)"


def spread_note(ratio: Ratio, tolerance: float) -> str:
    note = f"{ratio.rounds} paired rounds, per-round ratios {ratio.round_min:.2f}–{ratio.round_max:.2f}"
    if ratio.dropped:
        note += f" ({ratio.dropped} disturbed rounds left out)"
    if ratio.disturbed:
        note += "; ‡ fewer than two quiet rounds: from disturbed ones, not a quiet-machine figure"
    if not ratio.within(tolerance):
        note += f"; † the interval was still wider than ±{tolerance:.0%} when the rounds stopped (cap or time budget)"
    return note


def scheme_targets(opts: Options, res: Results) -> list[TargetRow]:
    out, tol = [], opts.train_plan.tolerance
    for L in opts.lengths:
        for r in [r for r in res.train if r.L == L and r.section == "train" and r.name in opts.schemes]:
            if r.tokens_per_s is None:
                out.append(TargetRow(f"1. {r.name} trains, L={L}", r.note, "NOT met"))
            elif r.name != BASELINE and r.ratio is not None:
                goal = TARGETS.ratio_goal(r.name)
                v = verdict(r.ratio, goal)
                note = spread_note(r.ratio, tol) + ("" if v == "met" else f"; its extra cost: {scheme_cost(r.name)}")
                out.append(TargetRow(f"1. {r.name} training tokens/s ≥ {goal:.2f} × {BASELINE}, L={L}",
                                     r.ratio.text(tolerance=tol), v, note))
    return out


def softmax_share(res: Results, L: int) -> str:
    """How much of both steps the shared tied softmax takes, and the ratio without it."""
    vo, a, p = (res.train_row(n, L) for n in ("output layer only", "alibi-lm, plain softmax", "x-transformers"))
    if not (vo and a and p and vo.step_ms and a.step_ms and p.step_ms):
        return ""
    body = (p.step_ms - vo.step_ms) / max(a.step_ms - vo.step_ms, 1e-9)
    return (f"; the same tied {VOCAB}-word softmax costs {vo.step_ms:.0f} ms of alibi-lm's {a.step_ms:.0f} ms step "
            f"and of x-transformers' {p.step_ms:.0f} ms (medians): without it alibi-lm is {body:.2f}x faster")


def peer_targets(opts: Options, res: Results) -> list[TargetRow]:
    out, tol = [], opts.train_plan.tolerance
    for L in opts.lengths:
        for name in ("alibi-lm, plain softmax", "x-transformers", "naive"):
            r = res.train_row(name, L)
            if r is not None and r.tokens_per_s is None:
                out.append(TargetRow(f"2. {name} trains, L={L}", r.note,
                                     "NOT met" if name.startswith("alibi-lm") else "–", "no ratio"))
        for pr in [p for p in res.peer_ratios if p.L == L]:
            who = "alibi-lm (plain softmax)" if pr.ours.endswith("plain softmax") else "alibi-lm preset (adaptive)"
            note, measured = f"{pr.comparison}; {spread_note(pr.ratio, tol)}", pr.ratio.text(".2f", tol)
            if pr.peer == "naive":
                out.append(TargetRow(f"2. {who} vs naive (reported, no target), L={L}", measured, "–", note))
                continue
            v = verdict(pr.ratio, TARGETS.vs_xtransformers)
            if v != "met" and pr.ours.endswith("plain softmax"):
                note += softmax_share(res, L)
            out.append(TargetRow(f"2. {who} ≥ {TARGETS.vs_xtransformers}x x-transformers training tokens/s, L={L}",
                                 measured, v, note))
    return out


def memory_target(scheme: str, a: MemoryRow | None, b: MemoryRow | None, cuda: bool) -> TargetRow | None:
    if a is None or b is None:
        return None
    if b.peak_mem_mb is None:
        return TargetRow(f"3. {scheme}: evaluates at 16L", b.note, "NOT met")
    work = memory_growth(a, b)
    if work is None:
        return None
    total = b.peak_mem_mb / a.peak_mem_mb
    what = "max_memory_allocated" if cuda else "RSS"
    return TargetRow(f"3. {scheme}: peak memory at 16L ≤ {TARGETS.mem_16_over_8} × 8L, no OOM",
                     f"{work:.2f}x (memory the evaluation adds; whole-process peak {what} {total:.2f}x)",
                     "met" if work <= TARGETS.mem_16_over_8 else "NOT met", f"{b.peak_mem_mb:.0f} MiB peak at 16L")


def mfu_targets(opts: Options, res: Results) -> list[TargetRow]:
    out, peak = [], res.peak
    for L, name in [(L, n) for L in opts.lengths for n in ("alibi", "alibi (dropout 0)")]:
        r = res.train_row(name, L)
        if r is None or r.achieved_flops is None:
            continue
        mfu = r.achieved_flops / peak.flops
        scale = (f"for scale, one (tokens × d_model) @ (d_model × d_ff) matmul of this model reaches "
                 f"{peak.layer_matmul_flops / peak.flops:.0%} of the peak") if peak.layer_matmul_flops else ""
        if opts.cuda:
            met = mfu >= TARGETS.mfu_alibi
            v, note = ("met" if met else "NOT met"), ("" if met else scale)
        else:
            v, note = "– (a GPU target)", f"reported for reference; {scale}"
        what = "ALiBi" if name == "alibi" else "ALiBi, dropout 0 (FlexAttention)"
        out.append(TargetRow(f"4. MFU with {what} ≥ {TARGETS.mfu_alibi:.0%}, L={L}", f"{mfu:.1%}", v, note))
    return out


def thread_targets(res: Results) -> list[TargetRow]:
    """Section 5: the apps' default thread count against the best fixed count, beside a busy process and idle."""
    out, cores = [], len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    for busy, goal, where in ((True, TARGETS.default_threads_busy, "beside a busy process"),
                              (False, TARGETS.default_threads_idle, "on cores left idle")):
        if (ratio := default_over_best(res.threads, busy)) is None:
            continue
        others = max(r.others_share for r in res.threads if r.busy == busy)
        # our busy loop holds 1 / cores of them; much more: someone else's work too, and the cell is not what it says
        crowded = others > (1 / cores if busy else 0.0) + 0.25
        verdict = f"undecided (other processes used {others:.0%} of the cores)" if crowded else \
            "met" if ratio >= goal else "NOT met"
        out.append(TargetRow(f"5. default threads ≥ {goal:.2f} × the best of 1 and 2 threads, {where}", f"{ratio:.2f}",
                             verdict))
    return out


def startup_targets(res: Results) -> list[TargetRow]:
    """Section 7: start-up of --help and of a one-line config error over `import torch`."""
    out = []
    for name in ("train --help", "train, a config error"):
        if (ratio := startup_ratio(res.startup, name)) is not None:
            out.append(TargetRow(f"7. {name} ≤ {TARGETS.startup}x the start-up of `import torch`", f"{ratio:.2f}x",
                                 "met" if ratio <= TARGETS.startup else "NOT met"))
    return out


def all_targets(opts: Options, res: Results) -> list[TargetRow]:
    rows = scheme_targets(opts, res) + peer_targets(opts, res)
    for s in opts.mem_schemes:
        row = memory_target(s, res.memory_row(s, 8), res.memory_row(s, 16), opts.cuda)
        rows += [row] if row else []
    rows += mfu_targets(opts, res) + thread_targets(res) + startup_targets(res)
    if not opts.cuda:
        cores = len(os.sched_getaffinity(0))
        rows.append(TargetRow(f"make bench under {TARGETS.wall_s / 60:.0f} minutes on 2 CPU cores",
                              f"{res.wall_s / 60:.1f} min on {cores} cores",
                              "met" if res.wall_s <= TARGETS.wall_s else "NOT met",
                              "quick run" if opts.quick else ("default arguments" if not opts.argv else "")))
    return rows
