"""results/extension/README.md from the comparison's rows: the command, commits, hardware and wall time they record,
the runs and how they were trained, the tables (tables.py), the passkey on the task models (tasks.py), the findings,
the published claims they stand beside, the refusals; and one plot per metric (comparison-<metric>.png)."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pandas as pd

from ...checkpoint import read_status
from ...errors import UserError
from ...probes import report as probes_report
from ...provenance import hardware
from ...results import store
from ...results.markdown import markdown_table
from ...results.task_learning import EFFECTIVE_SHARE
from ...results.task_store import TASKS_CSV, read_task_results
from ...subjects.native import read_finetune_record
from .answers import CONTEXT_USE_TEXT, context_use_table, versus_finetune_table
from .claims import claim_lines
from .runs import FINETUNE_SCALING, TRAINING_COMMANDS
from .scoring import PASSKEY, SINK_TOKENS
from .tables import comparison, findings, paired_findings, passkey_tables, plot, refusals, sinks_table
from .tasks import TASK_EXAMPLES, task_table


def provenance_table(tables: dict[str, pd.DataFrame]) -> str:
    """Which rows came from which commit: per table and commit, the rows and the schemes with their seeds."""
    rows = []
    for name, df in tables.items():
        if df.empty:
            continue
        for commit, part in df.groupby(df["commit"].astype(str)):
            seeds = part.groupby("position")["seed"].unique()
            schemes = ", ".join(f"{s} ({','.join(str(int(v)) for v in sorted(seeds[s]))})"
                                for s in store.scheme_order(seeds.index))
            rows.append([name, commit, str(len(part)), f"{part['wall_s'].sum() / 60:.0f}", schemes])
    return markdown_table(["table", "commit", "rows", "scoring min (wall_s)", "schemes (seeds)"], rows)


def budget_text(run: Path) -> str:
    """A fine-tune's budget and rescaling, from its finetune.json ('' for a run trained from scratch)."""
    tuned = read_finetune_record(run)
    if not tuned:
        return ""
    rescaled = f", {tuned['rescaling']} x{tuned['scale']:g}" if tuned.get("rescaling") else ", as is"
    return f"{tuned['fraction']:g} of {tuned['parent_tokens']:,} tokens: {tuned['steps']} steps{rescaled}"


def runs_table(runs_dir: Path) -> str:
    """Each run: its training time, commits and validation perplexity at its L; a fine-tune's budget and rescaling."""
    rows = []
    for run in sorted(p for p in runs_dir.glob("*-L*-seed*") if read_status(p).get("status") == "completed"):
        status = read_status(run)
        rows.append([run.name, f"{status.get('train_seconds', math.nan) / 60:.1f}", f"{status.get('val_ppl', math.nan):.1f}",
                     ", ".join(status.get("train_commits", [])), budget_text(run)])
    return markdown_table(["run", "train min", "val ppl at its L", "commits", "fine-tune budget"], rows)


RUNS_HEADER = "| run | train min |"


def recorded_runs_table(readme: Path) -> str:
    """The runs table of an existing README.md (the lines from RUNS_HEADER to the first that is no table row), for
    a report rebuilt where the run folders are not (a fresh clone): the runs' times and commits are recorded only
    there; "(run folders not on this machine)" where there is none."""
    lines = readme.read_text().splitlines() if readme.is_file() else []
    start = next((i for i, line in enumerate(lines) if line.startswith(RUNS_HEADER)), None)
    if start is None:
        return "(run folders not on this machine)\n"
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end]) + "\n"


def absent_runs(df: pd.DataFrame) -> list[str]:
    """A line naming the runs with rows here whose folders this checkout lacks (trained in another checkout)."""
    missing = sorted({r for r in df["run"].dropna().astype(str) if not Path(r).is_dir()})
    if not missing:
        return []
    return [f"Rows of runs whose folders are not in this checkout (trained in another; their training commits are not "
            f"listed above, their rows' commits are in the provenance table): {', '.join(missing)}.\n"]


COLUMNS_TEXT = (
    "Columns (method): `none`, each training-free method, `ft<s>x<f>` a short fine-tune of the seed's run at s L for "
    "the fraction f of its training tokens, as it is, except RoPE's: " + ", ".join(
        f"`ft<s>x<f>-{how}` ({scheme} fine-tuned with its rescaling {how} at factor s, which every later load of the run "
        f"applies)" for scheme, how in FINETUNE_SCALING.items()) + "; `scratch<s>x` the reference trained from scratch "
    "at s L with the tokens of the base run plus its largest fine-tune, scored at the same Lv.\n")

PASSKEY_INTRO = (
    f"\n## Passkey retrieval\n\nThe passkey probe (alibi_lm/probes/passkey_probe.py) with each method: "
    f"{PASSKEY['trials']} prompts per (Lv, depth), depths {PASSKEY['depths']}, the probe's default texts (a 5-digit "
    f"key, the paper's filler). Teacher-forced accuracy on the key's digits, mean over depths, then mean ± sd over "
    f"seeds; at L the no-key control (the same prompt without the key statement) and the key's log-probability gain "
    f"over it; the relative effective length per seed (NoLiMa: the longest Lv up to which the accuracy keeps 85% of "
    f"its value at L; n/a where it is 0 at L).\n")


