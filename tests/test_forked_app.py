"""tests/forked_app.py, which most command-line tests use, against the real thing: the same command run by a fresh
interpreter and by a fork of the app server gives the same exit status, stdout and stderr."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from conftest import REPO
from forked_app import run_python, started_alike

SCRIPT = "import atexit, sys; atexit.register(print, 'atexit ran'); print(sys.argv[1:]); "
CASES = {
    "a one-line config error": ["-m", "alibi_lm.train", "position=foo"],
    "a module's help": ["-m", "alibi_lm.positions", "--help"],
    "exit with a message": ["-c", SCRIPT + "sys.exit('stopped: ' + sys.argv[1])", "why"],
    "exit with a status": ["-c", SCRIPT + "sys.exit(3)", "a", "b"],
    "an uncaught exception": ["-c", SCRIPT + "raise ValueError('bad')"],
    "an uncaught Ctrl-C": ["-c", SCRIPT + "raise KeyboardInterrupt"],
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


def test_the_child_gets_its_environment_folder_and_sys_path_and_imports_the_package_itself(tmp_path):
    """sys.path as the command line has it (PYTHONPATH included); alibi_lm imported from it, so that only what the
    app imports is registered (a preloaded package would hide an app's missing import)."""
    show = ("import os, sys; print(os.getcwd(), os.environ.get('MARK'), 'HOME' in os.environ); print(sys.path); "
            "import alibi_lm.train; from alibi_lm.results.tables import SCHEMAS; print(alibi_lm.__file__, sorted(SCHEMAS))")
    env = {**{k: v for k, v in os.environ.items() if k != "HOME"}, "MARK": "here", "PYTHONPATH": str(REPO)}
    assert started_alike(env)  # a fork, not the fallback
    real = subprocess.run([sys.executable, "-c", show], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    forked = run_python(["-c", show], env, tmp_path)
    assert forked.stdout.splitlines()[0].split() == [str(tmp_path), "here", "False"]
    assert (forked.returncode, forked.stdout, forked.stderr) == (real.returncode, real.stdout, real.stderr)


def test_a_start_up_setting_other_than_the_servers_runs_for_real():
    env = {**os.environ, "PYTHONHASHSEED": "7"}
    assert not started_alike(env)
    real = subprocess.run([sys.executable, "-c", "print(hash('alibi'))"], env=env, capture_output=True, text=True)
    assert run_python(["-c", "print(hash('alibi'))"], env).stdout == real.stdout


def test_a_timeout_raises_and_the_child_does_not_outlive_it(tmp_path):
    late = tmp_path / "written-after-3-s"
    with pytest.raises(subprocess.TimeoutExpired):
        run_python(["-c", f"import time; time.sleep(3); open({str(late)!r}, 'w').close()"], timeout=1)
    time.sleep(4)
    assert not late.exists()
