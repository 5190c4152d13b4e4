"""`python -m alibi_lm.<app> ARGS` without paying for a fresh interpreter: a fork of a server process that has
already imported torch and the apps' modules.

Starting an interpreter and importing torch costs 2-3 s; most command-line tests need the app's one-line errors,
exit status and files, not a fresh interpreter. run_python(...) forks a multiprocessing forkserver (one per test
process, started on first use) that has imported PRELOAD, and in the child runs the module as `-m` does, or a
script (runpy, as __main__), with the given argv, environment and working folder, stdout and stderr to files,
the atexit functions at the end, and the status SystemExit gives. The app's own module is not preloaded, so that
it runs once, as __main__, exactly as on the command line.

Tests of what only a fresh process shows keep real processes: signals and kill -9 (the server's children share
its process group), DDP, start-up imports, the wheel.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
import traceback

# what the apps import when they run (not only what --help needs), imported once, in the server (which has
# the interpreter's own sys.path: this checkout's alibi_lm is the installed one, `make setup`'s editable install)
PRELOAD = ["torch", "pandas", "hydra", "alibi_lm.cli", "alibi_lm.eval.app", "alibi_lm.probes", "alibi_lm.results",
           "alibi_lm.training.trainer"]
_SERVER = multiprocessing.get_context("forkserver")
_SERVER.set_forkserver_preload(PRELOAD)


def _exit_status(code) -> int:
    """What the interpreter makes of SystemExit(code): None is 0, an int itself, anything else printed and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _child(argv: list[str], env: dict, cwd: str, out_path: str, err_path: str) -> None:
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out_path), (2, err_path)):
        target = os.open(path, os.O_WRONLY | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = sys.__stdout__ = open(1, "w", buffering=1, closefd=False)  # line-buffered, as a pipe with -u
    sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, closefd=False)
    try:
        if argv[0] == "-m":  # sys.argv[0] becomes the module's file, as with -m
            sys.argv = argv[1:]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        else:
            sys.argv = list(argv)
            runpy.run_path(argv[0], run_name="__main__")
        status = 0
    except SystemExit as stop:
        status = _exit_status(stop.code)
    except BaseException:  # what the interpreter does with an uncaught exception
        traceback.print_exc()
        status = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def run_python(argv, env: dict | None = None, cwd=None, timeout: float = 180) -> subprocess.CompletedProcess:
    """subprocess.run([sys.executable, *argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    for argv = ["-m", MODULE, ARGS...], ["-c", CODE, ARGS...] or [SCRIPT, ARGS...], in a child of the
    forkserver; env and cwd default to this process's, as subprocess's do."""
    argv = [str(a) for a in argv]
    env, cwd = dict(os.environ if env is None else env), os.getcwd() if cwd is None else cwd
    command = [sys.executable, *argv]
    with tempfile.TemporaryDirectory(prefix="forked-app-") as tmp:
        out_path, err_path = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        for path in (out_path, err_path):
            open(path, "w").close()
        child = _SERVER.Process(target=_child, args=(argv, env, str(cwd), out_path, err_path))
        child.start()
        child.join(timeout)
        if child.exitcode is None:
            child.kill()
            child.join()
            raise subprocess.TimeoutExpired(command, timeout)
        with open(out_path) as out, open(err_path) as err:
            stdout, stderr = out.read(), err.read()
    # exitcode -N when killed by signal N, as subprocess reports it
    return subprocess.CompletedProcess(command, child.exitcode, stdout, stderr)
