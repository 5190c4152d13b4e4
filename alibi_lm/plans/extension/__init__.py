"""The extension comparison: every training-free method on every trained scheme it fits, beside short fine-tunes and
a reference trained from scratch -> results/extension/.

    python scripts/extension.py --seeds 0,1,2 --dry-run   # what is missing and an estimate of its time
    python scripts/extension.py --seeds 0,1,2             # train what is missing, score it, then the report
    python scripts/extension.py --task-runs 'runs/tasks/passkey-*'   # also passkey exact match on task models
    python scripts/extension.py --report-only             # rebuild README.md, the plots and sinks' summary from the rows

The runs (runs.py) are the small models of `python -m alibi_lm.train experiment=demo name=extension position=<scheme>
seed=<s> train.max_steps=300` (runs/extension/<scheme>-L64-seed<s>/); for each scheme and each --finetune-seeds seed
its fine-tunes at s L (s = 2, 4) for 1%, 5% and 12.5% of its tokens (RoPE's with Position Interpolation, the others as
they are); for each --reference-schemes scheme a reference trained from scratch at 4L with the same total tokens.
Each is trained here when missing (a fresh process each, one at a time, resumable), scheme by scheme in the order of
--schemes. Scoring (scoring.py): each run at L..16L with no method and, a base run, each method that fits its scheme,
with key-token perplexity, into extrapolation.csv, and by the passkey probe into passkey.csv; trained task models
(--task-runs, tasks.py) by the task evaluation into tasks.csv (skip_done everywhere: a killed sweep resumes). The
report (report.py, tables.py, answers.py, claims.py): README.md with the commands, commits, hardware and wall time the
rows record, scheme x method x Lv tables (mean ± sd over seeds), findings with 95% intervals, which column uses
4L-16L and how the training-free methods stand against the fine-tunes (paired by seed), what the rows say beside each
published claim, the refusals, one
plot per metric, and sinks.csv (attention mass on the first tokens at L and 16L, with and without streaming).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ...cli import number, one_line_errors
from ...errors import ArgumentParser, UserError
from ...positions import POSITION_SCHEMES
from ...provenance import command_line
from ..driver import repeated
from .plan import dry_run
from .report import report
from .runs import BASE_L, SCHEMES, Job, completed, jobs, stale_runs, train
from .scoring import evaluate, passkey, sink_rows
from .tasks import TASK_EXAMPLES, score_task_run, task_runs

REFERENCE_SCHEMES = ("alibi", "rope")


def run_all(wanted: list[Job], runs_dir: Path, results: Path, max_tokens: int) -> list[Path]:
    """Train, score and probe each wanted run in turn; a folder not to be reused stops everything first."""
    if stale := stale_runs(wanted, runs_dir):
        more = f" (and {len(stale) - 1} more: --dry-run lists them)" if len(stale) > 1 else ""
        raise UserError(stale[0] + more)
    for job in wanted:
        run = job.folder(runs_dir)
        if not completed(run):
            train(job, runs_dir)
        evaluate(run, BASE_L, results, max_tokens)
        passkey(run, BASE_L, results)
    return [job.folder(runs_dir) for job in wanted]


def seed_list(text: str) -> list[int]:
    try:
        seeds = [int(v) for v in text.split(",") if v != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes seeds separated by commas (0,1,2), got {text!r}") from None
    return once(seeds, text)


def scheme_list(text: str) -> list[str]:
    names = [n for n in text.split(",") if n != ""]
    if unknown := [n for n in names if n not in POSITION_SCHEMES]:
        raise argparse.ArgumentTypeError(f"unknown scheme {unknown[0]!r}; known: {', '.join(POSITION_SCHEMES)}")
    return once(names, text)


def once(entries: list, text: str) -> list:
    """The entries of a comma list, refused when one is given twice (its runs would be trained and scored twice)."""
    if (twice := repeated(entries)) is not None:
        raise argparse.ArgumentTypeError(f"names {twice} twice in {text!r}; give each entry once")
    return entries


def parse(argv) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))  # its first paragraph
    parser.add_argument("--runs", default="runs/extension", help="the trained runs' folder")
    parser.add_argument("--results", default="results", help="results root: rows go to <results>/extension/")
    parser.add_argument("--max-tokens", type=number(int, 1), default=16384, help="targets scored per length (eval.max_tokens)")
    parser.add_argument("--schemes", type=scheme_list, default=list(SCHEMES),
                        help=f"schemes to train and score, in this order (default: {','.join(SCHEMES)})")
    parser.add_argument("--seeds", type=seed_list, default=[0], help="seeds of each scheme, e.g. 0,1,2 (default 0)")
    parser.add_argument("--finetune-seeds", type=seed_list, default=[0],
                        help="seeds whose runs are fine-tuned, among --seeds (default 0; '' for none)")
    parser.add_argument("--reference-schemes", type=scheme_list, default=None,
                        help=f"schemes of --schemes with a reference from scratch at 4L, seed 0 (default: those of "
                             f"{','.join(REFERENCE_SCHEMES)} among --schemes)")
    parser.add_argument("--task-runs", help="trained synthetic-task runs to score with each method: a run folder, a "
                        "folder of them, or a glob (read only; rows into <results>/extension/tasks.csv)")
    parser.add_argument("--task-examples", type=number(int, 1), default=TASK_EXAMPLES, help="sequences per task cell")
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--dry-run", action="store_true", help="print what is missing and its estimated time; do nothing")
    modes.add_argument("--report-only", action="store_true", help="rebuild the report from the rows; train and score nothing")
    args = parser.parse_args(argv)
    if extra := sorted(set(args.finetune_seeds) - set(args.seeds)):
        parser.error(f"--finetune-seeds {extra[0]} is not among --seeds {args.seeds}: its run would not be trained")
    if args.reference_schemes is None:
        args.reference_schemes = [s for s in REFERENCE_SCHEMES if s in args.schemes]
    if extra := [s for s in args.reference_schemes if s not in args.schemes]:
        parser.error(f"--reference-schemes {extra[0]} is not among --schemes {','.join(args.schemes)}: its reference "
                     f"would not be trained; add it to --schemes or leave it out")
    return args


def main(argv=None) -> None:
    args = parse(argv)
    started, results, runs_dir = time.time(), Path(args.results), Path(args.runs)
    wanted = jobs(args.schemes, args.seeds, args.finetune_seeds, args.reference_schemes)
    with one_line_errors():  # a failed training or a damaged table: one line, the rows written so far kept
        tasks = task_runs(args.task_runs) if args.task_runs else []
        if args.dry_run:
            dry_run(wanted, runs_dir, results, tasks, args.task_examples)
            return
        if not args.report_only:
            runs = run_all(wanted, runs_dir, results, args.max_tokens)
            for run in tasks:
                score_task_run(run, results, args.task_examples)
            sink_rows(runs, results, 4096).to_csv(results / "extension" / "sinks.csv", index=False)
        report(results, command_line(), None if args.report_only else started, runs_dir)
