"""Regenerate the CPU reproduction, results/cpu-wt2/ (make reproduce; committed when complete).

Run by run, so that a plan stopped part-way (--stop-starting-after) leaves whole runs, every row of each:
1. every registered position scheme at one L: train + evaluate (nonoverlapping, L..16L; one step per run), then
   its sliding-window evaluation (sliding costs Lv / stride forwards per scored token, ~14 min a run on 2 cores),
   passkey retrieval and context-use curves (python -m alibi_lm.probes run=...), and where they apply the
   inference-time RoPE extensions (linear, ntk, dynamic, yarn) of the rope run, blockwise causal attention
   (eval.attention=bca, the xPos paper's evaluation) of the xpos, rope and alibi runs, and Llama 4's temperature
   tuning (eval.temperature_tuning) of the nope and iRoPE runs
2. ALiBi and sinusoidal at other L (the paper's Table 5 shape): train + evaluate, then their probes
3. seeds 1 and 2 of every scheme and variant, as in 1 without the probes: the table shows mean ± std (n = 3),
   under both protocols
4. tables and plots; RUN_INFO.md (rebuilt after every step from RUN_LOG.jsonl, to which every invocation
   appends its start, hardware and data, and each step's command, commit and wall time): how the folder was
   made across all the invocations it took, and what every run cost (--report-only rebuilds it and runs nothing)

"Every scheme" is every registered one plus the variants of scripts/variants.py (fox+rope, iRoPE with and
without a window, Scalable-Softmax, QK-norm, learned ALiBi slopes). Every step is resumable: trained runs are
skipped, evaluated cells are not re-scored, so an interrupted reproduction started again finishes only what is
missing. With --keep-committed, a run whose folder is not here but whose rows are all in the committed results
(trained on another machine) is not trained again, unless --retrain names its scheme (its rows are stale): how a
reproduction is finished on another machine without replacing what is done. --jobs 2 runs two steps at once (an
evaluation starts once its run is trained; the report waits for all): scripts/steps.py.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shlex
import signal
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from omegaconf import OmegaConf

from alibi_lm.checkpoint import atomic_write_text
from alibi_lm.config import PRECISIONS, DataConfig
from alibi_lm.data import local_checksums
from alibi_lm.positions import POSITION_SCHEMES
from alibi_lm.positions.rope import ROPE_SCALINGS
from alibi_lm.provenance import HASH_COLUMNS, hardware, head_commit
from alibi_lm.stopping import STOP_SIGNALS, STOPPED_EXITS

from . import checkout_root
from .steps import Step, log_name, plan_status, run_steps, trained_run_finished
from .variants import VARIANTS, check_extra, overrides, run_label

ROOT = checkout_root()  # results/, runs/

RUN_LOG = "RUN_LOG.jsonl"  # in results/<experiment>/: every invocation's start and every step, appended
STEP_SHOWN_S = 10  # steps shorter than this found their cells done: counted in RUN_INFO.md, not listed


def _minutes(seconds) -> str:
    return "-" if not seconds else f"{seconds / 60:.1f}"


COST_TABLE_HEAD = ("| run | steps | trained at commits | trained on | train | eval nonoverlapping / sliding / RoPE "
                   "extensions | probes passkey / context use | commits of its rows |", "|---|---|---|---|---|---|---|---|")


def per_run_costs(runs_dir: Path, results_dir: Path) -> list[str]:
    """Training, evaluation and probe wall time of every run: status.json's segments and the rows' wall_s."""
    import pandas as pd

    def table(name, columns):
        path = results_dir / name
        df = pd.read_csv(path, dtype=HASH_COLUMNS) if path.is_file() else pd.DataFrame()
        return df if not df.empty else pd.DataFrame(columns=columns)

    rows = table("extrapolation.csv", ["run", "mode", "wall_s", "commit", "rope_scaling"])
    passkey, context = table("passkey.csv", ["run", "wall_s"]), table("context_use.csv", ["run", "split", "wall_s"])
    extended = rows["rope_scaling"].notna() if "rope_scaling" in rows else pd.Series(False, index=rows.index)
    lines = list(COST_TABLE_HEAD)
    for run in sorted(p for p in runs_dir.glob("*") if (p / "status.json").is_file()):
        status = json.loads((run / "status.json").read_text())
        segments = status.get("train_segments", [dict(seconds=status.get("train_seconds"), partial=True)])
        known = sum(s["seconds"] or 0 for s in segments)
        partial = any(s["seconds"] is None or s.get("partial") for s in segments) and status.get("step")
        mine = rows["run"].astype(str).str.endswith(run.name)
        evals = [rows[mine & ~extended & (rows["mode"] == m)]["wall_s"].sum() for m in ("nonoverlapping", "sliding")]
        evals.append(rows[mine & extended]["wall_s"].sum())
        pk = passkey[passkey["run"].astype(str).str.endswith(run.name)]["wall_s"].sum()
        curves = context[context["run"].astype(str).str.endswith(run.name)]
        cu = curves.drop_duplicates(["split"])["wall_s"].sum()  # every bin row of a curve repeats the curve's time
        commits = ", ".join(sorted(set(rows[mine]["commit"].astype(str))))
        devices = list(dict.fromkeys(s.get("device", "not recorded") for s in segments))  # in order, once each
        lines.append(f"| {run.name} | {status.get('step')} | {', '.join(status.get('train_commits', [])) or 'not recorded'}"
                     f" | {'; '.join(devices)} | {'≥ ' if partial else ''}{_minutes(known)} min | "
                     f"{' / '.join(map(_minutes, evals))} min | {_minutes(pk)} / {_minutes(cu)} min | {commits} |")
    return lines


def data_description(data: str) -> str:
    """Which copy of the data set the runs read: the sha256 of each local split file, or the hub's name."""
    cfg = DataConfig(**OmegaConf.to_container(OmegaConf.load(ROOT / "configs" / "data" / f"{data}.yaml")))
    checksums = local_checksums(cfg)
    if checksums is None:
        return f"{cfg.hub_path} ({cfg.hub_config_name}) through `datasets`"
    shas = ", ".join(f"{split} {sha[:16]}" for split, sha in checksums.items())
    return f"{data}, local copy ({shas}: sha256 of each split's file, first 16 hex digits)"


