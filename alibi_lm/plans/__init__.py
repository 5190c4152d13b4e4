"""The long plans: many train / evaluate / probe steps run as processes, resumable and committed in parts.

steps.py          running a plan's steps, --jobs at a time, in dependency order (a step per process)
reproduce.py      make reproduce: the CPU reproduction -> results/cpu-wt2/ (scripts/reproduce.py)
tasks.py          make tasks: the synthetic task suite -> results/tasks/ (scripts/tasks.py)
budget_probes.py  make budget-probes: how budget and dropout change the paper's effects -> results/probes/
variants.py       the 2024-2026 variants of registered schemes that the plans and the benchmark run
readme_tables.py  keeps the tables README files copy in step with the generated reports
"""
