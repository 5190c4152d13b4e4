"""Budget probes (make budget-probes): how the training budget changes the paper's effects on 2 CPU cores, committed
as the evidence for the reproduction's budget (experiment=cpu-wt2: 8.19M tokens, 4 epochs of WikiText-2).

Every probe is the reproduction's own run (experiment=cpu-wt2, model=tiny, seed 0, 2048 tokens per step)
with another token budget or override: 1 epoch (2.05M, the budget of the earlier results/quick), 4 epochs
(8.19M: the reproduction's run itself, trained into runs/cpu-wt2/ and shared with make reproduce, so that
neither trains it twice) and 8 epochs (16.4M). Each is evaluated at 1..16 x L (nonoverlapping, the whole
validation split). results/probes/README.md puts them side by side with their ratios ppl(kL) / ppl(L) and
the command, commit, hardware and wall time of each. Resumable: a probe that is trained and evaluated is skipped.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from alibi_lm.checkpoint import atomic_write_text
from alibi_lm.errors import ArgumentParser
from alibi_lm.provenance import head_commit

from . import checkout_root
from .steps import Step, run_steps

ROOT = checkout_root()  # results/, runs/

TOKENS_PER_STEP = 2048  # batch = 2048 / L sequences at every L (the reproduction's rule)
EPOCH = 2_048_000  # tokens: about one epoch of WikiText-2's training split
REPRODUCTION = "cpu-wt2"  # the experiment whose runs the probes vary

# name: (scheme, L, training tokens, extra overrides). The 8M probes are the reproduction's runs (name cpu-wt2).
PROBES = {
    **{f"{s}-L128-{n}M": (s, 128, e * EPOCH, []) for s in ("sinusoidal", "t5", "alibi") for n, e in ((2, 1), (8, 4))},
    "sinusoidal-L128-16M": ("sinusoidal", 128, 8 * EPOCH, []),
    "t5-L128-16M": ("t5", 128, 8 * EPOCH, []),
    "sinusoidal-L128-8M-dropout0": ("sinusoidal", 128, 4 * EPOCH, ["model.dropout=0", "model.attn_dropout=0"]),
}
MULTIPLES = (1, 2, 4, 8, 16)
DEFAULT_RUNS = "runs"  # make reproduce's paths.runs: the 8M probes share its runs only there


def experiment_name(probe: str, runs: str = DEFAULT_RUNS) -> str:
    """The run's name=: the reproduction's own for a probe that is its run, else probes/<probe>. With runs other
    than the reproduction's, never the reproduction's: its results rows would replace the reproduction's."""
    scheme, L, tokens, extra = PROBES[probe]
    shared = tokens == 4 * EPOCH and not extra and runs == DEFAULT_RUNS
    return REPRODUCTION if shared else f"probes/{probe}"


def command(probe: str, runs: str) -> list[str]:
    scheme, L, tokens, extra = PROBES[probe]
    name = experiment_name(probe, runs)
    own = [] if name == REPRODUCTION else ["paths.results=results"]  # results/probes/<probe>/, not beside the runs
    return [sys.executable, "-m", "alibi_lm.train", f"experiment={REPRODUCTION}", f"name={name}", *own,
            f"paths.runs={runs}", f"position={scheme}", f"train.seq_len={L}", f"train.batch_size={TOKENS_PER_STEP // L}",
            f"train.max_tokens={tokens}", "train.resume=auto", "train.evaluate_after=true",
            f"eval.multipliers=[{','.join(map(str, MULTIPLES))}]", "logger.wandb.mode=disabled", "train.progress=false",
            *extra]


def probe_rows(results: Path, probe: str, runs: str = DEFAULT_RUNS) -> pd.DataFrame:
    """The probe's nonoverlapping rows (seed 0, no RoPE extension) from results/<its experiment>/extrapolation.csv."""
    scheme, L, _, _ = PROBES[probe]
    csv = results.parent / experiment_name(probe, runs) / "extrapolation.csv"
    if not csv.is_file():
        return pd.DataFrame()
    df = pd.read_csv(csv, keep_default_na=False, na_values=[""])
    keep = (df["mode"] == "nonoverlapping") & (df["split"] == "valid") & (df["position"] == scheme) & (df["seed"] == 0)
    keep &= df["train_len"] == L
    if "rope_scaling" in df:
        keep &= df["rope_scaling"].isna()
    return df[keep]


