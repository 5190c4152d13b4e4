"""The command line and the run: sections in order, then the report."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from hydra.errors import HydraException, OverrideParseException
from omegaconf.errors import OmegaConfBaseException

from alibi_lm.cli import describe, number, number_list
from alibi_lm.config import resolve_device
from alibi_lm.errors import ArgumentParser, UserError
from alibi_lm.model import flush_denormals
from alibi_lm.provenance import git_commit

from . import __doc__ as PACKAGE_DOC
from .common import ROOT, VOCAB, CpuMeter, benchmarked_schemes, host_kind, lm_config
from .evaluation import section_eval_memory, section_eval_speed
from .extension import section_extension
from .flops import measure_peak
from .harness import RoundPlan
from .options import Options
from .report import write_report
from .rows import Results
from .startup import section_startup
from .threads import section_threads
from .training import section_training

SECTIONS = ("train", "eval", "memory", "threads", "extension", "startup")
# type= of the numeric options: a bad value is argparse's one line before any section runs, and 0 is refused rather
# than read as "not given" by the `or` defaults of resolve()
COUNT, COUNTS, POSITIVE = number(int, 1), number_list(int, 1), number(float, 0, low_open=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = ArgumentParser(prog="python -m alibi_lm.bench", description=PACKAGE_DOC,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add("--quick", action="store_true", help="tiny lengths and few rounds: a smoke run")
    add("--model", choices=["tiny", "small", "paper"], default=None, help="model preset (default: tiny on CPU, small "
        "on CUDA; paper: the 247M model of configs/model/paper.yaml)")
    add("--compile", action="store_true", help="train through torch.compile(model), as train.compile=true does")
    add("--lengths", type=COUNTS, default=None, help="training lengths L, comma-separated (default: 128,512 for "
        "tiny, 512,1024 for small)")
    add("--eval-length", type=COUNT, default=None, help="the L of the evaluation sweep Lv = L..16L (default: the "
        "largest --lengths)")
    add("--device", default="auto", help="auto | cpu | cuda")
    add("--min-rounds", type=COUNT, default=None, help="paired training rounds at least (default 6; quick 2)")
    add("--max-rounds", type=COUNT, default=None, help="paired training rounds at most (default 30; quick 3)")
    add("--tolerance", type=POSITIVE, default=0.05, help="stop when every ratio's 95%% interval is within "
        "+/- this (default 0.05)")
    add("--round-budget", type=POSITIVE, default=240, help="seconds of training rounds per L after which no new "
        "round starts (default 240)")
    add("--quiet-share", type=float, default=0.05, help="a round in which other processes use more than this share "
        "of the cores is disturbed and left out (default 0.05; -1: keep every round)")
    add("--eval-reps", type=COUNT, default=None, help="timed repetitions per evaluation (default 3; quick 1)")
    add("--warmup", type=number(int, 0), default=None, help="untimed steps first (default 2; quick 1)")
    add("--tokens-per-step", type=COUNT, default=None, help="training tokens per step at every L (default: 2048 = "
        "the preset's 16 x 128 on CPU, 65536 on CUDA)")
    add("--schemes", default=None, help="comma-separated (default: every registered scheme and the variants of "
        "alibi_lm/plans/variants.py)")
    add("--mem-schemes", default=None, help="schemes whose eval memory is measured (default: all; quick: alibi,t5)")
    add("--mem-multipliers", type=COUNTS, default=None, help="Lv/L of the memory measurements (default: all; "
        "quick: 16)")
    add("--threads", type=COUNT, default=None, help="torch CPU threads (default: torch's, all cores)")
    add("--no-peers", action="store_true", help="skip section 2 (naive, x-transformers)")
    add("--no-dropout-rows", action="store_true",
        help="on CUDA, skip the '(dropout 0)' rows (FlexAttention without attention dropout) beside each scheme")
    add("--sections", default=",".join(SECTIONS), help="which to run: train (1, 2, 4), eval (3: tokens/s), memory "
        "(3: peak memory), threads (5: 1 and 2 threads and the default, idle and beside a busy core; CPU only), extension "
        "(6), startup (7: --help and a config error against import torch)")
    add("--thread-seconds", type=POSITIVE, default=None, help="section 5: seconds per cell and pass (default 3; quick 0.5)")
    add("--override", action="append", default=[], metavar="KEY=VALUE", help="a Hydra override for every alibi-lm "
        "model, e.g. model.n_layer=2 (repeatable)")
    add("--out", default=str(ROOT / "results" / "bench"), help="output folder")
    return p.parse_args(argv)


def _csv(text: str, cast=str) -> list:
    return [cast(x) for x in text.split(",") if x]


def refuse(message: str):
    """Bad input: one line on stderr and exit status 2, as the apps do."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def check_out(out: Path) -> None:
    """--out is a folder, made when the report is written: a file there (or above it) would fail only then, after
    every section has run."""
    existing = next(p for p in (out, *out.parents) if p.exists())
    if not existing.is_dir():
        refuse(f"--out {out}: {existing} is a file, not a folder; give a folder (made if missing)")


