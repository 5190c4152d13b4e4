"""`python -m alibi_lm.<app> ARGS` without paying for a fresh interpreter: a fork of a server process that has
already imported torch and the other heavy libraries.

Starting an interpreter and importing torch costs 2-3 s; most command-line tests need the app's one-line errors,
exit status and files, not a fresh interpreter. run_python(...) forks a multiprocessing forkserver (one per test
process, started on first use) that has imported PRELOAD, and in the child runs the module as `-m` does, a `-c`
string or a script, as __main__, with the given argv, environment and working folder, sys.path as that command
line would have it (PYTHONPATH included), stdout and stderr to files, the atexit functions at the end, and the
status SystemExit gives.

What the fork cannot redo falls back to a real process: settings an interpreter reads when it starts
(START_VARIABLES) that differ from the server's. alibi_lm is not preloaded: every child imports the package from
its own sys.path, so that an app that forgets to import what registers its tables, configs or resolvers fails as
on the command line. Also unlike a fresh interpreter, every child has the server's string hash seed. Tests of
signals and kill -9 (the server's children share its process group), DDP, start-up imports and the wheel keep
real processes.
"""

from __future__ import annotations

import atexit
import faulthandler
import json
import multiprocessing
import os
import random
import runpy
import signal
import subprocess
import sys
import tempfile
import types

# third-party libraries only (see above), and not transformers, which tests hide with sys.modules['transformers'] = None
PRELOAD = ["torch", "numpy", "pandas", "hydra", "omegaconf", "tqdm", "tokenizers"]
# read once, when an interpreter starts (by Python, OpenMP or tqdm): a child given other values runs for real
START_VARIABLES = ("PYTHONHASHSEED", "PYTHONWARNINGS", "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONOPTIMIZE",
                   "OMP_NUM_THREADS", "MKL_NUM_THREADS")
START_PREFIXES = ("TQDM_",)

_SERVER = multiprocessing.get_context("forkserver")
_SERVER.set_forkserver_preload(PRELOAD)  # the process-wide forkserver's: set before it starts, on first use
_server_env: dict[str, str] | None = None  # os.environ when the server started
_base_path: list[str] | None = None  # the interpreter's own sys.path after its first entry, without PYTHONPATH


def base_path() -> list[str]:
    """Asked once, in the test process: each child imports this module again, and must not ask again."""
    global _base_path
    if _base_path is None:
        _base_path = json.loads(subprocess.run(
            [sys.executable, "-c", "import json, sys; print(json.dumps(sys.path[1:]))"], capture_output=True,
            text=True, check=True, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}).stdout)
    return _base_path


def started_alike(env: dict) -> bool:
    """env's start-up settings are the server's: a fork of it is what an interpreter started with env would be."""
    global _server_env
    _server_env = dict(os.environ) if _server_env is None else _server_env  # the server starts on first use
    names = {*START_VARIABLES, *(k for k in (*env, *_server_env) if k.startswith(START_PREFIXES))}
    return all(env.get(name) == _server_env.get(name) for name in names)


def _exit_status(code) -> int:
    """What the interpreter makes of SystemExit(code): None is 0, an int itself, anything else printed and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _as_started(argv: list[str], env: dict, cwd: str, out_path: str, err_path: str, base: list[str]) -> None:
    """The child's process state as `python ARGV` started in cwd with env would have it."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out_path), (2, err_path)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = sys.__stdout__ = open(1, "w", buffering=1, closefd=False)  # line-buffered, as a pipe with -u
    sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, closefd=False)
    if env.get("PYTHONFAULTHANDLER"):
        faulthandler.enable()
    if argv[0] in ("-m", "-c"):  # -m: the working folder, -c: '' (the working folder as it changes)
        first = os.getcwd() if argv[0] == "-m" else ""
    else:  # a script: its own folder
        first = os.path.dirname(os.path.realpath(argv[0]))
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first, *extra, *base]
    random.seed()  # a fresh interpreter's generators start from the OS's entropy, not from the server's state
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def _run_as_main(argv: list[str]) -> None:
    if argv[0] == "-m":  # sys.argv[0] becomes the module's file, as with -m
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        main = sys.modules["__main__"] = types.ModuleType("__main__")
        exec(compile(argv[1], "<string>", "exec"), main.__dict__)
    else:
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")


def _child(argv: list[str], env: dict, cwd: str, out_path: str, err_path: str, base: list[str]) -> None:
    _as_started(argv, env, cwd, out_path, err_path, base)
    try:
        _run_as_main(argv)
        status = 0
    except SystemExit as stop:
        status = _exit_status(stop.code)
    except BaseException as error:  # what the interpreter does with an uncaught exception
        sys.excepthook(type(error), error, error.__traceback__)
        status = -signal.SIGINT if isinstance(error, KeyboardInterrupt) else 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    if status == -signal.SIGINT:  # as Python ends on an uncaught Ctrl-C: killed by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status)


def run_python(argv, env: dict | None = None, cwd=None, timeout: float = 180) -> subprocess.CompletedProcess:
    """subprocess.run([sys.executable, *argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    for argv = ["-m", MODULE, ARGS...], ["-c", CODE, ARGS...] or [SCRIPT, ARGS...], in a child of the
    forkserver (or for real: see START_VARIABLES); env and cwd default to this process's, as subprocess's do."""
    argv = [str(a) for a in argv]
    env, cwd = dict(os.environ if env is None else env), os.getcwd() if cwd is None else cwd
    command = [sys.executable, *argv]
    if not started_alike(env):
        return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    with tempfile.TemporaryDirectory(prefix="forked-app-") as tmp:
        out_path, err_path = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        child = _SERVER.Process(target=_child, args=(argv, env, str(cwd), out_path, err_path, base_path()))
        timed_out = False
        try:
            child.start()
            child.join(timeout)
            timed_out = child.exitcode is None
        finally:  # as subprocess.run: the child does not outlive a timeout or an interrupted wait
            if child.exitcode is None:
                child.kill()
                child.join()
        output = [open(path).read() if os.path.exists(path) else "" for path in (out_path, err_path)]
    if timed_out:
        raise subprocess.TimeoutExpired(command, timeout, output=output[0], stderr=output[1])
    # exitcode -N when killed by signal N, as subprocess reports it
    return subprocess.CompletedProcess(command, child.exitcode, *output)