def recorded_training(readme: Path) -> dict[str, tuple[str, str, str]]:
    """probe -> (train min, trained at, tokens) as the existing README's table records them: what a rebuild keeps
    for a run whose folder is absent (a fresh clone), instead of losing a measurement it cannot make again."""
    if not readme.is_file():
        return {}
    head, found = None, {}
    for line in readme.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| probe |"):
            head = cells
        elif head and line.startswith("| ") and len(cells) == len(head) and cells[0] in PROBES:
            found[cells[0]] = (cells[head.index("train min")], cells[head.index("trained at")], cells[head.index("tokens")])
    return found


def run_folder(runs: Path, runs_arg: str, probe: str) -> Path:
    scheme, L, _, _ = PROBES[probe]
    return runs / experiment_name(probe, runs_arg) / f"{scheme}-L{L}-seed0"


def trained_tokens(run: Path, rows: pd.DataFrame, recorded: tuple | None) -> str:
    """The tokens the probe's run trained, from its own config.yaml and status.json (never from the probe's
    name: a run stopped early or trained with other settings shows what it did, "2.05M of 8.19M"); where the
    files are absent, what the README recorded, else the step its rows were scored at."""
    if (run / "config.yaml").is_file() and (run / "status.json").is_file():
        train = yaml_train(run / "config.yaml")
        status = json.loads((run / "status.json").read_text())
        per_step = train["batch_size"] * train["grad_accum"] * train["seq_len"]
        done, planned = (tokens_text(status.get(k, 0) * per_step) for k in ("step", "steps"))
        return done if done == planned else f"{done} of {planned}"
    if recorded:
        return recorded[2]
    steps = sorted({int(s) for s in rows["step"].dropna()}) if "step" in rows else []
    return f"step {', '.join(map(str, steps))} (budget not recorded)" if steps else "not recorded"


def tokens_text(tokens: int) -> str:
    return f"{tokens / 1e6:.2f}M" if tokens >= 100_000 else f"{tokens:,}"


def yaml_train(path: Path) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)["train"]


def training(runs: Path, runs_arg: str, probe: str, recorded: dict) -> tuple[str, str]:
    """(training minutes summed over its resumed segments, "≥" when one was unrecorded; the commits that
    trained it), from the run's status.json, else as the README recorded them."""
    status = run_folder(runs, runs_arg, probe) / "status.json"
    if not status.is_file():  # a fresh clone: the runs are not in git; the reproduction's costs are in RUN_INFO
        shared = experiment_name(probe, runs_arg) == REPRODUCTION
        absent = (f"in results/{REPRODUCTION}/RUN_INFO.md" if shared else "run folder absent: see the command log", "")
        return recorded.get(probe, absent)[:2]
    info = json.loads(status.read_text())
    segments = info.get("train_segments", [dict(seconds=info.get("train_seconds"), partial=True)])
    seconds = sum(s["seconds"] or 0 for s in segments)
    partial = "≥ " if any(s["seconds"] is None or s.get("partial") for s in segments) else ""
    return (f"{partial}{seconds / 60:.1f}" if seconds else "", ", ".join(info.get("train_commits", [])))


