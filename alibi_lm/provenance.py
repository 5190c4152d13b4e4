"""Where a result came from: the git commit and the machine, written beside every table."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _read_commit() -> tuple[str, bool]:
    """(short hash of HEAD or "unknown" outside a git checkout, whether tracked files have uncommitted changes)."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown", False
    return sha or "unknown", bool(dirty)


# Read once, when the process imports alibi_lm: the commit of the code it runs. A sweep trains for hours in
# one process; a commit made meanwhile must not label the rows it writes later.
_COMMIT_AT_START = _read_commit()


def git_commit(mark_dirty: bool = True) -> str:
    """Short hash of HEAD when this process started, flagged when it started with uncommitted changes."""
    sha, dirty = _COMMIT_AT_START
    return sha + (" (with uncommitted changes)" if mark_dirty and dirty else "")


def cpu_description() -> str:
    """CPU model name and the cores this process may use, e.g. 'AMD EPYC, 2 cores'."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {len(os.sched_getaffinity(0))} cores"


def hardware() -> str:
    """The CPU, the GPU (if any) and torch's version: the hardware line of a results README."""
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{cpu_description()}, {gpu}, torch {torch.__version__}"
