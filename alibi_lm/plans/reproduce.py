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

"Every scheme" is every registered one plus the variants of alibi_lm/plans/variants.py (fox+rope, iRoPE with and
without a window, Scalable-Softmax, QK-norm, learned ALiBi slopes). Every step is resumable: trained runs are
skipped, evaluated cells are not re-scored, so an interrupted reproduction started again finishes only what is
missing. With --keep-committed, a run whose folder is not here but whose rows are all in the committed results
(trained on another machine) is not trained again, unless --retrain names its scheme (its rows are stale): how a
reproduction is finished on another machine without replacing what is done. --jobs 2 runs two steps at once (an
evaluation starts once its run is trained; the report waits for all): plans/steps.py.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import sys
from pathlib import Path

from hydra.errors import HydraException
from omegaconf import OmegaConf

from alibi_lm.config import CONFIG_DIR, DataConfig
from alibi_lm.data import local_checksums
from alibi_lm.positions import POSITION_SCHEMES
from alibi_lm.positions.rope import ROPE_SCALINGS
from alibi_lm.provenance import HASH_COLUMNS

from ..cli import describe, number, number_list
from ..errors import ArgumentParser, UserError
from ..labels import CUSTOM_MARK
from . import checkout_root
from .driver import add_modes, add_precision, add_start_limit, comma_lists, drive, precision_override, repeated
from .steps import Step, plan_status, trained_run_finished
from .variants import VARIANTS, check_extra, experiment_model, overrides, run_label

ROOT = checkout_root()  # results/, runs/


def data_description(data: str) -> str:
    """Which copy of the data set the runs read: the sha256 of each local split file, or the hub's name."""
    cfg = DataConfig(**OmegaConf.to_container(OmegaConf.load(Path(CONFIG_DIR, "data", f"{data}.yaml"))))
    checksums = local_checksums(cfg)
    if checksums is None:
        return f"{cfg.hub_path} ({cfg.hub_config_name}) through `datasets`"
    shas = ", ".join(f"{split} {sha[:16]}" for split, sha in checksums.items())
    return f"{data}, local copy ({shas}: sha256 of each split's file, first 16 hex digits)"


