"""Regenerate the CPU reproduction, results/cpu-wt2/ (make reproduce; committed when complete).

1. train + evaluate (nonoverlapping, L..16L) every registered position scheme at one L (Hydra multirun)
2. train + evaluate ALiBi and sinusoidal at other L (the paper's Table 5 shape)
3. sliding-window evaluation of every scheme's run at L (the --seeds runs: sliding costs Lv / stride
   forwards per scored token, ~14 min a run on 2 cores)
4. passkey retrieval and context-use curves of every scheme's run at L (python -m alibi_lm.probes run=...)
5. inference-time RoPE extension (linear, ntk, dynamic, yarn) of the rope run at L, nonoverlapping
6. seeds 1 and 2 of the paper's four schemes (sinusoidal, rope, t5, alibi): the table shows mean ± std;
   then the RoPE extensions of their rope runs
7. tables and plots, plus RUN_INFO.md: commands, commit, hardware, wall time of each step

Every step is resumable: trained runs are skipped, evaluated cells are not re-scored, so an
interrupted reproduction started again finishes only what is missing.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from alibi_lm.positions import POSITION_SCHEMES  # noqa: E402
from alibi_lm.provenance import hardware, head_commit  # noqa: E402


def per_run_costs(runs_dir: Path, csv_path: Path) -> list[str]:
    """Training and evaluation wall time of every run, read from its status.json and the results CSV."""
    import json

    import pandas as pd

    rows = pd.read_csv(csv_path) if csv_path.is_file() else pd.DataFrame(columns=["run", "mode", "wall_s", "commit"])
    extended = rows["rope_scaling"].notna() if "rope_scaling" in rows else pd.Series(False, index=rows.index)
    lines = ["| run | steps | trained at commit | train wall time | eval wall time (nonoverlapping / sliding / RoPE "
             "extensions) | commits of its rows |", "|---|---|---|---|---|---|"]
    for run in sorted(p for p in runs_dir.glob("*") if (p / "status.json").is_file()):
        status = json.loads((run / "status.json").read_text())
        mine = rows["run"].astype(str).str.endswith(run.name)
        minutes = [rows[mine & ~extended & (rows["mode"] == m)]["wall_s"].sum() / 60 for m in ("nonoverlapping", "sliding")]
        minutes.append(rows[mine & extended]["wall_s"].sum() / 60)
        commits = ", ".join(sorted(set(rows[mine]["commit"].astype(str))))
        trained = ", ".join(status.get("train_commits", [])) or "not recorded"
        lines.append(f"| {run.name} | {status.get('step')} | {trained} | {status.get('train_seconds', float('nan')) / 60:.1f}"
                     f" min | {' / '.join(f'{m:.1f}' for m in minutes)} min | {commits} |")
    return lines


def names(text: str) -> list[str]:
    """'a,b,' -> ['a', 'b']: a comma list, empty entries dropped."""
    return [x.strip() for x in text.split(",") if x.strip()]


def arguments(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiment", default="cpu-wt2")
    p.add_argument("--data", default="wikitext2")
    p.add_argument("--schemes", default=",".join(POSITION_SCHEMES), help="default: every registered scheme")
    p.add_argument("--seq-len", type=int, default=128, help="L of the all-schemes sweep")
    p.add_argument("--seeds", default="0", help="seeds of every scheme")
    p.add_argument("--more-seeds", default="1,2", help="further seeds for --seed-schemes (mean ± std in the table)")
    p.add_argument("--seed-schemes", default="sinusoidal,rope,t5,alibi", help="the paper's four")
    p.add_argument("--length-schemes", default="alibi,sinusoidal")
    p.add_argument("--other-lengths", default="32,64", help="extra L for --length-schemes (Table 5)")
    p.add_argument("--multipliers", default="1,2,4,8,16", help="Lv = k x L for every run")
    p.add_argument("--max-tokens", type=int, default=8192000,
                   help="training tokens of every run (4000 steps of 2048 tokens, 4 epochs of WikiText-2; "
                        "make budget-probes sets 1, 4 and 8 epochs side by side in results/probes/)")
    p.add_argument("--tokens-per-step", type=int, default=2048, help="batch size = this / L, at every L")
    p.add_argument("--sliding-stride", type=int, default=16)
    p.add_argument("--sliding-tokens", type=int, default=32768, help="tokens of the split scored with sliding windows")
    p.add_argument("--rope-scalings", default="linear,ntk,dynamic,yarn",
                   help="RoPE extensions evaluated on the rope runs at L ('' for none)")
    p.add_argument("--context-probes", default=True, action=argparse.BooleanOptionalAction,
                   help="passkey + context-use probes of every scheme's run at L (README 'Beyond perplexity')")
    p.add_argument("--runs", default="runs", help="paths.runs (run folders; relative to the repository root)")
    p.add_argument("--extra", nargs="*", default=[], help="more Hydra overrides for every run")
    p.add_argument("--dry-run", action="store_true", help="print the steps' commands and exit")
    args = p.parse_args(argv)
    for key in ("schemes", "seeds", "more_seeds", "seed_schemes", "length_schemes", "other_lengths", "multipliers",
                "rope_scalings"):
        setattr(args, key, names(getattr(args, key)))
    if not (args.schemes and args.seeds and args.multipliers):
        p.error("--schemes, --seeds and --multipliers need at least one entry each")
    return args


def plan(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """(name, command) of every step, in order: first what the one-seed tables and probes need, the extra
    seeds (mean ± std) last, so that an interrupted reproduction has the most complete report."""
    multipliers = f"eval.multipliers=[{','.join(args.multipliers)}]"
    common = [f"experiment={args.experiment}", f"data={args.data}", "train.resume=auto", f"paths.runs={args.runs}",
              f"train.max_tokens={args.max_tokens}", "train.evaluate_after=true", multipliers,
              "logger.wandb.mode=disabled", "train.progress=false", *args.extra]
    train = [sys.executable, "-m", "alibi_lm.train", "-m"]
    evaluate = [sys.executable, "-m", "alibi_lm.evaluate"]
    L, seeds = args.seq_len, ",".join(args.seeds)
    batch = [f"train.seq_len={L}", f"train.batch_size={args.tokens_per_step // L}"]
    steps = [("all schemes at L", train + [f"position={','.join(args.schemes)}", f"seed={seeds}", *batch, *common])]
    # Every L trains on the same tokens per optimizer step and the same number of steps (as the paper's
    # fairseq runs do with a fixed --max-tokens per batch), so only the context length differs.
    for other in map(int, args.other_lengths if args.length_schemes else []):
        steps.append((f"training-length sweep L={other}", train + [
            f"position={','.join(args.length_schemes)}", f"seed={seeds}", f"train.seq_len={other}",
            f"train.batch_size={args.tokens_per_step // other}", *common]))
    runs_dir = ROOT / args.runs / args.experiment  # ROOT / an absolute path is that path
    at_L = [f"{s}-L{L}-seed{seed}" for s in args.schemes for seed in args.seeds]
    for run in at_L:
        steps.append((f"sliding eval {run}", evaluate + [
            f"run={runs_dir / run}", "eval.mode=sliding", f"eval.stride={args.sliding_stride}",
            f"eval.max_tokens={args.sliding_tokens}", "eval.skip_done=true", multipliers, "eval.lengths=[]"]))
    for run in at_L if args.context_probes else []:
        steps.append((f"context probes {run}", [sys.executable, "-m", "alibi_lm.probes", f"run={runs_dir / run}"]))

    def rope_extensions(rope_seeds):
        for run in [f"rope-L{L}-seed{seed}" for seed in rope_seeds] if "rope" in args.schemes else []:
            for method in args.rope_scalings:
                steps.append((f"RoPE extension {method} {run}", evaluate + [
                    f"run={runs_dir / run}", f"position.scaling={method}", "eval.skip_done=true", multipliers,
                    "eval.lengths=[]"]))

    rope_extensions(args.seeds)
    if args.more_seeds and args.seed_schemes:
        steps.append(("more seeds", train + [f"position={','.join(args.seed_schemes)}",
                                             f"seed={','.join(args.more_seeds)}", *batch, *common]))
        rope_extensions(args.more_seeds if "rope" in args.seed_schemes else [])
    steps.append(("report", [sys.executable, "-m", "alibi_lm.results", str(ROOT / "results" / args.experiment)]))
    return steps


def main(argv=None) -> None:
    args = arguments(argv)
    steps = plan(args)
    if args.dry_run:
        print("\n".join(f"{name}: {shlex.join(cmd[1:])}" for name, cmd in steps))
        return
    log = [f"# How results/{args.experiment}/ was made", "",
           f"- started: {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}", f"- hardware: {hardware()}",
           f"- OMP_NUM_THREADS: {os.environ.get('OMP_NUM_THREADS', 'unset (torch default)')}",
           "- commit: HEAD when the step started (each step is its own process, which runs that code)", "",
           "| step | command | commit | wall time |", "|---|---|---|---|"]
    total = time.perf_counter()
    for name, cmd in steps:
        print(f"\n=== {name}: {shlex.join(cmd)}", flush=True)
        t0, commit = time.perf_counter(), head_commit()
        result = subprocess.run(cmd, cwd=ROOT)
        if result.returncode != 0:
            sys.exit(f"error: step '{name}' failed with exit status {result.returncode}; fix it and run make reproduce again "
                     f"(finished cells are kept and skipped)")
        shown = shlex.join(["python", *cmd[1:]]).replace(str(ROOT) + "/", "")
        log.append(f"| {name} | `{shown}` | {commit} | {time.perf_counter() - t0:.0f} s |")
    log += ["", f"Wall time of this invocation: {(time.perf_counter() - total) / 60:.1f} min (cells already done are "
            f"skipped and take ~0 s; the per-run table below is what each run cost when it was made).", ""]
    runs_dir = ROOT / args.runs / args.experiment
    log += per_run_costs(runs_dir, ROOT / "results" / args.experiment / "extrapolation.csv")
    out = ROOT / "results" / args.experiment / "RUN_INFO.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(log) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
