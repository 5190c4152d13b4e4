"""The CSV (one record per result row) and the markdown report, results/bench/<host>.{csv,md}."""

from __future__ import annotations

import math
import platform
import shlex
from pathlib import Path

import torch

from alibi_lm.provenance import hardware

from .common import BASELINE, VOCAB, host_kind
from .evaluation import EVAL_MULTIPLIERS
from .options import Options
from .peers import x_transformers_version
from .rows import Results, default_over_best, memory_growth, thread_ratio
from .startup import startup_ratio
from .targets import all_targets
from .training import COMPARISONS, OUTPUT_ONLY, PEER_PAIRS, PLAIN


def fmt(v, spec=".0f", empty="–") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return empty
    return format(v, spec)


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def command_line(opts: Options) -> str:
    cmd = " ".join(shlex.quote(a) for a in ["python", "-m", "alibi_lm.bench", *opts.argv])
    return f"`{cmd}`" + (" (`make bench`)" if not opts.argv else "")


def others_line(res: Results, quiet: float | None) -> str:
    """The header's line on other processes' share of the cores; a warning above the rounds' quiet threshold."""
    shares = ", ".join(f"{label} {share:.0%}" for label, share in res.others_cpu.items())
    if not shares:
        return "- other processes' CPU: not measured"
    worst = max(res.others_cpu.values())
    verdict = ("the machine was quiet" if worst <= (quiet or 0) else "**the machine was not quiet**: with every core's "
               "thread in use, a step slows down far more than the CPU it loses, and not alike for every model, so "
               "these timings and ratios are not comparable with a quiet run's")
    return f"- other processes' share of the cores while each section ran: {shares}; {verdict}"


def header(opts: Options, res: Results) -> list[str]:
    plan, threads = opts.train_plan, torch.get_num_threads()
    return [f"# alibi-lm benchmark: {host_kind(opts.device)}", "",
            f"- command: {command_line(opts)}",
            f"- commit: {res.commit}",
            f"- hardware: {hardware(opts.device)} ({torch.get_num_threads()} torch threads)",
            f"- torch {torch.__version__}, x-transformers {x_transformers_version()}, python {platform.python_version()}",
            f"- started {res.started}, wall time {res.wall_s:.0f} s; 1-minute load average {res.load[0]:.2f} at the "
            f"start, {res.load[1]:.2f} at the end (its own {threads} threads add about {threads})",
            others_line(res, plan.quiet),
            f"- model: `model={opts.model}` preset via Hydra (configs/model/{opts.model}.yaml), vocabulary {VOCAB}; "
            f"{'bf16 autocast' if opts.cuda else 'fp32'}",
            f"- data: synthetic token ids, Zipf p(id) ~ 1/(id+1) over the word-level WikiText-2 vocabulary size {VOCAB} "
            "(frequency-sorted ids, so the adaptive-softmax bands see realistic traffic); no text is read",
            f"- training timing: {plan.warmup} warm-up steps per model, then paired rounds (every model of an L timed "
            "once per round, interleaved, the order reversed every other round); after "
            f"{plan.min_rounds} rounds a model is timed only while a ratio it is in has a 95% interval wider than "
            f"±{plan.tolerance:.0%}, at most {plan.max_rounds} rounds or {plan.budget_s:.0f} s of rounds per L; tokens/s "
            f"from the median step. † marks an interval still wider than ±{plan.tolerance:.0%} when the rounds stopped",
            f"- disturbed rounds: every round measures other processes' share of the cores; rounds where it is above "
            f"{plan.quiet or 0:.0%} are left out of ratios and medians while at least two quiet rounds remain (‡: "
            "computed from disturbed rounds, as fewer than two were quiet)",
            "- ratios: the geometric mean of the per-round paired ratios, [95% interval]: a Student-t interval of the "
            "mean log-ratio, exponentiated (scripts/bench/harness.py); a verdict is met / NOT met only when the whole "
            "interval is on one side of the target, else undecided",
            f"- evaluation timing: median of {opts.eval_plan.min_rounds} rounds after {opts.eval_plan.warmup} warm-up",
            ""]


