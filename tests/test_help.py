"""Every app's --help (Hydra's help template, configs/hydra/help/alibi_lm.yaml and each app's hydra.help): the app's
name, a usage line, examples that compose and validate, and the config groups a user chooses, no internal schema/."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest
import yaml

from alibi_lm import cli, probes  # noqa: F401 - probes registers probes_schema
from alibi_lm.config import CONFIG_DIR
from alibi_lm.provenance import REPO

APPS = {"train": "alibi_lm.train", "eval": "alibi_lm.eval", "probes": "alibi_lm.probes"}  # config -> module


def app_help(module: str) -> str:
    done = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def listed_groups(text: str) -> list[str]:
    section = text.split("== Config groups (group=option) ==\n", 1)[1].split("\n\n", 1)[0]
    return [line.split(":", 1)[0] for line in section.splitlines()]


def chosen_groups(app: str) -> list[str]:
    """The groups of the app's defaults list: what a user picks with group=option (not the schemas, not hydra/)."""
    defaults = yaml.safe_load((REPO / "configs" / f"{app}.yaml").read_text())["defaults"]
    return [next(iter(d)) for d in defaults if isinstance(d, dict) and not next(iter(d)).startswith("override ")]


@pytest.mark.parametrize("app", APPS)
def test_help_shows_the_name_usage_examples_and_the_groups_a_user_chooses(app):
    module = APPS[app]
    text = app_help(module)
    assert text.startswith(f"{module}: ")
    assert f"\nusage: python -m {module} " in text
    examples = [line.strip() for line in text.splitlines() if line.startswith(f"  python -m {module} ")]
    assert len(examples) >= 3
    assert "schema/" not in text and "is powered by Hydra" not in text
    assert listed_groups(text) == chosen_groups(app)
    for example in examples:  # each composes and validates, as the preflight checks a real command line
        args = shlex.split(example, comments=True)[3:]
        cli.preflight(app, args, lambda job, output_dir: None)


def test_the_train_help_lists_every_user_facing_group_under_configs():
    """Every folder under configs/ but hydra/ is a group some app lets a user choose: the train app's, or one the
    train app has no use for (the eval app's extension=) that its own help lists."""
    user_facing = {p.name for p in (REPO / "configs").iterdir() if p.is_dir() and p.name != "hydra"}
    others = set(chosen_groups("eval")) | set(chosen_groups("probes"))
    assert set(chosen_groups("train")) | others == user_facing
    assert cli.config_groups("model").startswith("model: ") and str(CONFIG_DIR).endswith("configs")


def test_help_into_a_reader_that_stops_early_ends_without_a_traceback():
    """`python -m alibi_lm.train --help | head -1` printed a BrokenPipeError traceback."""
    reader = subprocess.Popen([sys.executable, "-m", "alibi_lm.train", "--help"], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    reader.stdout.close()  # the reader is gone before the help is written
    err = reader.stderr.read()
    assert reader.wait(timeout=300) == 0 and "Traceback" not in err and "Broken pipe" not in err, err
