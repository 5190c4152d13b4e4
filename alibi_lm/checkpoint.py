"""Run folders and atomic checkpoints.

A run folder holds config.yaml (resolved), tokenizer.json, checkpoint.pt (the latest complete
checkpoint), log.jsonl (one line per logged step) and status.json (running / completed / failed / stopped /
interrupted). While training runs, checkpoint.previous.pt is the checkpoint before the latest one: when the step
after a checkpoint finds a non-finite loss, that checkpoint's weights made it, and the previous one takes its
place (withdraw_checkpoint).
Every file is written through atomic_file: a kill -9 at any moment leaves the previous version or the new
one, never a partial file; a write that fails (disk full, no permission) is a one-line UserError. A checkpoint
holding a non-finite number anywhere in its weights or optimizer state is never written (save_checkpoint).
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import re
import stat
import uuid
import zipfile
from pathlib import Path

import numpy as np
import torch
from filelock import FileLock, Timeout

from .errors import TrainingDiverged, UserError, write_error

CHECKPOINT = "checkpoint.pt"
PREVIOUS_CHECKPOINT = "checkpoint.previous.pt"  # the one before the latest, while training runs
SET_ASIDE_CHECKPOINT = "checkpoint.nonfinite.pt"  # a withdrawn checkpoint with no previous one to restore
STATUS = "status.json"


def temporary_name(name: str) -> str:
    """The name of atomic_file's temporary beside `name` until it is renamed over it: hidden, unique, `.tmp`."""
    return f".{name}.{uuid.uuid4().hex[:12]}.tmp"


def is_temporary(name: str) -> bool:
    """Whether a file name is one of atomic_file's temporaries (another writer's, half-written, or a killed one's)."""
    return fnmatch.fnmatch(name, ".*.????????????.tmp")


@contextlib.contextmanager
def atomic_file(path: Path):
    """A binary file to write that appears at `path` whole when the block ends, or not at all: a temporary file
    beside it, fsynced, then renamed over `path`. An OSError (disk full, read-only or unwritable folder) becomes a
    UserError and leaves the old file as it was; so does a `path` made read-only, which the rename would replace."""
    path = Path(path)
    check_not_read_only(path)
    tmp = path.parent / temporary_name(path.name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the mode open() gives (umask applied)
    except OSError as e:
        raise write_error(path, e) from e
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if (os_error := underlying_os_error(e)) is not None:
            raise write_error(path, os_error) from e
        raise
    with contextlib.suppress(OSError):  # fsync the folder: a power cut after the rename keeps the new name
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def check_not_read_only(path: Path) -> None:
    """A UserError where `path` is a file without write permission for anyone (chmod a-w: a table or checkpoint a
    user protects): a rename replaces it in a writable folder all the same, and root passes every permission check,
    so only its mode bits say that it is to be kept."""
    try:
        mode = path.stat().st_mode
    except OSError:  # not there yet (or unreadable: the write itself says why)
        return
    if stat.S_ISREG(mode) and not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        raise UserError(f"{path} is read-only, so it is kept as it is; to let this command update it, make it writable "
                        f"(chmod u+w {path}), or write elsewhere")


def underlying_os_error(e: BaseException) -> OSError | None:
    """The OSError behind a failed write: e itself, or the one a library re-raised as another type (torch.save
    turns "File too large" from its file object into a RuntimeError)."""
    while e is not None and not isinstance(e, OSError):
        e = e.__cause__ or e.__context__
    return e


def remove_stale_temporaries(folder: Path, name: str = "*") -> None:
    """Delete the temporary files a killed atomic_file left in `folder` (for files called `name`); call
    only while no other process writes there, i.e. holding its lock."""
    for tmp in Path(folder).glob(f".{name}.*.tmp"):
        tmp.unlink(missing_ok=True)


LOCK_FILE = ".lock"  # folder_lock's file, left in the folder (git-ignored under results/)


def folder_lock(folder: Path, blocking: bool = True) -> FileLock:
    """The exclusive lock on folder/.lock (the kernel drops it when its holder dies, kill -9 included).
    Holding it, a process writes its pid into the file, for the message of one that waits in vain."""

    def write_pid(fd: int) -> None:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)

    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise write_error(folder, e) from e
    return FileLock(Path(folder) / LOCK_FILE, blocking=blocking, on_acquired=write_pid, preserve_lock_file=True)


