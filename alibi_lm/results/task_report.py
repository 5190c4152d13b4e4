"""The report of a task suite's tasks.csv: tasks.md (per task, schemes x Lv tables of mean ± std over seeds,
beside the chance level; the passkey's depth grid; from retrieval.csv, attention on the copied token by distance
and each ALiBi head's reach beside its slope) and heatmaps (tasks-<task>.png, passkey-depth.png).

    python -m alibi_lm.results results/tasks      # rebuild it (make report EXPERIMENT=tasks)
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..checkpoint import atomic_write_text, folder_lock
from ..errors import UserError
from ..tasks import TASKS
from .learned_values import learned_section
from .markdown import cell_text, markdown_table
from .plots import pyplot, save_figure
from .retrieval_store import REACH_ATTENTION, RETRIEVAL_CSV, SOURCE_WINDOW, best_heads, read_retrieval, sloped_heads
from .store import scheme_order
from .task_claims import claim_lines
from .task_findings import comparison_note, comparison_rows, summary_line, task_metric
from .task_learning import learning_lines, over_training_figure, over_training_lines
from .task_store import OVER_TRAINING_CSV, TASKS_CSV, read_over_training, read_task_results

REPORT_FILES = ("tasks.md", "tasks-*.png")  # every file build_task_report writes matches one (a test says so)
METRIC_NAMES = {"token_acc": "answer-token accuracy (teacher forcing)", "exact": "exact match per sequence (teacher forcing)",
                "greedy": "exact match of greedy decoding"}


def scheme_label(position: str, positions: str) -> str:
    """rope, or rope+random for randomized positions (sorted right after its scheme)."""
    return position if positions == "sequential" else f"{position}+random"


def metric_table(df: pd.DataFrame, metric: str) -> str:
    """Schemes x eval lengths of one task's main cells: mean ± std over seeds, and the chance level."""
    lengths = sorted(df["eval_len"].unique())
    rows = []
    for label in scheme_order(df["label"].unique()):
        part = df[df["label"] == label]
        rows.append([label, *(cell_text(part.loc[part["eval_len"] == lv, metric]) for lv in lengths)])
    chance = "chance_token" if metric == "token_acc" else "chance_exact"
    rows.append(["*chance*", *(f"{df.loc[df['eval_len'] == lv, chance].mean():.2g}" for lv in lengths)])
    return markdown_table(["scheme \\ Lv", *map(str, lengths)], rows)


def depth_table(df: pd.DataFrame, label: str) -> str:
    """One scheme's passkey exact match, depth x Lv (mean over seeds)."""
    part = df[df["label"] == label]
    lengths = sorted(part["eval_len"].unique())
    rows = [[variant.removeprefix("depth="), *(cell_text(part.loc[(part["variant"] == variant)
                                                                  & (part["eval_len"] == lv), "exact"])
                                                 for lv in lengths)]
            for variant in sorted(part["variant"].unique())]
    return markdown_table(["depth \\ Lv", *map(str, lengths)], rows)


def retrieval_lines(ret: pd.DataFrame) -> list[str]:
    """One task's retrieval.csv rows: per scheme, each seed's best head's attention on the copied token by distance
    and its reach; answer accuracy by distance; every head of a scheme with per-head slopes (ALiBi), beside its slope."""
    if ret.empty:
        return []
    distances = sorted(int(d) for d in ret["distance"].unique())
    lines = ["### attention on the copied token, by distance t - s (retrieval.csv)\n",
             f"Each answer's attention on the token it copies (and its neighbours, s ± {SOURCE_WINDOW}, except the "
             f"query and the key before it), over Lv = L..16L; distance bins of powers of two (4: 4-7). Per scheme, "
             f"each seed's best head (the most attention summed over distances), its curve averaged over seeds, and "
             f"its reach: the largest distance bin where its attention is at least {REACH_ATTENTION} (0: none), mean ± "
             f"std over seeds.\n"]
    best_rows, accuracy_rows, slope_sections = [], [], []
    for label in scheme_order(ret["label"].unique()):
        part = ret[ret["label"] == label]
        best = best_heads(part)
        best_rows.append([label, ", ".join(best["head"]), *(f"{best[d].mean():.2f}" if d in best else "" for d in distances),
                          cell_text(best["reach"], 0)])
        answers = part[(part["layer"] == 0) & (part["head"] == 0)]  # token_acc repeats on every head's row
        right = (answers["token_acc"] * answers["answers"]).groupby(answers["distance"]).sum()
        accuracy = right / answers.groupby("distance")["answers"].sum()
        accuracy_rows.append([label, *(f"{accuracy[d]:.2f}" if d in accuracy else "" for d in distances)])
        slope_sections += slope_table(label, sloped_heads(part), distances)
    lines.append(markdown_table(["scheme", "best head per seed", *map(str, distances), "reach"], best_rows))
    lines += ["### answer-token accuracy by distance t - s (retrieval.csv)\n",
              "Teacher forcing, over the same answers (mean over Lv = L..16L and seeds).\n",
              markdown_table(["scheme", *map(str, distances)], accuracy_rows)]
    return lines + slope_sections


