"""Section 7: how long a command takes to answer. The wall time of `python -c "import torch"` (the floor: every app
needs torch), of `python -m alibi_lm.train --help` and of a one-line config error (`train.lr=abc`), each started
afresh, alternating, a few times; a command's time is the median. The apps import pandas, matplotlib, datasets,
transformers and wandb only where they are used, so help and errors cost little more than torch."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from .options import Options
from .rows import StartupRow

COMMANDS = (  # (name, arguments after the Python executable, the exit status it must end with)
    ("import torch", ["-c", "import torch"], 0),
    ("train --help", ["-m", "alibi_lm.train", "--help"], 0),
    ("train, a config error", ["-m", "alibi_lm.train", "train.lr=abc"], 2),
)


def timed(args: list[str], status: int) -> float:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - t0
    if done.returncode != status:
        raise RuntimeError(f"python {' '.join(args)} ended with {done.returncode}, not {status}: {done.stderr[-500:]}")
    return seconds


def section_startup(opts: Options, log) -> list[StartupRow]:
    reps = 1 if opts.quick else 5  # --quick: a smoke run, one fresh process per command
    log(f"startup (7): {', '.join(name for name, _, _ in COMMANDS)}, alternating, {reps} times each")
    times: dict[str, list[float]] = {name: [] for name, _, _ in COMMANDS}
    for rep in range(reps):
        for name, args, status in COMMANDS if rep % 2 == 0 else COMMANDS[::-1]:
            times[name].append(timed(args, status))
    rows = [StartupRow(name, "python " + " ".join(args), round(statistics.median(times[name]), 3), reps)
            for name, args, _ in COMMANDS]
    floor = rows[0].seconds
    for r in rows:
        log(f"  {r.name}: {r.seconds:.2f} s ({r.seconds / floor:.2f}x import torch)")
    return rows


def startup_ratio(rows: list[StartupRow], name: str) -> float | None:
    """A command's median start-up over `import torch`'s."""
    got = {r.name: r.seconds for r in rows}
    return got[name] / got["import torch"] if name in got and got.get("import torch") else None