@contextlib.contextmanager
def lock_run(run_dir: Path):
    """Hold run_dir's lock while the block runs: a second process that trains the same run folder (a
    sweep started twice) fails at once instead of overwriting its checkpoint."""
    lock = folder_lock(run_dir, blocking=False)
    try:
        lock.acquire()
    except Timeout:
        holder = (Path(run_dir) / LOCK_FILE).read_text().strip() or "another process"
        raise UserError(f"{run_dir} is being trained by {holder}; wait for it to finish or stop it "
                        f"(a second run in the same folder would overwrite its checkpoint)") from None
    except OSError as e:
        raise write_error(Path(run_dir) / LOCK_FILE, e) from e
    try:
        yield
    finally:
        lock.release()


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_file(path) as f:
        f.write(text.encode())


def first_non_finite(tree, prefix: str) -> str | None:
    """The dotted name of the first floating-point tensor (or float) in a nested dict/list that holds a NaN or
    an infinity ("model.blocks.0.attn.qkv.weight", "optimizer.state.3.exp_avg_sq"), or None when all are finite."""
    if isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, (list, tuple)):
        items = enumerate(tree)
    elif torch.is_tensor(tree):
        finite = not (tree.is_floating_point() or tree.is_complex()) or bool(torch.isfinite(tree).all())
        return None if finite else prefix
    elif isinstance(tree, float):
        return None if np.isfinite(tree) else prefix
    else:
        return None
    for key, value in items:
        if (found := first_non_finite(value, f"{prefix}.{key}")) is not None:
            return found
    return None


def non_finite_state(state: dict) -> str | None:
    """The first non-finite entry of a checkpoint's weights or optimizer state (first_non_finite), or None."""
    return first_non_finite(state.get("model", {}), "model") or first_non_finite(state.get("optimizer", {}), "optimizer")


def save_checkpoint(run_dir: Path, state: dict, keep_previous: bool = False) -> None:
    """Write run_dir/checkpoint.pt atomically, only when every weight and optimizer state is finite (else
    TrainingDiverged, and the file on disk stays as it was). keep_previous: the checkpoint it replaces becomes
    checkpoint.previous.pt (a hard link made before the rename: checkpoint.pt is whole at every moment)."""
    run_dir = Path(run_dir)
    if (entry := non_finite_state(state)) is not None:
        raise TrainingDiverged(f"{entry} is not finite at step {state.get('step')}, so its checkpoint was not written "
                               f"in {run_dir}; lower train.lr or raise train.warmup_steps")
    with atomic_file(run_dir / CHECKPOINT) as f:
        torch.save(state, f)
        if keep_previous and (run_dir / CHECKPOINT).is_file():
            link = run_dir / temporary_name(PREVIOUS_CHECKPOINT)
            try:
                os.link(run_dir / CHECKPOINT, link)
                os.replace(link, run_dir / PREVIOUS_CHECKPOINT)
            except OSError as e:
                link.unlink(missing_ok=True)
                raise write_error(run_dir / PREVIOUS_CHECKPOINT, e) from e


