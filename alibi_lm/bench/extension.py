"""Section 6: the cost of each training-free extension (alibi_lm.extension) against no method, at Lv = 8L and 16L
(--quick: 16L):
evaluation tokens/s as ratios from paired rounds (every round times each method once, interleaved with no method),
and the peak memory of scoring one window of Lv tokens (CPU: a fresh process per cell, as section 3). ALiBi stands
for the bias schemes (the remapped bias built per query block) and RoPE for the rotary ones (one pass per piece on
the explicit path). Writes <out>/<host>-extension.md and .csv beside the main report."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from dataclasses import asdict

import pandas as pd
import torch

from alibi_lm.extension import REMAP_METHODS, build_extension
from alibi_lm.model import LMConfig, TransformerLM, flush_denormals
from alibi_lm.results.markdown import markdown_table

from .common import ROOT, describe_failure, host_kind, lm_config, zipf_tokens
from .evaluation import _vm, score
from .harness import run_rounds
from .options import Options

SCHEMES = ("alibi", "rope")
MULTIPLIERS = (8, 16)
QUICK_METHODS = ("streaming", "self_extend")  # --quick: a smoke run of both kinds of method, at 16L only


def extended_model(lm: LMConfig, method: str | None, train_len: int) -> TransformerLM:
    torch.manual_seed(0)
    model = TransformerLM(lm).eval()
    if method is not None:
        model.set_extension(build_extension(method, {}, train_len))
    return model


def child_memory(spec: dict) -> dict:
    """In a fresh process: the peak RSS of scoring one window of Lv tokens with the method, and the RSS before."""
    flush_denormals()
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    model = extended_model(LMConfig(**spec["lm"]), spec["method"], spec["L"])
    stream = zipf_tokens(spec["Lv"] + 1, seed=1)
    with torch.no_grad():
        model(torch.zeros(1, 8, dtype=torch.long), targets=torch.zeros(1, 8, dtype=torch.long))
    gc.collect()
    base = _vm("VmRSS")
    score(model, stream, spec["Lv"], torch.device("cpu"))
    return dict(peak_mb=_vm("VmHWM"), base_mb=base)


def memory_mb(opts: Options, lm: LMConfig, method: str | None, Lv: int) -> float | None:
    """MiB the evaluation of one window adds (peak minus the RSS before it); None where it failed."""
    if opts.cuda:
        model = extended_model(lm, method, opts.eval_length).to(opts.device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(opts.device)
        base = torch.cuda.memory_allocated(opts.device)
        score(model, zipf_tokens(Lv + 1, seed=1), Lv, opts.device)
        return (torch.cuda.max_memory_allocated(opts.device) - base) / 2**20
    spec = dict(lm=asdict(lm), method=method, L=opts.eval_length, Lv=Lv, threads=torch.get_num_threads())
    proc = subprocess.run([sys.executable, "-m", "alibi_lm.bench.extension", json.dumps(spec)], capture_output=True,
                          text=True, timeout=900, cwd=ROOT)
    if proc.returncode:
        return None
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    return got["peak_mb"] - got["base_mb"]


def cell(value) -> str:
    return "" if value is None or (isinstance(value, float) and value != value) else (
        f"{value:.3g}" if isinstance(value, float) else str(value))


def section_extension(opts: Options, log) -> pd.DataFrame:
    L, rows = opts.eval_length, []
    for scheme in SCHEMES:
        lm = lm_config(opts.model, scheme, L, opts.overrides)[0]
        methods = [None, *(QUICK_METHODS if opts.quick else REMAP_METHODS)]
        for mult in MULTIPLIERS[-1:] if opts.quick else MULTIPLIERS:
            Lv = mult * L
            stream = zipf_tokens(Lv * (2 if opts.quick else 4) + 1, seed=1)
            models = {m or "none": extended_model(lm, m, L).to(opts.device) for m in methods}
            fns = {name: (lambda model=model, stream=stream, Lv=Lv: score(model, stream, Lv, opts.device))
                   for name, model in models.items()}
            log(f"extension {scheme} Lv={Lv}: {len(fns)} methods x {opts.eval_plan.min_rounds} rounds")
            timings = run_rounds(fns, [(name, "none") for name in fns if name != "none"], opts.eval_plan, opts.device, log)
            none_mb = memory_mb(opts, lm, None, Lv)
            for name in fns:
                row = dict(scheme=scheme, method=name, L=L, Lv=Lv)
                if name in timings.seconds:
                    row["tokens_per_s"] = timings.throughput(name, len(stream) - 1)[1]
                else:
                    row["note"] = timings.failed.get(name, "not run")
                ratio = timings.ratio(name, "none") if name != "none" else None
                if ratio is not None:  # throughput against no method, paired by round, with its 95% interval
                    row.update(speed_ratio=ratio.estimate, speed_low=ratio.low, speed_high=ratio.high)
                try:
                    mb = none_mb if name == "none" else memory_mb(opts, lm, name, Lv)
                except Exception as e:  # noqa: BLE001  (reported in its cell)
                    mb, row["note"] = None, describe_failure(e)
                row.update(memory_mb=mb, memory_ratio=None if mb is None or not none_mb else mb / none_mb)
                rows.append(row)
    df = pd.DataFrame(rows)
    stem = opts.out / f"{host_kind(opts.device)}-extension"
    opts.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(stem.with_suffix(".csv"), index=False)
    stem.with_suffix(".md").write_text(
        f"# Extension cost against no method ({host_kind(opts.device)}, model={opts.model}, L={L})\n\n"
        "Tokens/s of score_stream and the memory one window of Lv adds; ratios to no method in the same run.\n\n"
        + markdown_table(list(df.columns), [[cell(v) for v in row] for row in df.itertuples(index=False)]))
    log(f"wrote {stem}.md")
    return df


if __name__ == "__main__":
    print(json.dumps(child_memory(json.loads(sys.argv[1]))))
