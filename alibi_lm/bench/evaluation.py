"""Section 3: evaluation (score_stream, as alibi_lm.eval) at Lv = L..16L: tokens/s, and the peak
memory of scoring one window of Lv tokens. On CPU each memory cell runs in a fresh process
(`python -m alibi_lm.bench.evaluation '<spec>'`), so that no earlier allocation hides growth."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from alibi_lm.eval.scoring import score_stream
from alibi_lm.model import LMConfig, TransformerLM, flush_denormals

from .common import ROOT, attention_path, describe_failure, lm_config, zipf_tokens
from .harness import run_rounds
from .options import Options
from .rows import EvalRow, MemoryRow

EVAL_MULTIPLIERS = [1, 2, 4, 8, 16]


def eval_lm(opts: Options, scheme: str) -> LMConfig:
    """The scheme's model at L = eval_length, its table (if it has one) raised to 16L."""
    longest = max(EVAL_MULTIPLIERS) * opts.eval_length
    return lm_config(opts.model, scheme, opts.eval_length, opts.overrides, max_positions=longest)[0]


def score(model, stream, Lv: int, device):
    autocast = torch.bfloat16 if device.type == "cuda" else None
    return score_stream(model, stream, Lv, tokens_per_batch=len(stream) - 1, device=device, autocast_dtype=autocast)


def eval_models(opts: Options) -> tuple[dict[str, TransformerLM], dict[str, str]]:
    models, failed = {}, {}
    for scheme in opts.schemes:
        try:
            torch.manual_seed(0)
            models[scheme] = TransformerLM(eval_lm(opts, scheme)).to(opts.device).eval()
        except Exception as e:  # noqa: BLE001  (reported in its cell)
            failed[scheme] = describe_failure(e)
    return models, failed


def section_eval_speed(opts: Options, log) -> list[EvalRow]:
    """Every scheme at every Lv on one stream of 16L tokens, one forward per Lv (batch 16L / Lv)."""
    L, device = opts.eval_length, opts.device
    stream = zipf_tokens(max(EVAL_MULTIPLIERS) * L + 1, seed=1)
    n = len(stream) - 1
    models, unbuilt = eval_models(opts)
    rows = []
    for mult in EVAL_MULTIPLIERS:
        Lv = mult * L
        fns = {s: (lambda m=m, Lv=Lv: score(m, stream, Lv, device)) for s, m in models.items()}
        log(f"eval Lv={Lv}: {len(fns)} schemes x {opts.eval_plan.min_rounds} rounds")
        timings = run_rounds(fns, [], opts.eval_plan, device, log)
        for s in opts.schemes:
            backend = attention_path(models[s], device) if s in models else ""
            row = EvalRow(s, backend, L, mult, batch=n // Lv, tokens_per_step=n)
            if s in timings.seconds:
                row.step_ms, row.tokens_per_s, row.rounds, row.rep_spread = timings.throughput(s, n)
            else:
                row.note = unbuilt.get(s) or timings.failed.get(s, "not run")
            rows.append(row)
    return rows


def _vm(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024  # MiB
    raise RuntimeError(f"no {field} in /proc/self/status")


def child_eval_memory(spec: dict) -> dict:
    """In a fresh process: peak RSS of scoring one window of Lv tokens, and the RSS before it."""
    flush_denormals()  # as the apps run
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    model = TransformerLM(LMConfig(**spec["lm"])).eval()
    stream = zipf_tokens(spec["Lv"] + 1, seed=1)
    with torch.no_grad():
        model(torch.zeros(1, 8, dtype=torch.long), targets=torch.zeros(1, 8, dtype=torch.long))  # kernels, allocator
    gc.collect()
    base = _vm("VmRSS")
    t0 = time.perf_counter()
    score(model, stream, spec["Lv"], torch.device("cpu"))
    return dict(peak_mb=_vm("VmHWM"), base_mb=base, wall_s=time.perf_counter() - t0)


def memory_in_child(opts: Options, scheme: str, row: MemoryRow) -> None:
    """CPU: one fresh process per cell."""
    spec = dict(lm=asdict(eval_lm(opts, scheme)), Lv=row.Lv, threads=torch.get_num_threads())
    proc = subprocess.run([sys.executable, "-m", "alibi_lm.bench.evaluation", json.dumps(spec)], capture_output=True,
                          text=True, timeout=900, cwd=ROOT)
    if proc.returncode == 0:
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        row.peak_mem_mb, row.base_mem_mb = got["peak_mb"], got["base_mb"]
    else:
        killed = proc.returncode in (-9, 137) or "MemoryError" in proc.stderr
        row.note = "out of memory" if killed else f"failed: {proc.stderr.strip().splitlines()[-1:]}"


def memory_on_gpu(model, row: MemoryRow, device) -> None:
    """GPU: max_memory_allocated in this process."""
    try:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        row.base_mem_mb = torch.cuda.memory_allocated(device) / 2**20
        score(model, zipf_tokens(row.Lv + 1, seed=1), row.Lv, device)
        row.peak_mem_mb = torch.cuda.max_memory_allocated(device) / 2**20
    except torch.cuda.OutOfMemoryError:
        row.note = "out of memory"
        torch.cuda.empty_cache()


def section_eval_memory(opts: Options, log) -> list[MemoryRow]:
    """One window of Lv tokens (batch 1), so that memory can only grow with Lv: linearly if no (Lv, Lv)
    tensor exists, quadratically if one does."""
    models, unbuilt = eval_models(opts) if opts.cuda else ({}, {})
    rows = []
    for mult in opts.mem_multipliers:
        for scheme in [s for s in opts.mem_schemes if s in opts.schemes]:
            row = MemoryRow(scheme, opts.eval_length, mult)
            try:
                if opts.cuda and scheme in models:
                    memory_on_gpu(models[scheme], row, opts.device)
                elif opts.cuda:
                    row.note = unbuilt[scheme]
                else:
                    memory_in_child(opts, scheme, row)
            except Exception as e:  # noqa: BLE001  (reported in its cell)
                row.note = describe_failure(e)
            work = row.work_mem_mb
            log(f"  memory {scheme} Lv={row.Lv}: " + (f"{row.peak_mem_mb:.0f} MiB peak, {work:.0f} MiB for the "
                                                     f"evaluation" if work is not None else row.note))
            rows.append(row)
    return rows


if __name__ == "__main__":
    print(json.dumps(child_eval_memory(json.loads(sys.argv[1]))))
