"""The long plans: many train / evaluate / probe steps run as processes, resumable and committed in parts.

steps.py          running a plan's steps, --jobs at a time, in dependency order (a step per process)
reproduce.py      make reproduce: the CPU reproduction -> results/cpu-wt2/ (scripts/reproduce.py)
tasks.py          make tasks: the synthetic task suite -> results/tasks/ (scripts/tasks.py)
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