def targets_lines(opts: Options, res: Results) -> list[str]:
    rows = [[t.target, t.measured, t.verdict, t.note] for t in all_targets(opts, res)]
    return ["## Targets", "", *table(["target", "measured [95% interval]", "verdict", "reason for a miss / note"], rows),
            ""]


def training_lines(opts: Options, res: Results) -> list[str]:
    names = list(dict.fromkeys(r.name for r in res.train if r.section == "train"))
    rows = []
    for name in names:
        cells, backend = [], ""
        for L in opts.lengths:
            r = res.train_row(name, L)
            backend = (r.backend if r else "") or backend
            if r is None or r.tokens_per_s is None:
                cells += [r.note if r else "–", "–"]
            else:
                ratio = r.ratio.text(tolerance=opts.train_plan.tolerance) if r.ratio else "1" if r.name == BASELINE else "–"
                cells += [fmt(r.tokens_per_s), ratio]
        rows.append([name, backend, *cells])
    head = ["scheme", "attention"] + [c for L in opts.lengths for c in (f"L={L} tok/s", f"ratio to {BASELINE} [95%]")]
    return ["## 1. Training throughput (forward + backward + clip + optimizer step)", "",
            f"Batch: {opts.tokens_per_step} tokens per step at every L (B = {opts.tokens_per_step} / L). Every scheme "
            "in alibi_lm.positions.POSITION_SCHEMES. Ratio: tokens/s over nope's, paired by round [95% interval]."
            + (" Training steps through torch.compile." if opts.compile else ""), "",
            *table(head, rows), "", *attention_reasons(res), ""]


def attention_reasons(res: Results) -> list[str]:
    """Why each training row's attention is what it is (alibi_lm.attention.explain_backend): for a scheme without a
    fused path (sdpa with a materialised bias, or explicit), the reason."""
    seen = {r.name: (r.backend, r.why) for r in res.train if r.section == "train" and r.why}
    if not seen:
        return []
    return ["Attention path of each row, and why:", "",
            *table(["scheme", "attention", "why"], [[name, path, why] for name, (path, why) in seen.items()])]


def peer_lines(opts: Options, res: Results) -> list[str]:
    rows, tol = [], opts.train_plan.tolerance
    for name in ("alibi", PLAIN, "naive", "x-transformers", OUTPUT_ONLY):
        got = [res.train_row(name, L) for L in opts.lengths]
        if not any(got):
            continue
        cells = [c for r in got for c in ((fmt(r.tokens_per_s), fmt(r.step_ms, ".1f")) if r and r.tokens_per_s
                                          else ((r.note if r else "–"), "–"))]
        rows.append([name, next(r.softmax for r in got if r), *cells])
    ratio_rows = []
    for ours_name, peer in PEER_PAIRS:
        hit = {p.L: p.ratio for p in res.peer_ratios if p.ours == ours_name and p.peer == peer}
        if hit:
            ratio_rows.append([f"{ours_name} / {peer}", COMPARISONS[ours_name],
                               *(hit[L].text(".2f", tol) if L in hit else "–" for L in opts.lengths)])
    head = ["implementation", "softmax"] + [c for L in opts.lengths for c in (f"L={L} tok/s", "ms/step")]
    return ["## 2. ALiBi against peer implementations (same batch, same rounds)", "",
            "All three have the same width, depth, heads, FFN and dropout. x-transformers and the naive model have a "
            f"plain tied softmax over {VOCAB} words, so `{PLAIN}` (model.adaptive_cutoffs=null) is the like-for-like "
            "comparison; `alibi` is the preset as trained (adaptive input and softmax). x-transformers runs with its "
            f"defaults (its own attention, not attn_flash). `{OUTPUT_ONLY}` times the tied plain softmax alone "
            "(forward + backward).", "", *table(head, rows), "",
            *table(["ratio", "comparison", *(f"L={L} [95%]" for L in opts.lengths)], ratio_rows), ""]


