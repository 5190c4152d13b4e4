"""Run folders and atomic checkpoints.

A run folder holds config.yaml (resolved), tokenizer.json, checkpoint.pt (the latest complete
checkpoint), log.jsonl (one line per logged step) and status.json (running / completed / failed).
Every file is written by atomic_write: a kill -9 at any moment leaves the previous version or the new
one, never a partial file; a write that fails (disk full, no permission) is a one-line UserError.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import sys
import tempfile
import time
import zipfile
from collections import Counter
from pathlib import Path

import torch

from .errors import UserError, write_error

CHECKPOINT = "checkpoint.pt"
STATUS = "status.json"


# Test hook: ALIBI_LM_TEST_PAUSE_IN_WRITE=<path suffix>[@<n>]=<seconds> sleeps inside the n-th (default:
# every) atomic write of a file whose path ends with the suffix, after the temporary file is complete and
# before it is renamed, and says so on stderr: tests kill -9 the process there.
PAUSE_VAR = "ALIBI_LM_TEST_PAUSE_IN_WRITE"
_pause_counts: Counter = Counter()


def _test_pause(path: Path) -> None:
    spec = os.environ.get(PAUSE_VAR)
    if not spec:
        return
    target, _, seconds = spec.rpartition("=")
    suffix, _, nth = target.partition("@")
    if not str(path).endswith(suffix):
        return
    _pause_counts[suffix] += 1
    if nth and _pause_counts[suffix] != int(nth):
        return
    print(f"test hook: pausing {seconds}s before renaming over {path}", file=sys.stderr, flush=True)
    time.sleep(float(seconds))


def _fsync_dir(folder: Path) -> None:
    """Make a rename inside `folder` durable (a power cut after it keeps the new name)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(path: Path, write) -> None:
    """write(file_object) into a temporary file beside `path`, fsync, then rename over `path`:
    a kill at any moment leaves either the old file or the new one, never a partial one. An OSError
    (disk full, read-only or unwritable folder) becomes a UserError and leaves the old file as it was."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise write_error(path, e) from e
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the mode open() would
        _test_pause(path)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise write_error(path, e) from e
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


@functools.cache
def _umask() -> int:
    """The process umask, read once (os.umask can only be read by setting it, which is racy later on)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def remove_stale_temporaries(folder: Path) -> None:
    """Delete the temporary files a killed atomic_write left in `folder` (call only while no other
    process writes there, e.g. holding lock_run)."""
    for tmp in Path(folder).glob(".*.tmp"):
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def lock_run(run_dir: Path):
    """Hold an exclusive lock on run_dir/.lock for as long as the block runs; a second process that
    trains the same run folder (a sweep started twice) fails at once instead of corrupting it. The
    kernel drops the lock when the holder dies, kill -9 included."""
    run_dir = Path(run_dir)
    try:
        f = open(run_dir / ".lock", "a+")
    except OSError as e:
        raise write_error(run_dir / ".lock", e) from e
    with f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise UserError(f"{run_dir} is being trained by {holder}; wait for it to finish or stop it "
                            f"(a second run in the same folder would overwrite its checkpoint)") from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}\n")
        f.flush()
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                f.seek(0)
                f.truncate()
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode()))


def save_checkpoint(run_dir: Path, state: dict) -> None:
    atomic_write(Path(run_dir) / CHECKPOINT, lambda f: torch.save(state, f))


def verify_zip(path: Path) -> None:
    """torch.save writes a zip archive with a CRC-32 per entry; torch.load does not check them, so a
    flipped byte in a tensor would load silently. Raise zipfile.BadZipFile when any entry is damaged."""
    with zipfile.ZipFile(path) as z:
        bad = z.testzip()
    if bad is not None:
        raise zipfile.BadZipFile(f"CRC mismatch in {bad}")


def load_checkpoint(path: Path, map_location="cpu") -> dict:
    """Load a checkpoint file (or a run folder's), with one-line errors for missing/corrupt files."""
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT
    if not path.is_file():
        raise UserError(f"no checkpoint at {path}; train first (make train) or point run=<a run folder>")
    try:
        verify_zip(path)
        state = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as e:  # noqa: BLE001 - a damaged pickle can raise almost anything, MemoryError included
        raise UserError(f"checkpoint {path} is truncated or corrupt ({type(e).__name__}); "
                        f"retrain or restore it from a backup") from None
    if not isinstance(state, dict) or "model" not in state or "model_config" not in state:
        raise UserError(f"{path} is not an alibi-lm checkpoint (no model/model_config entries)")
    return state


def write_status(run_dir: Path, status: str, **extra) -> None:
    atomic_write_text(Path(run_dir) / STATUS, json.dumps({"status": status, **extra}, indent=2) + "\n")


def read_status(run_dir: Path) -> dict:
    try:
        return json.loads((Path(run_dir) / STATUS).read_text())
    except (OSError, json.JSONDecodeError):
        return {"status": "missing"}


def is_run_dir(path: Path) -> bool:
    return (Path(path) / "config.yaml").is_file() and (Path(path) / CHECKPOINT).is_file()


def latest_run(runs_root: Path) -> Path:
    runs = [p.parent for p in Path(runs_root).glob(f"**/{CHECKPOINT}") if is_run_dir(p.parent)]
    if not runs:
        raise UserError(f"no run folder with a {CHECKPOINT} under {runs_root}/; run `make train` first or pass run=<folder>")
    return max(runs, key=lambda p: (p / CHECKPOINT).stat().st_mtime)