def step_outcome(status: int) -> str:
    """A step's exit status in words: a stop signal (exit 75, or 130 after Ctrl-C) is not a failure, the same command
    resumes it."""
    if status == 0:
        return "done"
    if status in STOPPED_EXITS:  # 75 after a scheduler's signal, 130 after Ctrl-C
        return f"stopped by a signal (exit status {status}; resumed by the same command)"
    if status < 0 and -status in STOP_SIGNALS:  # ended by the signal itself (it came before the app's handler)
        return f"stopped by {signal.Signals(-status).name} (resumed by the same command)"
    return f"failed (exit status {status})"


def add_start_limit(p: argparse.ArgumentParser) -> None:
    """--stop-starting-after: the plan drivers' option for an allocation with a time limit (a cluster job, a
    session): no training starts after it; the running steps and the evaluations of the runs trained finish, so
    that the limit ends nothing half done."""
    p.add_argument("--stop-starting-after", type=float, default=None, metavar="MINUTES",
                   help="start no training after this many minutes; the running steps and the evaluations of the runs "
                        "trained finish, then exit status 75 (the same command runs the rest): leave a run's length "
                        "before a job's time limit")


def names(text: str) -> list[str]:
    """'a,b,' -> ['a', 'b']: a comma list, empty entries dropped."""
    return [x.strip() for x in text.split(",") if x.strip()]


