"""The package as a user installs it: a wheel built from this tree, installed into a fresh folder outside the
checkout (pip --target, no dependencies: they are this environment's), put first on PYTHONPATH and run from a
temporary working directory, finds its configs inside itself (setup.py installs configs/ as alibi_lm/configs):
`--help`, every config of configs/ composed and checked, a tiny training run with its evaluation."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO, write_corpus

from alibi_lm.config import CONFIG_DIR

# what the wheel is built from; pyproject.toml names README.md as the long description
SOURCES = ("pyproject.toml", "setup.py", "README.md", "alibi_lm", "configs")

# Run by the installed package: every app's defaults, then every option of every config group under its config
# folder composed into each app whose defaults list names the group (hydra/'s, such as the Slurm launcher, into
# train) and typed, which runs every field's check. Prints the folder it read.
COMPOSE_EVERY_CONFIG = """
from pathlib import Path
import yaml
from omegaconf import OmegaConf
import alibi_lm.probes.app  # registers probes_schema
from alibi_lm.config import CONFIG_DIR, compose, to_job

root = Path(CONFIG_DIR)
defaults = {app: yaml.safe_load((root / f"{app}.yaml").read_text())["defaults"] for app in ("train", "eval", "probes")}
apps = {app: {next(iter(entry)).removeprefix("override ") for entry in entries if isinstance(entry, dict)}
        for app, entries in defaults.items()}
for app in apps:
    to_job(compose(app))
# the old name, an alias; compared unresolved, since == resolves hydra.sweep.dir's ${now:...} on each side
unresolved = {name: OmegaConf.to_container(compose(name)) for name in ("evaluate", "eval")}
assert not (root / "evaluate.yaml").exists() and unresolved["evaluate"] == unresolved["eval"]
# a group some app takes only beside another choice: the extension applies to the passkey probe, not probe=all
beside = {("probes", "extension"): ["probe=passkey"]}
for option in sorted(root.glob("*/**/*.yaml")):
    group = option.parent.relative_to(root).as_posix()
    users = [app for app, groups in apps.items() if group in groups] or (["train"] if group.startswith("hydra/") else [])
    assert users, f"no app composes {group}/"
    for app in users:
        cfg = compose(app, [f"{group}={option.stem}", *beside.get((app, group), [])])
        assert cfg.hydra.runtime.choices[group] == option.stem, (app, group, option.stem)
        if not group.startswith("hydra/"):
            to_job(cfg)
print(root)
"""


def files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
            and "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """site/: the wheel of this tree installed with `pip install --no-deps --target` (built from a copy of the
    sources, so that the build leaves nothing in the checkout)."""
    root = tmp_path_factory.mktemp("wheel")
    (root / "src").mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, root / "src" / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, root / "src" / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", root / "dist", root / "src"], check=True,
                   capture_output=True)
    (wheel,) = (root / "dist").glob("alibi_lm-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", root / "site", wheel], check=True, capture_output=True)
    return root / "site"


def run(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """`python *args` from `cwd`, the installed package ahead of any PYTHONPATH (a torch of another version, say)."""
    path = [str(site), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), WANDB_MODE="disabled")
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_checkout_reads_the_repository_configs():
    """The editable install (and a checkout on PYTHONPATH) reads configs/ at the top of the repository."""
    assert Path(CONFIG_DIR) == REPO / "configs"


@pytest.mark.slow
def test_the_wheel_holds_every_module_and_config(installed, tmp_path):
    package = installed / "alibi_lm"
    assert files(package / "configs") == files(REPO / "configs")
    assert {p for p in files(package) if p.endswith(".py")} == {p for p in files(REPO / "alibi_lm") if p.endswith(".py")}
    done = run(installed, tmp_path, "-c", "import alibi_lm; print(alibi_lm.__file__)")
    assert done.returncode == 0 and Path(done.stdout.strip()) == package / "__init__.py", done.stderr


@pytest.mark.slow
def test_the_installed_train_help_lists_the_packaged_configs(installed, tmp_path):
    done = run(installed, tmp_path, "-m", "alibi_lm.train", "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage: python -m alibi_lm.train" in done.stdout
    positions = sorted(p.stem for p in (REPO / "configs" / "position").glob("*.yaml"))
    assert f"position: {', '.join(positions)}" in done.stdout


@pytest.mark.slow
def test_the_installed_package_composes_every_config(installed, tmp_path):
    done = run(installed, tmp_path, "-c", COMPOSE_EVERY_CONFIG)
    assert done.returncode == 0, done.stderr[-2000:]
    assert Path(done.stdout.strip()) == installed / "alibi_lm" / "configs"


@pytest.mark.slow
def test_the_installed_package_trains_and_evaluates_outside_the_checkout(installed, tmp_path):
    write_corpus(tmp_path / "data")
    done = run(installed, tmp_path, "-m", "alibi_lm.train", "name=wheel", "data=wikitext2", "data.root=data",
               "data.cache_dir=cache", "tokenizer=word", "position=alibi", "model.n_layer=1", "model.d_model=32",
               "model.d_ff=64", "train.seq_len=16", "train.batch_size=4", "train.max_steps=4", "train.warmup_steps=1",
               "train.eval_every=4", "train.checkpoint_every=4", "train.eval_tokens=256", "train.progress=false",
               "train.evaluate_after=true", "eval.multipliers=[1,2]", "eval.max_tokens=600", "paths.runs=runs",
               "paths.results=results", "logger.wandb.mode=disabled")
    assert done.returncode == 0, done.stderr[-2000:]
    run_dir = tmp_path / "runs" / "wheel" / "alibi-L16-seed0"
    assert json.loads((run_dir / "status.json").read_text())["status"] == "completed"
    rows = pd.read_csv(tmp_path / "results" / "wheel" / "extrapolation.csv")
    assert sorted(rows.eval_len) == [16, 32] and (rows.ppl > 1).all()