def check_overrides(model: str, seq_len: int, overrides: list[str]) -> None:
    """Compose one model with the --override's before any section runs: a bad key or value is one line now, not a
    traceback after the first sections' minutes."""
    if not overrides:
        return
    try:
        lm_config(model, "alibi", seq_len, overrides)
    except (HydraException, OmegaConfBaseException, UserError) as e:
        form = "; give KEY=VALUE, e.g. --override model.n_layer=2" if isinstance(e, OverrideParseException) else ""
        refuse(f"--override {' '.join(overrides)}: {describe(e)}{form}")


def resolve(args: argparse.Namespace, argv: list[str]) -> Options:
    try:
        device = resolve_device(args.device, "--device")
    except UserError as e:
        refuse(str(e))
    cuda, quick = device.type == "cuda", args.quick
    model = args.model or ("small" if cuda else "tiny")
    lengths = _csv(args.lengths or ("32,64" if quick else ("128,512" if model == "tiny" else "512,1024")), int)
    if not lengths:  # "--lengths ," leaves none: every section needs one
        refuse("--lengths needs at least one length, e.g. --lengths 128,512")
    known = benchmarked_schemes()
    schemes = _csv(args.schemes) if args.schemes else known
    unknown = [s for s in schemes if s not in known]
    if unknown:
        refuse(f"unknown scheme(s) {', '.join(unknown)}; registered schemes and variants: {', '.join(known)}")
    if unknown := [s for s in _csv(args.sections) if s not in SECTIONS]:
        refuse(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)} "
               f"(--sections {','.join(SECTIONS)})")
    check_overrides(model, lengths[0], args.override)
    check_out(Path(args.out))
    warmup = args.warmup if args.warmup is not None else (1 if quick else 2)
    train_plan = RoundPlan(min_rounds=args.min_rounds or (2 if quick else 6), max_rounds=args.max_rounds or
                           (3 if quick else 30), tolerance=args.tolerance, warmup=warmup, budget_s=args.round_budget,
                           quiet=args.quiet_share if args.quiet_share >= 0 else None)
    train_plan.max_rounds = max(train_plan.max_rounds, train_plan.min_rounds)
    eval_reps = args.eval_reps or (1 if quick else 3)
    if args.threads:
        torch.set_num_threads(args.threads)
    flush_denormals()  # as the apps run (alibi_lm.cli)
    return Options(
        device=device, model=model, lengths=lengths, eval_length=args.eval_length or max(lengths),
        tokens_per_step=args.tokens_per_step or (256 if quick else (65536 if cuda else 2048)), schemes=schemes,
        mem_schemes=_csv(args.mem_schemes or ("alibi,t5" if quick else ",".join(schemes))),
        mem_multipliers=_csv(args.mem_multipliers or ("16" if quick else "1,2,4,8,16"), int),
        train_plan=train_plan, eval_plan=RoundPlan(eval_reps, eval_reps, warmup=1, quiet=train_plan.quiet),
        peers=not args.no_peers,
        sections=set(_csv(args.sections)), out=Path(args.out), quick=quick, argv=argv,
        overrides=tuple(args.override), thread_seconds=args.thread_seconds or (0.5 if quick else 3.0),
        thread_reps=1 if quick else 2, compile=args.compile, dropout_rows=not args.no_dropout_rows)


def run(opts: Options, log) -> Results:
    started, load = time.strftime("%Y-%m-%d %H:%M:%S %Z"), os.getloadavg()[0]
    commit = git_commit(mark_dirty=True)
    t_start = time.perf_counter()
    log(f"{host_kind(opts.device)}: model={opts.model}, L={opts.lengths}, eval L={opts.eval_length}, "
        f"{torch.get_num_threads()} threads, schemes {', '.join(opts.schemes)}; synthetic Zipf tokens, vocabulary "
        f"{VOCAB} (WikiText-2 word level)")
    layer, _ = lm_config(opts.model, "alibi", opts.lengths[0], opts.overrides)
    peak = measure_peak(opts.device, opts.quick, layer, opts.tokens_per_step)
    log(f"peak: {peak.flops / 1e12:.3f} TFLOP/s ({peak.how})")
    others: dict[str, float] = {}

    def measured(label: str, section, empty):
        if label.split()[0] not in opts.sections:
            return empty
        meter = CpuMeter.start()
        out = section(opts, log)
        others[label] = meter.others_share()
        log(f"{label}: other processes used {others[label]:.0%} of the cores meanwhile")
        return out

    train, peer_ratios = measured("train (1, 2, 4)", section_training, ([], []))
    evals = measured("eval (3, tokens/s)", section_eval_speed, [])
    memory = measured("memory (3)", section_eval_memory, [])
    threads = measured("threads (5)", section_threads, [])
    measured("extension (6)", section_extension, None)  # its own <host>-extension.md (bench/extension.py)
    startup = measured("startup (7)", section_startup, [])
    wall = time.perf_counter() - t_start
    return Results(train, peer_ratios, evals, memory, peak, wall, started, commit, (load, os.getloadavg()[0]), others,
                   threads, startup)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    opts = resolve(parse_args(argv), argv)
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", flush=True)

    results = run(opts, log)
    csv_path, md_path = write_report(opts, results)
    log(f"wrote {csv_path} and {md_path}")
    print()
    print(md_path.read_text())