def eval_lines(opts: Options, res: Results) -> list[str]:
    L = opts.eval_length
    n = max(EVAL_MULTIPLIERS) * L
    ev = {(r.name, r.mult): r for r in res.eval}
    rows = []
    for s in opts.schemes:
        got = [ev.get((s, m)) for m in EVAL_MULTIPLIERS]
        cells = [(fmt(r.tokens_per_s) if r.tokens_per_s is not None else r.note) if r else "–" for r in got]
        rows.append([s, next((r.backend for r in got if r and r.backend), ""), *cells])
    return [f"## 3. Evaluation at Lv = L..16L (L = {L})", "",
            f"score_stream (as alibi_lm.eval, nonoverlapping) over one stream of {n} tokens, one forward per Lv "
            f"(batch = {n} / Lv windows). A scheme with a position table (`learned`) has it raised to {n} positions "
            "for this (untrained rows: speed and memory only).", "", "Tokens/s:", "",
            *table(["scheme", "attention", *(f"{m}L={m * L}" for m in EVAL_MULTIPLIERS)], rows), ""]


def memory_lines(opts: Options, res: Results) -> list[str]:
    mults = sorted({r.mult for r in res.memory})
    rows = []
    for s in [s for s in opts.mem_schemes if s in opts.schemes]:
        cells = []
        for m in mults:
            r = res.memory_row(s, m)
            cells.append("–" if r is None else (r.note or "failed") if r.work_mem_mb is None else
                         f"{r.peak_mem_mb:.0f} ({r.work_mem_mb:.0f})")
        rows.append([s, *cells, fmt(memory_growth(res.memory_row(s, 8), res.memory_row(s, 16)), ".2f")])
    what = ("torch.cuda.max_memory_allocated during the evaluation; in brackets the part the evaluation adds over the "
            "memory allocated before it (the model)" if opts.cuda else
            "peak RSS (VmHWM) of a fresh process per cell; in brackets the part the evaluation adds over the process's "
            "RSS just before it (model, torch runtime)")
    return [f"Peak memory, MiB, scoring one window of Lv tokens (batch 1, so that any (Lv, Lv) tensor would show as 4x "
            f"per doubling): {what}. The 16L / 8L column is the ratio of the evaluation's part; linear growth gives 2, "
            "less where a constant part (the output layer's slices of logits) dominates.", "",
            *table(["scheme", *(f"{m}L" for m in mults), "16L / 8L"], rows), ""]


def mfu_lines(opts: Options, res: Results) -> list[str]:
    peak = res.peak
    rows = [[r.name, str(r.L), f"{r.n_params_flops / 1e6:.2f}", f"{r.attention_flops_per_token / 1e6:.2f}",
             f"{r.flops_per_token / 1e6:.1f}", f"{r.achieved_flops / 1e12:.4f}", f"{r.achieved_flops / peak.flops:.1%}"]
            for r in res.train if r.section != "internal" and r.achieved_flops is not None]
    out = ["## 4. Model FLOPs utilisation", "",
           f"Peak: {peak.flops / 1e12:.3f} TFLOP/s measured ({peak.how}). Training FLOPs per token = 6N + 12 · n_layer · "
           "d_model · L (PaLM, appendix B; attention not halved for causality), N = the weights a token multiplies: "
           "4d² + 2d·d_ff per layer plus the output layer (plain: d·V; adaptive: the head plus each tail weighted by "
           "the share of targets in its band). MFU = FLOPs per token × tokens/s / peak.", "",
           *table(["model", "L", "N (M)", "attention FLOPs/token (M)", "FLOPs/token (M)", "achieved TFLOP/s", "MFU"],
                  rows)]
    if peak.layer_matmul_flops:
        out += ["", f"For scale: one MLP-sized matmul of this model ({opts.tokens_per_step} × d_model) @ (d_model × "
                f"d_ff) runs at {peak.layer_matmul_flops / 1e12:.3f} TFLOP/s, {peak.layer_matmul_flops / peak.flops:.0%} "
                "of the peak."]
    return out + [""]


