"""Budget probes (make probes): short trainings that show what makes the paper's effects appear at a
budget that fits 2 CPU cores, committed as the evidence for the reproduction's budget.

Each probe trains one scheme at one L on WikiText-2 (experiment=quick, model=tiny) with its own
overrides, evaluates it at 1..16 x L (nonoverlapping, the whole validation split), and lands in
results/probes/<probe>/. The table results/probes/README.md puts the probes side by side with their
ratios ppl(kL) / ppl(L) and the command, commit, hardware and wall time of each. Resumable: a probe
that is trained and evaluated is skipped.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
TOKENS_PER_STEP = 2048  # batch = 2048 / L sequences at every L (the reproduction's rule)

# name: (scheme, L, training tokens, extra overrides). 8.19M tokens = 4 epochs of WikiText-2.
PROBES = {
    "t5-L64-8M": ("t5", 64, 8_192_000, []),
    "t5-L128-8M": ("t5", 128, 8_192_000, []),
    "sinusoidal-L64-8M": ("sinusoidal", 64, 8_192_000, []),
    "sinusoidal-L128-8M": ("sinusoidal", 128, 8_192_000, []),
    "sinusoidal-L64-16M": ("sinusoidal", 64, 16_384_000, []),
    "alibi-L64-8M": ("alibi", 64, 8_192_000, []),
    "alibi-L128-8M": ("alibi", 128, 8_192_000, []),
    "sinusoidal-L64-8M-dropout0": ("sinusoidal", 64, 8_192_000, ["model.dropout=0", "model.attn_dropout=0"]),
}


def command(probe: str, runs: str) -> list[str]:
    scheme, L, tokens, extra = PROBES[probe]
    return [sys.executable, "-m", "alibi_lm.train", "experiment=quick", "data=wikitext2", f"name=probes/{probe}",
            f"paths.runs={runs}", f"position={scheme}", f"train.seq_len={L}", f"train.batch_size={TOKENS_PER_STEP // L}",
            f"train.max_tokens={tokens}", "train.resume=auto", "train.evaluate_after=true", "eval.multipliers=[1,2,4,8,16]",
            "logger.wandb.mode=disabled", "train.progress=false", *extra]


def summary(results: Path) -> str:
    from alibi_lm.provenance import cpu_description

    head = ["probe", "scheme", "L", "tokens", "overrides", *[f"ppl {k}L" for k in (1, 2, 4, 8, 16)],
            "2L/L", "8L/L", "16L/L", "eval commit", "eval wall s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for probe, (scheme, L, tokens, extra) in PROBES.items():
        csv = results / probe / "extrapolation.csv"
        if not csv.is_file():
            continue
        df = pd.read_csv(csv)
        df = df[df["mode"] == "nonoverlapping"]
        ppl = {int(r.eval_len): r.ppl for r in df.itertuples()}
        cells = [f"{ppl[k * L]:.2f}" if k * L in ppl else "" for k in (1, 2, 4, 8, 16)]
        ratios = [f"{ppl[k * L] / ppl[L]:.3f}" if k * L in ppl and L in ppl else "" for k in (2, 8, 16)]
        lines.append("| " + " | ".join([probe, scheme, str(L), f"{tokens / 1e6:.2f}M", " ".join(extra) or "-", *cells,
                                        *ratios, ", ".join(sorted(set(df["commit"].astype(str)))),
                                        f"{df['wall_s'].sum():.0f}"]) + " |")
    return "\n".join([
        "# Budget probes (WikiText-2, model=tiny, 2 CPU cores)", "",
        "Made by `make probes` (`python scripts/budget_probes.py`); each probe's training command is below the table. "
        "Validation perplexity, nonoverlapping, the whole split; ratio = ppl(kL) / ppl(L). "
        f"Hardware: {cpu_description()}. Training wall time of each probe: `runs/probes/<probe>/status.json` "
        "(listed in the command log below).", "", *lines, ""])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--probes", default=",".join(PROBES), help="comma-separated probe names (default: all)")
    p.add_argument("--runs", default=str(ROOT / "runs"), help="paths.runs for the probe runs")
    args = p.parse_args()
    results = ROOT / "results" / "probes"
    log = results / "commands.md"
    results.mkdir(parents=True, exist_ok=True)
    for probe in args.probes.split(","):
        if probe not in PROBES:
            sys.exit(f"error: unknown probe {probe!r}; choose from {', '.join(PROBES)}")
        cmd = command(probe, args.runs)
        print(f"\n=== {probe}: {shlex.join(cmd)}", flush=True)
        t0 = time.perf_counter()
        if subprocess.run(cmd, cwd=ROOT).returncode != 0:
            sys.exit(f"error: probe {probe} failed; fix it and run make probes again (finished probes are skipped)")
        shown = shlex.join(["python", *cmd[1:]]).replace(str(ROOT) + "/", "")
        from alibi_lm.provenance import git_commit

        with log.open("a") as f:
            f.write(f"- `{probe}` ({time.perf_counter() - t0:.0f} s this invocation, commit {git_commit(True)}): `{shown}`\n")
        (results / "README.md").write_text(summary(results) + "\n## Command log\n\n" + log.read_text())
    print(f"wrote {results / 'README.md'}")


if __name__ == "__main__":
    main()
