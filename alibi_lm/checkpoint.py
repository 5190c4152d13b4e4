"""Run folders and atomic checkpoints.

A run folder holds config.yaml (resolved), tokenizer.json, checkpoint.pt (the latest complete
checkpoint), log.jsonl (one line per logged step) and status.json (running / completed / failed).
"""

from __future__ import annotations

import json
import os
import pickle
import tempfile
import zipfile
from pathlib import Path

import torch

from .errors import UserError

CHECKPOINT = "checkpoint.pt"
STATUS = "status.json"


def atomic_write(path: Path, write) -> None:
    """write(file_object) into a temporary file beside `path`, fsync, then rename over `path`:
    a kill at any moment leaves either the old file or the new one, never a partial one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode()))


def save_checkpoint(run_dir: Path, state: dict) -> None:
    atomic_write(Path(run_dir) / CHECKPOINT, lambda f: torch.save(state, f))


def load_checkpoint(path: Path, map_location="cpu") -> dict:
    """Load a checkpoint file (or a run folder's), with one-line errors for missing/corrupt files."""
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT
    if not path.is_file():
        raise UserError(f"no checkpoint at {path}; train first (make train) or point run=<a run folder>")
    try:
        state = torch.load(path, map_location=map_location, weights_only=False)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError, OSError) as e:
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
