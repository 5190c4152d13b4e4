"""Every documented report command of the task suite, run on a fresh copy of the repository, leaves the committed
results exactly as they are (git status clean): the committed tables and plots of results/tasks*/ come from these
commands."""

from __future__ import annotations

import pytest
from conftest import REPO, assert_command_changes_no_committed_file

pytestmark = pytest.mark.slow

# every task-suite folder (the suite, its record, its probes and reruns): its tasks.md and plots from its tasks.csv
TASK_FOLDERS = sorted(f"results/{p.parent.name}" for p in (REPO / "results").glob("tasks*/tasks.csv"))
COMMANDS = [  # (command, expected exit status)
    (["scripts/task_rerun.py", "--report-only"], 0),                 # its second table reads results/tasks' seeds
    (["-m", "alibi_lm.results", *TASK_FOLDERS], 0),                  # make report EXPERIMENT=tasks, and the rest
]


@pytest.mark.parametrize("args, status", COMMANDS, ids=lambda a: " ".join(a) if isinstance(a, list) else None)
def test_a_documented_task_report_command_changes_no_committed_file(fresh_copy, args, status):
    assert_command_changes_no_committed_file(fresh_copy, args, status)
