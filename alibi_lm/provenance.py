"""Where a result came from: the git commit and the machine, written beside every table."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CODE_PATHS = ("alibi_lm", "configs", "scripts", "pyproject.toml")  # what a result depends on (not docs or results/)
DIRTY = " (with uncommitted changes)"
# The columns of a results table that hold these hashes (commit, weights_digest, model_digest, a data split's sha),
# as text for pandas.read_csv's dtype: a commit "7836e86" or a digest of digits alone would otherwise be read as a
# number (7.836e+89; leading zeros lost) and no longer equal the hash it is compared with.
HASH_COLUMNS = {"commit": str, "weights": str, "model": str, "data_sha": str}
# The commit of a copy of the code that has no .git of its own (the working tree sent to a GPU machine, which
# scripts/gpu_check.sh pack reads here): "<short hash>", or with DIRTY after it. Read only outside a git checkout.
COPY_COMMIT_ENV = "ALIBI_LM_COMMIT"


def read_head() -> tuple[str, bool]:
    """(short hash of HEAD now, or outside a git checkout $ALIBI_LM_COMMIT's, else "unknown"; whether CODE_PATHS
    have uncommitted changes). The package is outside a checkout when git finds no repository at REPO, or REPO is
    not the top of the work tree git finds (a copy inside another repository's folder). For the process's own code
    use git_commit(); this is for a driver that starts other processes."""
    git = ["git", "--no-optional-locks"]  # never takes .git/index.lock (a `git commit` beside it would fail)
    run = dict(cwd=REPO, capture_output=True, text=True, timeout=10, env=dict(os.environ, LC_ALL="C"))
    try:
        top = subprocess.run([*git, "rev-parse", "--show-toplevel"], **run)
        no_repository = top.returncode != 0 and "not a git repository" in top.stderr
        elsewhere = top.returncode == 0 and Path(top.stdout.strip()).resolve() != REPO.resolve()
        if not (no_repository or elsewhere):  # a checkout, or git failing in one: never the variable
            sha = subprocess.run([*git, "rev-parse", "--short", "HEAD"], **run).stdout.strip()
            dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no", "--", *CODE_PATHS],
                                   **run).stdout.strip()
            return sha or "unknown", bool(dirty)
    except (OSError, subprocess.SubprocessError):  # no git at all: outside a checkout
        pass
    copy = os.environ.get(COPY_COMMIT_ENV, "").strip()
    return (copy.removesuffix(DIRTY.strip()).strip(), copy.endswith(DIRTY.strip())) if copy else ("unknown", False)


# Read once per process: the commit of the code it runs. A sweep trains for hours in one process; a commit made
# meanwhile must not label the rows it writes later. None until read_commit_at_start().
_COMMIT_AT_START: tuple[str, bool] | None = None


def read_commit_at_start() -> tuple[str, bool]:
    """Read HEAD for this process, once: the entry points call it first (alibi_lm.cli.main, make bench), before
    the code they run could be committed over; later calls (and git_commit) return that first reading."""
    global _COMMIT_AT_START
    if _COMMIT_AT_START is None:
        _COMMIT_AT_START = read_head()
    return _COMMIT_AT_START


def describe(sha: str, dirty: bool) -> str:
    return sha + (DIRTY if dirty else "")


def git_commit(mark_dirty: bool = True) -> str:
    """Short hash of HEAD when this process started (read_commit_at_start; a process that did not call it reads
    HEAD at its first row), flagged when its code had uncommitted changes then."""
    sha, dirty = read_commit_at_start()
    return describe(sha, mark_dirty and dirty)


def head_commit() -> str:
    """HEAD now (flagged when the code has uncommitted changes): the code a process started now would run."""
    return describe(*read_head())


def cpu_description() -> str:
    """CPU model name and the cores this process may use, e.g. 'AMD EPYC, 2 cores'."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError, StopIteration):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    return f"{cpu}, {len(os.sched_getaffinity(0))} cores"


def hardware(device=None) -> str:
    """The machine of a result: CPU and cores, RAM, the GPU (`device`'s, else the first visible one) with its
    memory, and torch's version. The hardware line of a results README, RUN_INFO.md and the benchmark."""
    import torch

    text = cpu_description()
    with contextlib.suppress(OSError, ValueError, AttributeError):  # no sysconf, or without these names
        text += f", {os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.0f} GiB RAM"
    if torch.cuda.is_available():
        gpu = torch.device(device) if device is not None and torch.device(device).type == "cuda" else 0
        props = torch.cuda.get_device_properties(gpu)
        text += f", {props.name} ({props.total_memory / 2**30:.0f} GiB)"
    else:
        text += ", no GPU"
    return f"{text}, torch {torch.__version__}"


def weights_digest(model) -> str:
    """16 hex digits of SHA-256 over a model's state_dict, or a state dict itself (names, dtypes, shapes and bytes,
    in order): which weights a result was computed from. A row counts as done for a model only when it carries the model's
    digest (results.has_row), so a new run in a folder or experiment that already holds rows (a fresh
    clone's `make reproduce` beside the committed tables, a longer retraining) is evaluated again, while a
    run that trained to bit-identical weights is not."""
    import torch

    digest = hashlib.sha256()
    state = model.state_dict() if hasattr(model, "state_dict") else model
    for name, tensor in state.items():
        flat = tensor.detach().reshape(-1).cpu().contiguous()
        digest.update(f"{name}:{flat.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(flat.view(torch.uint8).numpy())
    return digest.hexdigest()[:16]


def model_digest(model_config) -> str:
    """12 hex digits of SHA-256 over a model's config (a trained run's LMConfig as its checkpoint records it, a
    Hugging Face model's config dict): which model a row was scored from, whatever its weights. A results row
    is replaced only by a row of the same model (results.store.replace_keyed), so two models that share a run
    folder's name, scheme, L and seed can never overwrite each other's rows."""
    text = json.dumps(model_config, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def device_name(device, autocast=None) -> str:
    """The device column of results rows: the GPU's name and its precision ("NVIDIA H200, bf16" under bf16
    autocast, "NVIDIA H200, fp32"), or "cpu: <CPU model>, <n> cores, <t> threads" (the threads torch computes
    with: two processes on 2 cores each take one, and each is slower than one alone), ", bf16" added under
    autocast. `autocast`: the dtype forwards autocast to (config.autocast_dtype), None for float32."""
    import torch

    device = torch.device(device)
    precision = "bf16" if autocast == torch.bfloat16 else "fp32"
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, {precision}"
    return f"cpu: {cpu_description()}, {torch.get_num_threads()} threads" + (", bf16" if autocast else "")


_JOB_COMMAND: list[str] = []  # a sweep's job: the command of its cell (set_job_command)


def set_job_command(words: list[str]) -> None:
    """The command of the job this process runs, where its own command line is not it: a cell of a -m sweep
    (argv holds every cell's values) or a job a launcher started (argv is submitit's)."""
    _JOB_COMMAND[:] = words


def command_line() -> str:
    """This process's command as a user types it (`python -m alibi_lm.<app> ...` or `python <script> ...`), with
    paths inside the repository relative to it: the command column of results rows. A sweep's job gives its cell's."""
    if _JOB_COMMAND:
        return shlex.join(arg.replace(f"{REPO}/", "") for arg in _JOB_COMMAND)
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    module = spec.name.removesuffix(".__main__") if spec is not None and spec.name else None  # a package's __main__
    head = ["python", "-m", module] if module else ["python", repo_relative(sys.argv[0])]
    return shlex.join([*head, *(arg.replace(f"{REPO}/", "") for arg in sys.argv[1:])])


def repo_relative(path) -> str:
    """`path` relative to the repository when it lies inside it (the run column of committed rows must not name
    this machine's folders), else as an absolute path."""
    path = Path(path).expanduser().resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