def summary(results: Path, runs: Path, runs_arg: str) -> str:
    recorded = recorded_training(results / "README.md")
    head = ["probe", "scheme", "L", "tokens", "overrides", *[f"ppl {k}L" for k in MULTIPLES],
            *[f"{k}L/L" for k in (2, 8, 16)], "train min", "trained at", "eval min", "rows' commits", "scored on"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for probe, (scheme, L, _, extra) in PROBES.items():
        df = probe_rows(results, probe, runs_arg)
        if df.empty:
            continue
        ppl = {int(r.eval_len): r.ppl for r in df.itertuples()}
        cells = [f"{ppl[k * L]:.2f}" if k * L in ppl else "" for k in MULTIPLES]
        ratios = [f"{ppl[k * L] / ppl[L]:.3f}" if k * L in ppl and L in ppl else "" for k in (2, 8, 16)]
        budget = trained_tokens(run_folder(runs, runs_arg, probe), df, recorded.get(probe))
        lines.append("| " + " | ".join([probe, scheme, str(L), budget, " ".join(extra) or "-", *cells,
                                        *ratios, *training(runs, runs_arg, probe, recorded), f"{df['wall_s'].sum() / 60:.1f}",
                                        ", ".join(sorted(set(df["commit"].astype(str)))),
                                        ", ".join(sorted(set(df["device"].astype(str)))) if "device" in df else ""]) + " |")
    return "\n".join([
        "# Budget probes (WikiText-2, experiment=cpu-wt2, model=tiny, seed 0, 2 CPU cores)", "",
        "Made by `make budget-probes` (`python scripts/budget_probes.py`); each probe's training command is in the log "
        "below (a line when it begins and one when it ends). Validation perplexity, nonoverlapping, the whole split; "
        f"ratio = ppl(kL) / ppl(L). The 8.19M probes are the reproduction's own runs (results/{REPRODUCTION}/). "
        "Hardware: the machine and threads that scored a probe's rows are in its `scored on` column (the rows' device); "
        "make budget-probes trains and scores a probe in one process, so it trained there too (the 8.19M probes: "
        f"results/{REPRODUCTION}/RUN_INFO.md). train min: the training wall time summed over the run's resumed segments "
        "(status.json; ≥: a segment trained before they were recorded); eval min: the wall_s of its rows. tokens: what the "
        "run trained, from its config.yaml and status.json (the probe's name is the plan: a run stopped early shows "
        "\"of\" its budget).", "", *lines, ""])


def write_readme(results: Path, runs: Path, runs_arg: str) -> None:
    """results/probes/README.md: the summary table, then the command log (commands.md) as it stands."""
    log = results / "commands.md"
    log_text = log.read_text() if log.is_file() else ""
    atomic_write_text(results / "README.md", summary(results, runs, runs_arg) + "\n## Command log\n\n" + log_text)


def main() -> None:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--probes", default=",".join(PROBES), help="comma-separated probe names (default: all)")
    p.add_argument("--runs", default=DEFAULT_RUNS, help="paths.runs for the probe runs (relative to the repository "
                   "root); not while make reproduce trains there (a run folder has one writer). Elsewhere the 8M "
                   "probes are trained again under probes/<probe>, not shared with the reproduction")
    p.add_argument("--jobs", type=int, default=1, help="probes trained at once, the cores split between them "
                   "(scripts/steps.py; each probe's output then goes to logs/probes/)")
    p.add_argument("--report", action="store_true", help="only rebuild results/probes/README.md from the probes' rows "
                   "and the command log; train nothing")
    args = p.parse_args()
    if args.jobs < 1:
        p.error(f"--jobs must be >= 1, got {args.jobs}")
    results = ROOT / "results" / "probes"
    log = results / "commands.md"
    chosen = [name.strip() for name in args.probes.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in PROBES]
    if unknown or not chosen:  # before anything trains, not after hours of the probes before it
        p.error(f"unknown probe(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(PROBES)}")
    results.mkdir(parents=True, exist_ok=True)
    runs = ROOT / args.runs  # ROOT / an absolute path is that path
    if args.report:
        write_readme(results, runs, args.runs)
        print(f"wrote {results / 'README.md'}")
        return
    steps = [Step(probe, command(probe, args.runs)) for probe in chosen]  # independent: any order, any two at once
    commits: dict[str, str] = {}

    def begin(step: Step, threads: str | None) -> None:
        print(f"\n=== {step.name}: {shlex.join(step.command)}", flush=True)
        commits[step.name] = head_commit()
        shown = shlex.join(["python", *step.command[1:]]).replace(str(ROOT) + "/", "")
        with log.open("a") as f:  # before it runs too: a session that ends during a probe leaves its line
            f.write(f"- {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, began `{step.name}` at commit "
                    f"{commits[step.name]}{f' with OMP_NUM_THREADS={threads}' if threads else ''}: `{shown}`\n")

    def end(step: Step, code: int, seconds: float) -> None:
        with log.open("a") as f:
            f.write(f"- {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, ended `{step.name}` after "
                    f"{seconds:.0f} s{'' if code == 0 else f' with exit status {code}'}\n")
        write_readme(results, runs, args.runs)

    def skip(step: Step) -> None:  # nothing left to train or score (alibi_lm.finished): no process
        print(f"=== {step.name}: nothing left to train or score; skipped", flush=True)
        write_readme(results, runs, args.runs)

    failed = run_steps(steps, args.jobs, ROOT, ROOT / "logs" / "probes", begin, end, skip)
    if failed:
        sys.exit(f"error: probe(s) {', '.join(failed)} failed; fix them and run make budget-probes again "
                 f"(finished probes are skipped)")
    print(f"wrote {results / 'README.md'}")


if __name__ == "__main__":
    main()
