"""The README runs as written: every ```python block executes in a fresh process (on a small synthetic corpus, so
no real data is needed), every `make <target>` it mentions is a Makefile target, and every `python -m alibi_lm...`
it mentions is a module that exists."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_corpus

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def python_blocks() -> list[str]:
    return [body for lang, body in FENCE.findall(README) if lang == "python"]


def code_text() -> str:
    """What the README shows as code: fenced blocks and inline `code` spans (prose never counts)."""
    blocks = [body for _, body in FENCE.findall(README)]
    inline = re.findall(r"`([^`\n]+)`", FENCE.sub("", README))
    return "\n".join(blocks + inline)


def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([A-Za-z0-9_-]+):(?!=)", text, re.M))


def test_the_readme_has_python_blocks():
    assert python_blocks(), "no ```python block in README.md"


@pytest.mark.slow  # subprocesses; one block trains a small model
@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_python_block_runs(index, tmp_path):
    block = python_blocks()[index]
    data = write_corpus(tmp_path / "data")
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ALIBI_LM_DATA": str(data), "WANDB_MODE": "disabled",
           "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    result = subprocess.run([sys.executable, "-c", block], cwd=work, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, f"README python block {index + 1} failed:\n{block}\n{result.stderr[-3000:]}"


def test_every_make_target_in_the_readme_exists():
    mentioned = set(re.findall(r"(?:^|[\s;&|(])make ([a-z][\w-]*)", code_text(), re.M))
    assert {"train", "test", "demo"} <= mentioned
    missing = sorted(mentioned - makefile_targets())
    assert not missing, f"README mentions make targets the Makefile lacks: {missing}"


def test_every_python_module_in_the_readme_exists():
    modules = set(re.findall(r"python -m (alibi_lm(?:\.\w+)*)", README))
    assert "alibi_lm.train" in modules
    missing = sorted(m for m in modules if importlib.util.find_spec(m) is None)
    assert not missing, f"README mentions modules that do not exist: {missing}"