def withdraw_checkpoint(run_dir: Path) -> bool:
    """The latest checkpoint's weights made a non-finite loss: put checkpoint.previous.pt in its place (True), or,
    with none, set it aside as checkpoint.nonfinite.pt (False), so that no command takes it for a trained model."""
    run_dir = Path(run_dir)
    try:
        if (run_dir / PREVIOUS_CHECKPOINT).is_file():
            os.replace(run_dir / PREVIOUS_CHECKPOINT, run_dir / CHECKPOINT)
            return True
        if (run_dir / CHECKPOINT).is_file():
            os.replace(run_dir / CHECKPOINT, run_dir / SET_ASIDE_CHECKPOINT)
    except OSError as e:
        raise write_error(run_dir / CHECKPOINT, e) from e
    return False


def drop_previous_checkpoint(run_dir: Path) -> None:
    """A completed run needs no second checkpoint."""
    with contextlib.suppress(OSError):
        (Path(run_dir) / PREVIOUS_CHECKPOINT).unlink(missing_ok=True)


# What checkpoints of earlier alibi-lm versions hold besides plain data: numpy's legacy RNG state, a tuple with
# one uint32 array. Allowed by name: rebuilding an array runs no code, and its contents go through the same
# restricted unpickler.
NUMPY_ARRAY_GLOBALS = [np.ndarray, np.dtype, np.dtype(np.uint32).__class__,
                       getattr(np, "_core", getattr(np, "core", None)).multiarray._reconstruct]


def refused_global(error: Exception) -> str | None:
    """The global that torch's weights-only unpickler refused (its message says "... GLOBAL posix.system ..."
    whether the global is merely not allowed or its module is blocked), or None when the error is of another
    kind (a damaged file)."""
    found = re.search(r"\bGLOBAL ([\w.]+)", str(error))
    return found.group(1) if found else None


def load_checkpoint(path: Path, map_location="cpu") -> dict:
    """Load a checkpoint file (or a run folder's) as plain data only (torch.load(weights_only=True): no pickled
    object can run code), with one-line errors for missing, corrupt or refused files."""
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT
    if not path.is_file():
        raise UserError(f"no checkpoint at {path}; train first (make train) or point run=<a run folder>")
    try:
        # torch.save writes a zip archive with a CRC-32 per entry; torch.load does not check them, so a
        # flipped byte in a tensor would load silently
        with zipfile.ZipFile(path) as z:
            if (bad := z.testzip()) is not None:
                raise zipfile.BadZipFile(f"CRC mismatch in {bad}")
        with torch.serialization.safe_globals(NUMPY_ARRAY_GLOBALS):
            state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - a damaged file can raise almost anything, MemoryError included
        if (name := refused_global(e)) is not None:
            raise UserError(f"checkpoint {path} holds {name}, an object that could run code when unpickled, so it was "
                            f"refused (only weights and plain data are loaded); use a checkpoint from a source you "
                            f"trust, or retrain") from None
        raise UserError(f"checkpoint {path} is truncated or corrupt ({type(e).__name__}); "
                        f"retrain or restore it from a backup") from None
    if not isinstance(state, dict) or "model" not in state or "model_config" not in state:
        raise UserError(f"{path} is not an alibi-lm checkpoint (no model/model_config entries)")
    return state


def checkpoint_config(path: Path) -> dict | None:
    """The training config a checkpoint keeps beside its weights (None: it keeps none), read without reading the
    weights: memory-mapped, the tensors stay on disk, so the reuse checks that run before every train command cost
    milliseconds for a checkpoint of any size. No CRC check either: the load that uses the weights makes it. Raises
    whatever torch.load raises on a file that is no checkpoint."""
    with torch.serialization.safe_globals(NUMPY_ARRAY_GLOBALS):
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception:  # noqa: BLE001 - a file system that cannot map it: read it whole (a damaged file raises again)
            state = torch.load(path, map_location="cpu", weights_only=True)
    return state.get("config") if isinstance(state, dict) else None


def write_status(run_dir: Path, status: str, **extra) -> None:
    atomic_write_text(Path(run_dir) / STATUS, json.dumps({"status": status, **extra}, indent=2) + "\n")