VERSUS_TEXT = (
    "Per scheme at 4L and 16L: the mean perplexity with no method, of the training-free method with the lowest mean, "
    "of the largest fine-tune at 4L and of the reference from scratch at 4L; then the fine-tune minus that method and "
    "minus no method, paired by seed, with 95% t intervals (a verdict only where the interval excludes 0). The method "
    "is chosen by its mean on these same rows, so its interval is a little optimistic for it.\n")

CLAIMS_TEXT = (
    "Each claim as its source states it, then what these rows say on the same question and whether it points the "
    "same way (computed by alibi_lm/plans/extension/claims.py from the rows above; the reason for a difference is "
    "given only where there is one).\n")


def tasks_intro(df: pd.DataFrame) -> str:
    examples = sorted({int(v) for v in df["examples"].dropna()}) if len(df) else [TASK_EXAMPLES]
    return (f"\n## Passkey on the task models (tasks.csv)\n\nThe WikiText-2 models above retrieve no key at any length "
            f"(their effective length is n/a everywhere). These are synthetic-task runs that learned the passkey at L "
            f"(--task-runs, trained by the task suite), scored by its task evaluation with no method and each method "
            f"their scheme takes: teacher-forced exact match of the key, {', '.join(map(str, examples))} test "
            f"sequences per cell (the same for every run), mean over seeds [Wilson 95% interval of the pooled "
            f"sequences, or the t interval over seeds where wider]; the relative effective length is the longest Lv "
            f"up to which the mean keeps {EFFECTIVE_SHARE:.0%} of its value at L (results.task_learning's rule; n/a "
            f"where it is 0 at L).\n")


def header(tables: dict[str, pd.DataFrame], command: str, started: float | None) -> list[str]:
    """The page's provenance: commands, commits per row group, hardware, wall time, seeds per scheme."""
    seeds = tables["extrapolation.csv"].groupby("position")["seed"].nunique()
    intervals = "mean ± sd (n seeds) in the tables; 95% t intervals over seeds in the findings, where n >= 2"
    return ["# Training-free extension past L, every scheme it fits\n",
            f"Rows made by `python scripts/extension.py` (alibi_lm/plans/extension/), this page by `{command}`"
            + (f" (this invocation {(time.time() - started) / 60:.0f} min)" if started else "") + f"; hardware: "
            f"{hardware()}. Rows by commit (a commit marked 'with uncommitted changes' was scored from a working tree "
            f"that differed from it):\n", provenance_table(tables),
            "\nSeeds per scheme: " + ", ".join(f"{s} {n}" for s, n in seeds.items()) + f" ({intervals}).\n"]


def report(results: Path, command: str, started: float | None, runs_dir: Path = Path("runs/extension")) -> None:
    out = results / "extension"
    df = store.read_results(out / store.CSV_NAME)
    if df.empty:
        raise UserError(f"{out / store.CSV_NAME} has no rows yet: run the comparison (without --report-only) first")
    passkey_df = probes_report.read_table(out / probes_report.PASSKEY_CSV)
    tasks_df = read_task_results(out / TASKS_CSV)
    alpha, beta = (df[c].dropna().unique().tolist() for c in ("longppl_alpha", "longppl_beta"))
    sections = [*header({"extrapolation.csv": df, "passkey.csv": passkey_df, TASKS_CSV: tasks_df}, command, started),
                "## Runs\n", "Trained by:\n", *[f"    {c}" for c in TRAINING_COMMANDS], "",
                runs_table(runs_dir) if runs_dir.is_dir() else recorded_runs_table(out / "README.md"),
                *absent_runs(df), COLUMNS_TEXT, "## Perplexity\n", comparison(df, "ppl"),
                f"\n## Key-token perplexity (LongPPL, the model as its own evaluator, alpha = {alpha}, beta = {beta})\n",
                comparison(df, "key_ppl"), "\n## Key tokens (count)\n", comparison(df, "key_tokens"),
                PASSKEY_INTRO, passkey_tables(passkey_df), tasks_intro(tasks_df), task_table(tasks_df),
                f"\n## Attention on the first {SINK_TOKENS} tokens (sinks.csv: per layer and head)\n",
                sinks_table(out / "sinks.csv"),
                "\n## Findings (perplexity; computed from the rows above)\n",
                *[f"- {line}" for line in findings(df)], *[f"- {line}" for line in paired_findings(df)],
                "\n## Which column uses 4L-16L\n", CONTEXT_USE_TEXT, context_use_table(df),
                "\n## Training-free methods against short fine-tuning\n", VERSUS_TEXT, versus_finetune_table(df),
                "\n## Published claims beside these rows\n", CLAIMS_TEXT,
                *[f"- {line}" for line in claim_lines(df, tasks_df)],
                "\n## Refused\n",
                *([f"- {why}" for why in refusals(sorted(set(df["position"].str.split("+").str[0])))]
                  or ["- nothing: every scored scheme takes every method"])]
    (out / "README.md").write_text("\n".join(sections))
    for metric in ("ppl", "key_ppl"):
        plot(df, metric, out / f"comparison-{metric}.png")
