"""Every documented report and figure command, run on a fresh copy of the repository, leaves the committed
results exactly as they are (git status clean): the committed tables and plots come from these commands."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, git, repository_copy

pytestmark = pytest.mark.slow

PROBES = sorted(p.name for p in (REPO / "results" / "probes").iterdir() if (p / "extrapolation.csv").is_file())
# every task-suite folder (the suite, its record, its probes and reruns): its tasks.md and plots from its tasks.csv
TASK_FOLDERS = sorted(f"results/{p.parent.name}" for p in (REPO / "results").glob("tasks*/tasks.csv"))
COMMANDS = [  # (command, expected exit status)
    (["-m", "alibi_lm.results", "results/cpu-wt2"], 0),            # make report EXPERIMENT=cpu-wt2
    (["-m", "alibi_lm.results", "results/quick-7761e15"], 0),      # make report EXPERIMENT=quick-7761e15
    (["-m", "alibi_lm.results", *(f"results/probes/{p}" for p in PROBES)], 0),
    (["-m", "alibi_lm.probes.report", "results/cpu-wt2"], 0),
    (["scripts/budget_probes.py", "--report"], 0),                  # make budget-probes ARGS=--report
    (["scripts/reproduce.py", "--report-only"], 0),
    (["scripts/task_rerun.py", "--report-only"], 0),                 # its second table reads results/tasks' seeds
    (["-m", "alibi_lm.results", *TASK_FOLDERS], 0),                  # make report EXPERIMENT=tasks, and the rest
    (["scripts/visualize_positions.py"], 2),                        # make figures: says which T5 run it needs
]



@pytest.fixture(scope="module")
def fresh_copy(tmp_path_factory) -> Path:
    """The repository's tracked files as they are in this checkout, committed in a new repository."""
    return repository_copy(tmp_path_factory.mktemp("fresh") / "repo", untracked=False)


@pytest.mark.parametrize("args, status", COMMANDS, ids=lambda a: " ".join(a) if isinstance(a, list) else None)
def test_a_documented_report_command_changes_no_committed_file(fresh_copy, args, status):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALIBI_LM_")}
    out = subprocess.run([sys.executable, *args], cwd=fresh_copy, env=dict(env, PYTHONPATH=str(fresh_copy)),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == status, out.stderr[-3000:]
    assert git("status", "--porcelain", cwd=fresh_copy) == "", git("status", "--porcelain", cwd=fresh_copy)