def thread_lines(opts: Options, res: Results) -> list[str]:
    """Section 5: tokens/s per (threads, busy core) cell, and the ratios that say what to set on a shared machine."""
    rows = res.threads
    cells = [[r.name, fmt(r.tokens_per_s), str(r.steps), f"{r.seconds:.1f}", fmt(r.others_share, ".0%")] for r in rows]
    ratios = [[label, fmt(thread_ratio(rows, a, b), ".2f")] for label, a, b in (
        ("2 threads / 1 thread", (2, False), (1, False)),
        ("2 threads / 1 thread, beside the busy loop", (2, True), (1, True)),
        ("1 thread: with / without the busy loop", (1, True), (1, False)),
        ("2 threads: with / without the busy loop", (2, True), (2, False)))]
    ratios += [[f"default / the best of 1 and 2 threads{', beside the busy loop' if busy else ''}",
                fmt(default_over_best(rows, busy), ".2f")] for busy in (False, True)]
    r0 = rows[0]
    return ["## 5. Threads on a shared machine (training, alibi)", "",
            f"Training steps of the ALiBi model at L = {r0.L} (batch {r0.batch} x {r0.L}) with torch.set_num_threads(1 "
            "or 2) or the apps' default (config.default_threads: a thread per core this process may use that other "
            "processes leave free when the stretch starts; the cell shows the median count), without and with a busy "
            "process of its own (`python -c 'while True: pass'`, pinned to one core), measured "
            f"side by side: the six cells alternate, {opts.thread_seconds:g} s each per pass, {r0.reps} passes; "
            "tokens/s is the median over the passes. A thread count above the free cores makes every parallel op "
            "wait for a descheduled thread. Other processes: their share of the cores during the cell (the busy "
            "loop alone is 1 / cores; more means someone else was using the machine too: then no cell is idle).", "",
            *table(["cell", "tokens/s", "steps", "seconds", "other processes"], cells), "",
            *table(["ratio", "value"], ratios), ""]


def markdown(opts: Options, res: Results) -> str:
    lines = header(opts, res) + targets_lines(opts, res)
    if any(r.section == "train" for r in res.train):
        lines += training_lines(opts, res)
    if res.peer_ratios or any(r.section == "peers" for r in res.train):
        lines += peer_lines(opts, res)
    if res.eval:
        lines += eval_lines(opts, res)
    if res.memory:
        lines += memory_lines(opts, res)
    if res.train:
        lines += mfu_lines(opts, res)
    if res.threads:
        lines += thread_lines(opts, res)
    if res.startup:
        lines += startup_lines(res)
    return "\n".join(lines)


def startup_lines(res: Results) -> list[str]:
    """Section 7: each command's start-up and its ratio to `import torch`."""
    cells = [[r.name, f"`{r.command}`", f"{r.seconds:.2f}", fmt(startup_ratio(res.startup, r.name), ".2f")]
             for r in res.startup]
    return ["## 7. Start-up (help text and one-line errors)", "",
            f"Each command started afresh, alternating, {res.startup[0].reps} times; seconds: the median. Help and "
            "config errors import no pandas, matplotlib, datasets, transformers or wandb.", "",
            *table(["command", "as run", "seconds", "× import torch"], cells), ""]


def write_report(opts: Options, res: Results) -> tuple[Path, Path]:
    import pandas as pd

    opts.out.mkdir(parents=True, exist_ok=True)
    host = host_kind(opts.device)
    csv_path, md_path = opts.out / f"{host}.csv", opts.out / f"{host}.md"
    pd.DataFrame(res.records()).to_csv(csv_path, index=False, float_format="%.6g")
    md_path.write_text(markdown(opts, res))
    return csv_path, md_path
