"""The long plans: many train / evaluate / probe steps run as processes, resumable and committed in parts.

steps.py          running a plan's steps, --jobs at a time, in dependency order (a step per process)
run_record.py     how a plan's folder was made: RUN_LOG.jsonl (every invocation and step) and RUN_INFO.md from it
driver.py         what every plan driver shares: --precision, --stop-starting-after, and drive(), its main
reproduce.py      make reproduce: the CPU reproduction -> results/cpu-wt2/ (scripts/reproduce.py)
task_suite.py     make tasks: the synthetic task suite -> results/tasks/ (scripts/tasks.py)
task_rerun.py     the task suite's rerun check -> results/tasks-rerun/ (scripts/task_rerun.py); its report's
                  table-level parts in rerun_table.py, its courses over training in rerun_course.py
extension/        the extension comparison: training-free methods and short fine-tuning -> results/extension/
budget_probes.py  make budget-probes: how budget and dropout change the paper's effects -> results/probes/
variants.py       the 2024-2026 variants of registered schemes that the plans and the benchmark run
readme_tables.py  keeps the tables README files copy in step with the generated reports
scheme_figures.py make figures: ALiBi slopes and biases, T5 buckets and bias tables -> results/figures/
"""

from __future__ import annotations

from pathlib import Path


def checkout_root() -> Path:
    """The folder whose results/ and runs/ the plans read and write: the checkout this package runs from (an editable
    install, `make reproduce`), else the working directory (a wheel in site-packages has no results/ of its own)."""
    here = Path(__file__).resolve().parents[2]
    return here if (here / "configs").is_dir() and (here / "alibi_lm").is_dir() else Path.cwd()
