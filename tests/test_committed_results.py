"""Every documented report and figure command of the language-model experiments, run on a fresh copy of the
repository, leaves the committed results exactly as they are (git status clean): the committed tables and plots come
from these commands. The task suite's are in test_committed_task_results.py (a file of its own, so that the two run
on separate test workers)."""

from __future__ import annotations

import pytest
from conftest import REPO, assert_command_changes_no_committed_file

pytestmark = pytest.mark.slow

PROBES = sorted(p.name for p in (REPO / "results" / "probes").iterdir() if (p / "extrapolation.csv").is_file())
COMMANDS = [  # (command, expected exit status)
    (["-m", "alibi_lm.results", "results/cpu-wt2"], 0),            # make report EXPERIMENT=cpu-wt2
    (["-m", "alibi_lm.results", "results/quick-7761e15"], 0),      # make report EXPERIMENT=quick-7761e15
    (["-m", "alibi_lm.results", *(f"results/probes/{p}" for p in PROBES)], 0),
    (["-m", "alibi_lm.probes.report", "results/cpu-wt2"], 0),
    (["scripts/budget_probes.py", "--report"], 0),                  # make budget-probes ARGS=--report
    (["scripts/reproduce.py", "--report-only"], 0),
    (["scripts/visualize_positions.py"], 2),                        # make figures: says which T5 run it needs
]


@pytest.mark.parametrize("args, status", COMMANDS, ids=lambda a: " ".join(a) if isinstance(a, list) else None)
def test_a_documented_report_command_changes_no_committed_file(fresh_copy, args, status):
    assert_command_changes_no_committed_file(fresh_copy, args, status)