def slope_table(label: str, heads: pd.DataFrame, distances: list[int]) -> list[str]:
    """Every head with a slope m (retrieval.sloped_heads): its curve, reach and m x reach over seeds. With randomized
    positions the bias follows position gaps while distances count tokens: no m x reach."""
    if heads.empty:
        return []
    random = label.endswith("+random")
    rows = [[f"{layer}.{h}", f"1/{1 / heads.loc[(layer, h), 'slope'].mean():.3g}",
             *(f"{heads.loc[(layer, h), ('curve', d)]:.2f}" if ("curve", d) in heads else "" for d in distances),
             cell_text(heads.loc[(layer, h), "reach"], 0),
             "n/a" if random else cell_text(heads.loc[(layer, h), "slope_x_reach"])]
            for layer, h in heads.index]
    return [f"#### {label}: every head, beside its slope m (bias -m (i - j); learned slopes: mean over seeds)\n",
            markdown_table(["layer.head", "m", *map(str, distances), "reach", "m x reach"], rows)]


def task_section(df: pd.DataFrame, task: str, options: str, L: int, ret: pd.DataFrame | None = None) -> list[str]:
    name = task + (f" ({options})" if options else "")
    desc = TASKS[task].description if task in TASKS else ""
    main = df[df["variant"] == ""]
    seeds = main.groupby("label")["seed"].nunique()
    seed_range = f"{seeds.min()}" if seeds.min() == seeds.max() else f"{seeds.min()}-{seeds.max()}"
    lines = [f"## {name}, L = {L}\n", f"{desc}. Trained at lengths up to L; {int(main['examples'].max())} test "
             f"sequences per cell; seeds per scheme: {seed_range}.\n"]
    if main["exact"].notna().any():
        per_answer = task in TASKS and TASKS[task].answers_grow
        lines += learning_lines(main, L, scheme_order(main["label"].unique()), per_answer)
    for metric, title in METRIC_NAMES.items():
        if metric in main and main[metric].notna().any():
            lines += [f"### {title}\n", metric_table(main, metric)]
    grid = df[df["variant"].str.startswith("depth=")]
    for label in scheme_order(grid["label"].unique()):
        lines += [f"### {label}: exact match by needle depth (0 = first filler token, 1 = last)\n", depth_table(grid, label)]
    return lines + retrieval_lines(ret if ret is not None else pd.DataFrame())


def heatmap(df: pd.DataFrame, title: str, path: Path) -> None:
    """Schemes (rows) x Lv (columns), mean answer-token accuracy, annotated."""
    plt = pyplot()
    labels, lengths = scheme_order(df["label"].unique()), sorted(df["eval_len"].unique())
    grid = np.array([[df.loc[(df["label"] == s) & (df["eval_len"] == lv), "token_acc"].mean() for lv in lengths]
                     for s in labels])  # (schemes, lengths)
    fig, ax = plt.subplots(figsize=(1.1 * len(lengths) + 2.5, 0.42 * len(labels) + 1.4))
    ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
    for (i, j), v in np.ndenumerate(grid):
        if math.isfinite(v):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=8, color="w" if v < 0.6 else "k")
    ax.set_xticks(range(len(lengths)), [str(lv) for lv in lengths])
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("evaluation length Lv")
    ax.set_title(title, fontsize=10)
    save_figure(fig, path)


