"""tests/forked_app.py, which most command-line tests use, against the real thing: the same command run by a fresh
interpreter and by a fork of the app server gives the same exit status, stdout and stderr."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO
from forked_app import run_python

SCRIPT = "import atexit, sys; atexit.register(print, 'atexit ran'); print(sys.argv[1:]); "
CASES = {
    "a one-line config error": ["-m", "alibi_lm.train", "position=foo"],
    "a module's help": ["-m", "alibi_lm.positions", "--help"],
    "exit with a message": ["-c", SCRIPT + "sys.exit('stopped: ' + sys.argv[1])", "why"],
    "exit with a status": ["-c", SCRIPT + "sys.exit(3)", "a", "b"],
    "an uncaught exception": ["-c", SCRIPT + "raise ValueError('bad')"],
    "a script": ["scripts/task_rerun.py", "--dry-run", "copy-nothing-L64-seed0"],
}


@pytest.mark.parametrize("argv", CASES.values(), ids=CASES.keys())
def test_a_forked_command_is_the_command(argv, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    real = subprocess.run([sys.executable, *argv], env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    forked = run_python(argv, env, REPO, timeout=120)
    assert (forked.returncode, forked.stdout) == (real.returncode, real.stdout)
    if "Traceback" in real.stderr:  # the forked one's frames start at runpy's exec, not at <string> line 1
        assert forked.stderr.splitlines()[-1] == real.stderr.splitlines()[-1]
        assert forked.stderr.startswith("Traceback")
    else:
        assert forked.stderr == real.stderr


def test_the_child_gets_its_environment_and_folder_and_a_timeout_is_raised(tmp_path):
    show = "import os; print(os.getcwd(), os.environ.get('MARK'), 'HOME' in os.environ)"
    out = run_python(["-c", show], {"MARK": "here"}, tmp_path)
    assert out.stdout.split() == [str(tmp_path), "here", "False"]
    with pytest.raises(subprocess.TimeoutExpired):
        run_python(["-c", "import time; time.sleep(30)"], timeout=1)