def arguments(argv=None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiment", default="cpu-wt2")
    p.add_argument("--data", default="wikitext2")
    every = ",".join([*POSITION_SCHEMES, *VARIANTS])
    p.add_argument("--schemes", default=every, help="default: every registered scheme and variant (alibi_lm/plans/variants.py)")
    p.add_argument("--seq-len", type=number(int, 1), default=128, help="L of the all-schemes sweep")
    p.add_argument("--seeds", type=number_list(int, 0), default="0", help="seeds of every scheme")
    p.add_argument("--more-seeds", type=number_list(int, 0), default="1,2",
                   help="further seeds for --seed-schemes (mean ± std in the table)")
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
    p.add_argument("--other-lengths", type=number_list(int, 1), default="32,64", help="extra L for --length-schemes (Table 5)")
    p.add_argument("--multipliers", type=number_list(float, 1), default="1,2,4,8,16", help="Lv = k x L for every run")
    p.add_argument("--max-tokens", type=number(int, 1), default=8192000,
                   help="training tokens of every run (4000 steps of 2048 tokens, 4 epochs of WikiText-2; "
                        "make budget-probes sets 1, 4 and 8 epochs side by side in results/probes/)")
    p.add_argument("--tokens-per-step", type=number(int, 1), default=2048, help="batch size = this / L, at every L")
    p.add_argument("--sliding-stride", type=number(int, 1), default=16)
    p.add_argument("--sliding-tokens", type=number(int, 1), default=32768, help="tokens of the split scored with sliding windows")
    p.add_argument("--rope-scalings", default=",".join(ROPE_SCALINGS),
                   help="RoPE extensions evaluated on the rope runs at L ('' for none)")
    p.add_argument("--context-probes", default=True, action=argparse.BooleanOptionalAction,
                   help="passkey + context-use probes of every scheme's run at L (docs/probes.md)")
    p.add_argument("--runs", default="runs", help="paths.runs (run folders; relative to the repository root)")
    p.add_argument("--extra", nargs="*", default=[], help="more Hydra overrides for every run")
    add_precision(p)
    p.add_argument("--jobs", type=number(int, 1), default=1, help="steps run at once, the cores split between them (on 2 cores, "
                   "--jobs 2 trains ~1.3x faster in total; each step's output then goes to logs/<experiment>/)")
    add_modes(p, dry_run="print the steps' commands and exit",
              status="run nothing: how many steps are finished, which are left",
              report_only="run nothing: rebuild RUN_INFO.md from RUN_LOG.jsonl and the run folders (without them, "
                          "its per-run cost table is kept)")
    add_start_limit(p)
    args = p.parse_args(argv)
    own_folder(args, p)
    comma_lists(p, args, ("schemes", "seeds", "more_seeds", "seed_schemes", "length_schemes", "other_lengths",
                          "multipliers", "rope_scalings", "bca_schemes", "temperature_schemes", "retrain"))
    seeded = any(s in args.schemes for s in args.seed_schemes)  # --more-seeds train only for these
    if seeded and (both := repeated([*args.seeds, *args.more_seeds])) is not None:
        p.error(f"seed {both} is in --seeds and in --more-seeds: its runs would train twice; give it in one of them")
    for key in ("schemes", "seed_schemes", "length_schemes", "bca_schemes", "temperature_schemes", "retrain"):
        if unknown := [s for s in getattr(args, key) if s not in POSITION_SCHEMES and s not in VARIANTS]:
            p.error(f"unknown --{key.replace('_', '-')} {unknown}; choose from {every}")
    if not (args.schemes and args.seeds and args.multipliers):
        p.error("--schemes, --seeds and --multipliers need at least one entry each")
    check_plan_values(p, args)
    try:  # composed now, so that an unknown experiment is one line before any step, not Hydra's traceback
        experiment_model(args.experiment)
    except (HydraException, UserError) as e:
        p.error(f"--experiment {args.experiment}: {describe(e)}")
    check_extra(p, args.schemes, args.experiment, args.seq_len, args.extra)
    return args


def check_plan_values(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """parser.error for values that would fail only once steps ran (a batch of 0 sequences at the first step, an
    unknown rescaling after every run is trained): the data set, the tokens per step at each L trained, the stride,
    the RoPE rescalings."""
    datasets = sorted(path.stem for path in Path(CONFIG_DIR, "data").glob("*.yaml"))
    if args.data not in datasets:
        p.error(f"unknown --data {args.data!r}; choose from {','.join(datasets)}")
    lengths = sorted({args.seq_len, *(map(int, args.other_lengths) if args.length_schemes else [])})  # trained
    if args.tokens_per_step < lengths[-1]:
        p.error(f"--tokens-per-step {args.tokens_per_step} is below L={lengths[-1]}: a batch of tokens per step / L "
                f"sequences would hold none; give at least {lengths[-1]}")
    if args.sliding_stride > args.seq_len:  # the sliding evaluation scores the runs at --seq-len
        p.error(f"--sliding-stride {args.sliding_stride} exceeds L={args.seq_len}, the shortest window it scores; "
                f"give at most {args.seq_len}")
    if unknown := [s for s in args.rope_scalings if s not in ROPE_SCALINGS]:
        p.error(f"unknown --rope-scalings {unknown}; choose from {','.join(ROPE_SCALINGS)} ('' for none)")


# Options that change what is trained or how it is scored: the committed results/<experiment>/ holds the
# defaults' rows, so a run with other values (a cheap trial) gets an experiment folder of its own.
SETTINGS = ("data", "seq_len", "max_tokens", "tokens_per_step", "sliding_stride", "sliding_tokens", "extra")


def own_folder(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Rename the experiment (runs/ and results/) to <experiment>-custom-<digest> when a setting differs from
    the default, so that a trial never replaces the committed rows it would be mistaken for."""
    changed = {k: getattr(args, k) for k in SETTINGS if getattr(args, k) != parser.get_default(k)}
    args.folder = args.experiment  # runs/<folder>/, results/<folder>/ (the runs' name=)
    if changed:
        digest = hashlib.sha256(json.dumps(changed, sort_keys=True).encode()).hexdigest()[:8]
        shown = ", ".join(f"--{k.replace('_', '-')}={v}" for k, v in changed.items())
        args.folder = f"{args.experiment}{CUSTOM_MARK}{digest}"
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
        # results/<folder>/ for a trial's folder too: another folder than the experiment's own goes beside the runs
        own = [] if args.folder == args.experiment else ["paths.results=results"]
        self.common = [f"experiment={args.experiment}", f"name={args.folder}", *own, f"data={args.data}",
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