def arguments(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiment", default="cpu-wt2")
    p.add_argument("--data", default="wikitext2")
    every = ",".join([*POSITION_SCHEMES, *VARIANTS])
    p.add_argument("--schemes", default=every, help="default: every registered scheme and variant (scripts/variants.py)")
    p.add_argument("--seq-len", type=int, default=128, help="L of the all-schemes sweep")
    p.add_argument("--seeds", default="0", help="seeds of every scheme")
    p.add_argument("--more-seeds", default="1,2", help="further seeds for --seed-schemes (mean ± std in the table)")
    p.add_argument("--seed-schemes", default=every, help="schemes trained with --more-seeds too (default: all)")
    p.add_argument("--bca-schemes", default="xpos,rope,alibi",
                   help="schemes also evaluated with blockwise causal attention (eval.attention=bca)")
    p.add_argument("--temperature-schemes", default="nope,irope",
                   help="schemes also evaluated with Llama 4's temperature tuning (eval.temperature_tuning=true)")
    p.add_argument("--keep-committed", action="store_true", help="do not train runs that have no folder here but "
                   "all their rows in results/<experiment>/ (finish a reproduction begun on another machine)")
    p.add_argument("--retrain", default="", help="with --keep-committed: schemes trained again although their "
                   "committed rows are complete (rows made before a change to the scheme's defaults)")
    p.add_argument("--length-schemes", default="alibi,sinusoidal")
    p.add_argument("--other-lengths", default="32,64", help="extra L for --length-schemes (Table 5)")
    p.add_argument("--multipliers", default="1,2,4,8,16", help="Lv = k x L for every run")
    p.add_argument("--max-tokens", type=int, default=8192000,
                   help="training tokens of every run (4000 steps of 2048 tokens, 4 epochs of WikiText-2; "
                        "make budget-probes sets 1, 4 and 8 epochs side by side in results/probes/)")
    p.add_argument("--tokens-per-step", type=int, default=2048, help="batch size = this / L, at every L")
    p.add_argument("--sliding-stride", type=int, default=16)
    p.add_argument("--sliding-tokens", type=int, default=32768, help="tokens of the split scored with sliding windows")
    p.add_argument("--rope-scalings", default=",".join(ROPE_SCALINGS),
                   help="RoPE extensions evaluated on the rope runs at L ('' for none)")
    p.add_argument("--context-probes", default=True, action=argparse.BooleanOptionalAction,
                   help="passkey + context-use probes of every scheme's run at L (docs/probes.md)")
    p.add_argument("--runs", default="runs", help="paths.runs (run folders; relative to the repository root)")
    p.add_argument("--extra", nargs="*", default=[], help="more Hydra overrides for every run")
    add_precision(p)
    p.add_argument("--jobs", type=int, default=1, help="steps run at once, the cores split between them (on 2 cores, "
                   "--jobs 2 trains ~1.3x faster in total; each step's output then goes to logs/<experiment>/)")
    p.add_argument("--dry-run", action="store_true", help="print the steps' commands and exit")
    p.add_argument("--status", action="store_true", help="run nothing: how many steps are finished, which are left")
    p.add_argument("--report-only", action="store_true", help="run nothing: rebuild RUN_INFO.md from RUN_LOG.jsonl "
                   "and the run folders (without them, its per-run cost table is kept)")
    add_start_limit(p)
    args = p.parse_args(argv)
    own_folder(args, p)
    for key in ("schemes", "seeds", "more_seeds", "seed_schemes", "length_schemes", "other_lengths", "multipliers",
                "rope_scalings", "bca_schemes", "temperature_schemes", "retrain"):
        setattr(args, key, names(getattr(args, key)))
    for key in ("schemes", "seed_schemes", "length_schemes", "bca_schemes", "temperature_schemes", "retrain"):
        if unknown := [s for s in getattr(args, key) if s not in POSITION_SCHEMES and s not in VARIANTS]:
            p.error(f"unknown --{key.replace('_', '-')} {unknown}; choose from {every}")
    if not (args.schemes and args.seeds and args.multipliers):
        p.error("--schemes, --seeds and --multipliers need at least one entry each")
    if args.jobs < 1:
        p.error(f"--jobs must be >= 1, got {args.jobs}")
    check_extra(p, args.schemes, args.experiment, args.seq_len, args.extra)
    return args


# Options that change what is trained or how it is scored: the committed results/<experiment>/ holds the
# defaults' rows, so a run with other values (a cheap trial) gets an experiment folder of its own.
SETTINGS = ("data", "seq_len", "max_tokens", "tokens_per_step", "sliding_stride", "sliding_tokens", "extra")


def add_precision(p: argparse.ArgumentParser) -> None:
    p.add_argument("--precision", choices=PRECISIONS, default=None,
                   help="train.precision of every training (its evaluations and probes compute as it trained): fp32 "
                   "on a GPU gives numbers comparable with a CPU's rows, bf16 about twice the speed; the rows' device "
                   "column names it, and it is no setting of the results (they go to the same folder)")


def precision_override(args: argparse.Namespace) -> list[str]:
    return [] if args.precision is None else [f"train.precision={args.precision}"]


def own_folder(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Rename the experiment (runs/ and results/) to <experiment>-custom-<digest> when a setting differs from
    the default, so that a trial never replaces the committed rows it would be mistaken for."""
    changed = {k: getattr(args, k) for k in SETTINGS if getattr(args, k) != parser.get_default(k)}
    args.folder = args.experiment  # runs/<folder>/, results/<folder>/ (the runs' name=)
    if changed:
        digest = hashlib.sha256(json.dumps(changed, sort_keys=True).encode()).hexdigest()[:8]
        shown = ", ".join(f"--{k.replace('_', '-')}={v}" for k, v in changed.items())
        args.folder = f"{args.experiment}-custom-{digest}"
        print(f"note: {shown} differ from the reproduction's settings: runs and results go to {args.folder}/")


@functools.cache
def committed_rows(csv: Path):
    import pandas as pd

    return pd.read_csv(csv, dtype=HASH_COLUMNS)


def made_elsewhere(args: argparse.Namespace, runs_dir: Path, run: str, seq_len: int, sliding: bool) -> bool:
    """Whether `run` has no folder here but every nonoverlapping row (and, with `sliding`, every sliding row) the
    plan would give it is in the committed extrapolation.csv: a run trained on another machine."""
    csv = ROOT / "results" / args.folder / "extrapolation.csv"
    if not args.keep_committed or (ROOT / runs_dir / run).exists() or not csv.is_file() \
            or run.split("-L")[0] in args.retrain_labels:
        return False
    rows = committed_rows(csv)
    attention = rows["attention"].fillna("full") if "attention" in rows else "full"
    mine = rows[(rows["run"] == str(runs_dir / run)) & rows["rope_scaling"].isna() & (attention == "full")]
    wanted = {round(float(k) * seq_len) for k in args.multipliers}
    return all(wanted <= set(mine.loc[mine["mode"] == mode, "eval_len"].astype(int))
               for mode in ("nonoverlapping", *(["sliding"] if sliding else [])))


class Plan:
    """The reproduction's steps as they are added: one training step per run (so that --jobs can train two runs at
    once and each run's wall time is its own step's), its evaluations after it; runs whose committed rows stand in
    for them (made_elsewhere) get no steps."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.extra = args, tuple(args.extra)
        self.multipliers = f"eval.multipliers=[{','.join(args.multipliers)}]"
        self.common = [f"experiment={args.experiment}", f"name={args.folder}", f"data={args.data}",
                       "train.resume=auto", f"paths.runs={args.runs}", f"train.max_tokens={args.max_tokens}",
                       "train.evaluate_after=true", self.multipliers, "logger.wandb.mode=disabled",
                       "train.progress=false", *precision_override(args), *args.extra]
        self.runs_dir = Path(args.runs) / args.folder  # the steps run in ROOT: a relative path stays relative
        args.retrain_labels = {run_label(s, args.experiment, length, self.extra) for s in args.retrain
                               for length in {args.seq_len, *map(int, args.other_lengths)}}
        self.steps: list[Step] = []
        self.elsewhere: list[str] = []

    def run_name(self, scheme: str, seq_len: int, seed) -> str:
        return f"{run_label(scheme, self.args.experiment, seq_len, self.extra)}-L{seq_len}-seed{seed}"

    def train(self, scheme: str, seq_len: int, seed) -> None:
        # Every L trains on the same tokens per optimizer step and the same number of steps (as the paper's
        # fairseq runs do with a fixed --max-tokens per batch), so only the context length differs.
        args, run = self.args, self.run_name(scheme, seq_len, seed)
        if made_elsewhere(args, self.runs_dir, run, seq_len, sliding=seq_len == args.seq_len):
            self.elsewhere.append(run)
            return
        command = [sys.executable, "-m", "alibi_lm.train", *overrides(scheme, args.experiment, seq_len),
                   f"seed={seed}", f"train.seq_len={seq_len}", f"train.batch_size={args.tokens_per_step // seq_len}",
                   *self.common]
        done = trained_run_finished(command, self.runs_dir / run, ROOT)
        self.steps.append(Step(f"train {run}", command, makes=run, done=done))

    def evaluation(self, name: str, run: str, *settings, app: str = "alibi_lm.eval") -> None:
        if run not in self.elsewhere:
            command = [sys.executable, "-m", app, f"run={self.runs_dir / run}", *settings]
            self.steps.append(Step(f"{name} {run}", command, needs=(run,)))

    def rescoring_at_L(self, name: str, run: str, setting: str) -> None:
        """An evaluation of a run at L under another setting, at every multiplier, cells already scored kept."""
        self.evaluation(name, run, setting, "eval.skip_done=true", self.multipliers, "eval.lengths=[]")

    def evaluations_at_L(self, seeds, schemes) -> None:
        """The RoPE extensions, blockwise attention and temperature tuning of the runs at L of these seeds."""
        args, L = self.args, self.args.seq_len
        for run in [self.run_name("rope", L, seed) for seed in seeds] if "rope" in schemes else []:
            for method in args.rope_scalings:
                self.rescoring_at_L(f"RoPE extension {method}", run, f"position.scaling={method}")
        for name, scheme, setting in [("blockwise attention", s, "eval.attention=bca") for s in args.bca_schemes] + \
                [("temperature tuning", s, "eval.temperature_tuning=true") for s in args.temperature_schemes]:
            for seed in seeds if scheme in schemes else []:
                self.rescoring_at_L(name, self.run_name(scheme, L, seed), setting)

    def whole_run(self, scheme: str, seq_len: int, seed, probes: bool) -> None:
        """A run at L and everything scored on it: its training (nonoverlapping rows), sliding evaluation, probes
        (with `probes`), and its RoPE extensions, blockwise attention or temperature tuning where they apply."""
        self.train(scheme, seq_len, seed)
        run = self.run_name(scheme, seq_len, seed)
        self.sliding([run])
        if probes:
            self.evaluation("context probes", run, app="alibi_lm.probes")
        self.evaluations_at_L([seed], [scheme])

    def sliding(self, runs: list[str]) -> None:
        for run in runs:
            self.evaluation("sliding eval", run, "eval.mode=sliding", f"eval.stride={self.args.sliding_stride}",
                            f"eval.max_tokens={self.args.sliding_tokens}", "eval.skip_done=true", self.multipliers,
                            "eval.lengths=[]")


def plan(args: argparse.Namespace, committed: list[str] | None = None) -> list[Step]:
    """Every step, in order: first what the one-seed tables and probes need, the extra seeds (mean ± std) last,
    so that an interrupted reproduction has the most complete report; run by run (its training, then its
    evaluations and probes), so that a plan stopped part-way (--stop-starting-after) leaves whole runs. The runs
    whose committed rows stand in for them (--keep-committed) are appended to `committed`."""
    p, L = Plan(args), args.seq_len
    for scheme in args.schemes:
        for seed in args.seeds:
            p.whole_run(scheme, L, seed, probes=args.context_probes)
    for other in list(map(int, args.other_lengths)) if args.length_schemes else []:
        for scheme in args.length_schemes:
            for seed in args.seeds:  # probed too: the context-use curve's c* against L is the probes' question
                p.train(scheme, other, seed)
                if args.context_probes:
                    p.evaluation("context probes", p.run_name(scheme, other, seed), app="alibi_lm.probes")
    more = [s for s in args.seed_schemes if s in args.schemes]
    for seed in args.more_seeds if more else []:
        for scheme in more:
            p.whole_run(scheme, L, seed, probes=False)
    if committed is not None:
        committed += p.elsewhere
    elif p.elsewhere:
        print(f"note: {len(p.elsewhere)} run(s) have every perplexity row in results/{args.folder}/ and no folder "
              f"here (trained elsewhere), so they are not trained again, and their other evaluations (RoPE "
              f"extensions, blockwise attention, temperature tuning, probes) are not made here: "
              f"{', '.join(p.elsewhere)}")
    report = [sys.executable, "-m", "alibi_lm.results", str(Path("results") / args.folder)]
    return p.steps + [Step("report", report, barrier=True)]


def log_event(path: Path, **record) -> None:
    """Append one record to the run log (RUN_LOG.jsonl), synced: a session killed mid-step keeps what it did."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps({"time": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S UTC}", **record}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def earlier_cost_rows(previous: str | None) -> list[str]:
    """The rows of the per-run cost table of an earlier RUN_INFO.md: the lines of that table only (up to the first
    line that is not a table row), and none from a table of another layout (an older RUN_INFO.md's columns)."""
    head = f"\n{COST_TABLE_HEAD[0]}\n{COST_TABLE_HEAD[1]}\n"
    if not previous or head not in previous:
        return []
    rows = []
    for line in previous.split(head, 1)[1].split("\n"):
        if not line.startswith("| "):
            break
        rows.append(line)
    return rows


def with_earlier_costs(here: list[str], previous: str | None) -> list[str]:
    """The per-run cost table: the rows of the runs whose folders are here (per_run_costs), and the rows of an
    earlier RUN_INFO.md for the runs whose folders are not (trained in an earlier part of the plan or on another
    machine, their rows committed): a plan finished across machines keeps what every run cost."""
    def run_of(row: str) -> str:
        return row.split("|")[1].strip()

    names = {run_of(row) for row in here[2:]}
    rows = here[2:] + [row for row in earlier_cost_rows(previous) if run_of(row) not in names]
    if not rows:
        return ["(no run folders here, and no earlier table)"]
    return [*COST_TABLE_HEAD, *sorted(rows, key=run_of)]


def driver_of(start: dict) -> str:
    """The script an invocation ran, from its logged command line (`python scripts/tasks.py --jobs 2`)."""
    words = start.get("argv", "").split()
    return next((w for w in words if w.endswith(".py")), "scripts/reproduce.py")


def run_info(experiment: str, log_path: Path, runs_dir: Path, previous: str | None = None) -> str:
    """RUN_INFO.md from every invocation in the run log: how the folder was made, and what each run cost (from
    runs_dir, and for the runs not there the rows of `previous`, the RUN_INFO.md this one replaces)."""
    events = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    starts = [e for e in events if e["event"] == "start"]
    drivers = sorted({driver_of(e) for e in starts}) or ["scripts/reproduce.py"]
    lines = [f"# How results/{experiment}/ was made", "",
             f"Written by {' and '.join(f'`{d}`' for d in drivers)} after every step, from `{RUN_LOG}` (every "
             f"invocation appends to it). {len(starts)} invocation(s); a step that found its cells done takes seconds "
             "and is counted, not listed.",
             "", "| started | invocation | hardware | HEAD at start | OMP_NUM_THREADS | jobs | data |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {e['time']} | `{e.get('argv', '-')}` | {e['hardware']} | {e['head']} | {e['omp']} | {e.get('jobs', 1)} "
              f"| {e['data']} |" for e in starts]
    lines += ["", "| invocation started | step | command | commit | threads | wall time | outcome |",
              "|---|---|---|---|---|---|---|"]
    # steps begun and not yet ended, by name, with the invocation (its start time) that began them and the index of
    # their begin: invocations may overlap (two drivers on one folder), so an end belongs to the latest begin of its
    # step, whoever started since. Rows in log order: a finished step where it ended, a stopped one where the next
    # invocation started after it began (or at the end).
    invocation, begun, skipped, total, rows = "", {}, 0, 0.0, []
    starts = [i for i, e in enumerate(events) if e["event"] == "start"]

    def stopped(b, started, at):  # a step begun and not ended: stopped (killed, machine gone) when a later
        # invocation started after it, else it may still be running
        after = next((i - 0.5 for i in starts if i > at), None)
        outcome = "stopped before it ended" if after is not None else "not ended when this was written"  # or running
        rows.append((len(events) if after is None else after,
                     f"| {started} | {b['step']} | `{b['command']}` | {b['commit']} | {b.get('threads') or '-'} | "
                     f"- | {outcome} |"))

    for i, e in enumerate(events):
        if e["event"] == "start":
            invocation = e["time"]
        elif e["event"] == "begin":
            if e["step"] in begun:  # begun again: the earlier attempt never ended
                stopped(*begun[e["step"]])
            begun[e["step"]] = (e, invocation, i)
        elif e["event"] == "skipped":
            skipped += 1
        elif e["event"] == "end" and e["step"] in begun:
            (b, started, _), total = begun.pop(e["step"]), total + e["seconds"]
            if e["seconds"] < STEP_SHOWN_S and e["status"] == 0:
                skipped += 1
                continue
            outcome = step_outcome(e["status"])
            rows.append((i, f"| {started} | {e['step']} | `{b['command']}` | {b['commit']} | {b.get('threads') or '-'} | "
                            f"{e['seconds']:.0f} s | {outcome} |"))
    for open_step in list(begun.values()):
        stopped(*open_step)
    lines += [line for _, line in sorted(rows, key=lambda r: r[0])]
    lines += ["", f"Steps that found their cells done: {skipped}. Wall time of all logged steps: {total / 3600:.1f} h "
              f"(steps stopped before they ended are not counted; their runs resume from their last checkpoint).", "",
              "Cost of each run, over every invocation (training: the segments in its status.json; ≥: a segment trained "
              "before they were recorded; evaluation and probes: the wall_s of its rows):", ""]
    here = per_run_costs(runs_dir, log_path.parent) if runs_dir.is_dir() else list(COST_TABLE_HEAD)
    return "\n".join(lines + with_earlier_costs(here, previous)) + "\n"


def write_run_info(experiment: str, log_path: Path, runs_dir: Path) -> Path:
    """RUN_INFO.md beside the log, the cost rows of its runs not here kept from the one it replaces."""
    path = log_path.parent / "RUN_INFO.md"
    previous = path.read_text() if path.is_file() else None
    atomic_write_text(path, run_info(experiment, log_path, runs_dir, previous))  # the only record of earlier parts
    return path


def run_logged(name: str, steps: list[Step], jobs: int, runs_dir: Path, data: str, invocation: list[str],
               after_step=None, start_until: float | None = None) -> list[str]:
    """run_steps with the record of how results/<name>/ was made: the invocation's start (hardware, HEAD, data,
    threads, jobs, command line), each step's begin and end in RUN_LOG.jsonl, RUN_INFO.md rebuilt after every step
    (then after_step(), if given); each step's output in logs/<name>/ when jobs > 1. The names of failed steps."""
    log_path = ROOT / "results" / name / RUN_LOG
    log_event(log_path, event="start", hardware=hardware(), head=head_commit(), data=data,
              omp=os.environ.get("OMP_NUM_THREADS", "unset (torch default)"), jobs=jobs, argv=shlex.join(invocation))
    logs = ROOT / "logs" / name  # git-ignored

    def begin(step: Step, threads: str | None) -> None:
        print(f"\n=== {step.name}: {shlex.join(step.command)}"
              f"{f' (output: {(logs / log_name(step)).relative_to(ROOT)})' if jobs > 1 else ''}", flush=True)
        shown = shlex.join(["python", *step.command[1:]]).replace(str(ROOT) + "/", "")
        log_event(log_path, event="begin", step=step.name, command=shown, commit=head_commit(),
                  threads=threads or "torch default")

    def end(step: Step, status: int, seconds: float) -> None:
        log_event(log_path, event="end", step=step.name, seconds=round(seconds, 1), status=status)
        write_run_info(name, log_path, runs_dir)
        if after_step is not None:
            after_step()
        if jobs > 1:
            print(f"=== {step.name}: {step_outcome(status)} after {seconds:.0f} s", flush=True)

    def skip(step: Step) -> None:  # done() found nothing left to do: no process, no rebuilt RUN_INFO.md
        print(f"=== {step.name}: nothing left to train or score; skipped", flush=True)
        log_event(log_path, event="skipped", step=step.name)

    return run_steps(steps, jobs, ROOT, logs, begin, end, skip, start_until)


def drive(script: str, folder: str, steps: list[Step], args, data, argv=None, after_step=None) -> None:
    """A plan driver's main (scripts/<script>, make reproduce / make tasks): --dry-run prints the steps, --status
    what is finished, --report-only rebuilds RUN_INFO.md (then after_step()), else run_logged() runs them, with
    data() describing the data they read; failed steps end it with one line that says how to finish."""
    if args.dry_run:
        print("\n".join(f"{step.name}: {shlex.join(step.command[1:])}" for step in steps))
        return
    if args.status:
        print(plan_status(steps, ROOT))
        return
    runs_dir = ROOT / args.runs / folder
    if args.report_only:
        print(f"wrote {write_run_info(folder, ROOT / 'results' / folder / RUN_LOG, runs_dir)}")
        if after_step is not None:
            after_step()
        return
    shown = argv if argv is not None else sys.argv[1:]
    invocation = ["python", f"scripts/{script}", *shown]
    minutes = getattr(args, "stop_starting_after", None)
    start_until = None if minutes is None else time.time() + 60 * minutes
    if failed := run_logged(folder, steps, args.jobs, runs_dir, data(), invocation, after_step, start_until):
        sys.exit(f"error: step(s) {', '.join(repr(name) for name in failed)} failed; fix them and run "
                 f"`{shlex.join(invocation)}` again (finished runs and cells are kept and skipped)")
    print(f"\nwrote {ROOT / 'results' / folder / 'RUN_INFO.md'} and the tables")


def status(args: argparse.Namespace) -> str:
    """--status: a run whose every perplexity row is committed in results/<experiment>/ is finished (as
    --keep-committed skips it: it was trained elsewhere, a fresh clone has no folder of it); the other runs' train and
    evaluate steps as a restart would find them (steps.plan_status). Reads the committed CSV and composes no config
    for a committed run, so it answers in seconds."""
    args.keep_committed, committed = True, []
    steps = plan(args, committed)
    runs = len(committed) + sum(1 for step in steps if step.makes)
    head = (f"{len(committed)} of {runs} runs finished by their committed rows in results/{args.folder}/ (trained "
            f"elsewhere: no folder here; --keep-committed does not train them again)")
    return head + ("\n" + plan_status(steps, ROOT) if any(step.makes or step.needs for step in steps) else "")


def main(argv=None) -> None:
    args = arguments(argv)
    if args.status:
        print(status(args))
        return
    drive("reproduce.py", args.folder, plan(args), args, lambda: data_description(args.data), argv)


if __name__ == "__main__":
    main()