def read_status(run_dir: Path) -> dict:
    """status.json's record; {"status": "missing"} where it is missing or damaged: unreadable, not JSON, or JSON
    that is not a record with a status (`{}`, `null`, a list), each as if no status had been written."""
    try:
        status = json.loads((Path(run_dir) / STATUS).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {"status": "missing"}
    return status if isinstance(status, dict) and isinstance(status.get("status"), str) else {"status": "missing"}


UNFINISHED = ("running", "stopped", "interrupted")  # statuses of a run whose training has not ended


def unusable_reason(run_dir: Path, state: dict) -> str | None:
    """Why a run's checkpoint is not a trained model (status.json says failed, or that training has not ended: its
    rows would stand for the finished run's; or a weight is not finite), or None."""
    status = read_status(run_dir)
    if status["status"] == "failed":
        return f"status.json says failed ({status.get('reason') or 'no reason recorded'})"
    if status["status"] in UNFINISHED:
        where = f" at step {status['step']}" + (f" of {status['steps']}" if "steps" in status else "") if "step" in status else ""
        return (f"status.json says {status['status']}{where}: its training has not ended (the same train command "
                f"finishes it)")
    if (entry := first_non_finite(state.get("model", {}), "model")) is not None:
        return f"its weights are not finite ({entry})"
    return None


def check_usable_run(run_dir: Path, state: dict, override_key: str, allowed: bool) -> str:
    """"" for a run fit to be scored; for one that is not (unusable_reason), a one-line UserError naming the fix,
    unless the user allowed it with `override_key`=true: then the note its rows carry."""
    reason = unusable_reason(run_dir, state)
    if reason is None:
        return ""
    if allowed:
        return f"scored with {override_key}=true although {reason}"
    raise UserError(f"{run_dir} is not a trained model: {reason}; retrain it (for a diverged run: a lower train.lr "
                    f"under another name=, or delete the folder first), or add {override_key}=true to score it anyway "
                    f"(its rows say so)")


def flat_config(tree: dict) -> dict:
    """{"train": {"seq_len": 64}} -> {"train.seq_len": 64}."""
    import pandas as pd  # import cost: the apps' --help and one-line errors never flatten a config

    return pd.json_normalize(tree, sep=".").to_dict("records")[0] if tree else {}


def config_differences(recorded: dict, written: dict, keys: tuple[str, ...], ignore: tuple[str, ...] = ()) -> list[str]:
    """`key=<recorded> in the checkpoint, <written> in config.yaml` for each entry under `keys` (dotted prefixes)
    that both configs hold and that differs; entries under `ignore` are skipped (how a run executes, not what it
    is). Nested dicts are compared entry by entry."""
    recorded, written = flat_config(recorded), flat_config(written)
    found = []
    for key in sorted(recorded.keys() & written.keys()):
        if key.startswith(keys) and not key.startswith(ignore) and recorded[key] != written[key]:
            found.append(f"{key}={recorded[key]!r} in the checkpoint, {written[key]!r} in config.yaml")
    return found


def is_run_dir(path: Path) -> bool:
    return (Path(path) / "config.yaml").is_file() and (Path(path) / CHECKPOINT).is_file()


def run_dirs(root: Path) -> list[Path]:
    """Every run folder under root (none when root does not exist), in a stable order."""
    return sorted(p.parent for p in Path(root).glob(f"**/{CHECKPOINT}") if is_run_dir(p.parent))


def latest_run(runs_root: Path) -> Path:
    """The run folder whose checkpoint was written last (an app given no run=), named on stdout."""
    runs = run_dirs(runs_root)
    if not runs:
        raise UserError(f"no run folder with a {CHECKPOINT} under {runs_root}/; run `make train` first or pass run=<folder>")
    latest = max(runs, key=lambda p: (p / CHECKPOINT).stat().st_mtime)
    print(f"note: no run= given: the latest run under {runs_root}/, {latest}")  # which one, before any of its errors
    return latest