def depth_heatmaps(grid: pd.DataFrame, title: str, path: Path) -> None:
    """One panel per scheme: needle depth (rows) x Lv (columns), mean exact match."""
    plt = pyplot()
    labels = scheme_order(grid["label"].unique())
    depths, lengths = sorted(grid["variant"].unique()), sorted(grid["eval_len"].unique())
    cols = min(4, len(labels))
    rows = -(-len(labels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), squeeze=False)
    for ax, label in zip(axes.flat, labels):
        part = grid[grid["label"] == label]
        values = np.array([[part.loc[(part["variant"] == d) & (part["eval_len"] == lv), "exact"].mean()
                            for lv in lengths] for d in depths])  # (depths, lengths)
        ax.imshow(values, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        ax.set_title(label, fontsize=9)
        ax.set_xticks(range(len(lengths)), [str(lv) for lv in lengths], fontsize=7)
        ax.set_yticks(range(len(depths)), [d.removeprefix("depth=") for d in depths], fontsize=7)
    for ax in list(axes.flat)[len(labels):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    save_figure(fig, path)


def findings_lines(groups) -> list[str]:
    """The suite's questions on these rows (task_findings.py): per task, the schemes that solve it at the longest Lv
    (16L in the suite) over the seeds that learned it at L, and the best there, among the schemes with MIN_SEEDS
    learned seeds or more (the others named apart); then every comparison at 4L and 16L with its verdict, over the
    learned seeds and over all seeds."""
    learned, every, solved = [], [], []
    for (task, options, L), part in groups:
        main, name, metric = part[part["variant"] == ""], task + (f" ({options})" if options else ""), task_metric(task)
        learned += comparison_rows(main, name, int(L), metric, learned_only=True)
        every += comparison_rows(main, name, int(L), metric, learned_only=False)
        solved.append(summary_line(main, name, int(L), metric))
    if not any(solved):
        return []
    lines = ["## Findings on these rows\n", *filter(None, solved), ""]
    if learned:
        header = ["task", "question", "schemes", "4L", "at 4L", "16L", "at 16L"]
        lines += [comparison_note(), "### over the seeds that learned the task at L\n", markdown_table(header, learned),
                  "### over all seeds\n", markdown_table(header, every)]
    return lines


def build_task_report(results_dir: Path) -> list[Path]:
    """tasks.csv -> tasks.md and the heatmaps; the written paths."""
    results_dir, written = Path(results_dir), []
    csv_path = results_dir / TASKS_CSV
    if not csv_path.is_file():
        raise UserError(f"no {TASKS_CSV} in {results_dir}/; evaluate a task run first (python -m alibi_lm.eval run=...)")
    with folder_lock(results_dir):
        df = read_task_results(csv_path)
        if df.empty:
            raise UserError(f"{csv_path} has no rows; evaluate a task run first")
        df["label"] = [scheme_label(p, q) + (f"+{m}" if m else "")  # an extension's rows: a scheme of their own
                       for p, q, m in zip(df["position"], df["positions"], df["rope_scaling"])]
        lines = [f"# {results_dir.name}: synthetic tasks, answer accuracy at Lv = L..16L\n",
                 "Mean ± std over seeds (n = seeds). Rows with +random trained (and are scored) with randomized "
                 "positions. Rows: tasks.csv, with each cell's command, commit, device and wall time.\n"]
        ret = read_retrieval(results_dir / RETRIEVAL_CSV)
        over = read_over_training(results_dir / OVER_TRAINING_CSV)
        over["label"] = [scheme_label(p, q) for p, q in zip(over["position"], over["positions"])]
        ret["label"] = [scheme_label(p, q) for p, q in zip(ret["position"], ret["positions"])]
        order = [t for t in TASKS if t in set(df["task"])] + sorted(set(df["task"]) - set(TASKS))
        groups = sorted(df.groupby(["task", "task_options", "train_len"]),
                        key=lambda g: (order.index(g[0][0]), g[0][1], g[0][2]))
        lines += findings_lines(groups) + claim_lines(groups)
        for (task, options, L), part in groups:
            same = (ret["task"] == task) & (ret["task_options"] == options) & (ret["train_len"] == L)
            lines += task_section(part, task, options, int(L), ret[same])
            stem = f"tasks-{task}" + (f"-{options}" if options else "") + f"-L{int(L)}"
            stem = stem.replace(";", "-").replace("=", "")
            kept = over[(over["task"] == task) & (over["task_options"] == options) & (over["train_len"] == L)]
            if not kept.empty:
                metric = "token_acc" if task in TASKS and TASKS[task].answers_grow else "exact"
                over_training_figure(kept, f"{task} {options} (L = {int(L)}): over training",
                                     results_dir / f"{stem}-over-training.png", metric)
                written.append(results_dir / f"{stem}-over-training.png")
                lines += over_training_lines(kept, int(L), f"{stem}-over-training.png", metric)
            heatmap(part[part["variant"] == ""], f"{task} {options} (L = {int(L)}): answer-token accuracy",
                    results_dir / f"{stem}.png")
            written.append(results_dir / f"{stem}.png")
            grid = part[part["variant"].str.startswith("depth=")]
            if not grid.empty:
                depth_heatmaps(grid, f"{task} (L = {int(L)}): exact match by depth x Lv", results_dir / f"{stem}-depth.png")
                written.append(results_dir / f"{stem}-depth.png")
        lines += learned_section(results_dir, label=lambda row: scheme_label(row["position"], row["positions"]))
        atomic_write_text(results_dir / "tasks.md", "\n".join(lines))
        written.insert(0, results_dir / "tasks.md")
    return written
