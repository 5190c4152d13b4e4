"""One name for the evaluation app: `python -m alibi_lm.eval`, configs/eval.yaml and `make eval`. The old names
still work as aliases: the config name `evaluate` (compose("evaluate"), `--config-name evaluate`), resolved in
alibi_lm.config.compose alone, and `make eval-extrapolation`, a target that runs `make eval`'s one recipe."""

from __future__ import annotations

import re
import subprocess

import pytest
from conftest import REPO
from forked_app import run_python
from omegaconf import OmegaConf

from alibi_lm import cli
from alibi_lm.config import compose, config_name, to_job


def run_eval(*args: str) -> subprocess.CompletedProcess:
    return run_python(["-m", "alibi_lm.eval", *args], cwd=REPO, timeout=300)


def make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", *args], cwd=REPO, capture_output=True, text=True, timeout=60)


# ---- the config: configs/eval.yaml, and evaluate as its alias -----------------------------------------------------

def test_the_config_is_one_file_named_after_the_module():
    configs = {p.stem for p in (REPO / "configs").glob("*.yaml")}
    assert "eval" in configs and "evaluate" not in configs  # the alias is no copied file


def test_the_old_name_composes_the_same_config():
    assert config_name("evaluate") == "eval" and config_name("train") == "train"
    overrides = ["eval.multipliers=[1,2]", "extension=self_extend"]
    new, old = compose("eval", overrides), compose("evaluate", overrides)
    # the hydra node too (compared unresolved: == would resolve hydra.sweep.dir's ${now:...} on each side)
    assert OmegaConf.to_container(new) == OmegaConf.to_container(old)
    assert new.hydra.job.config_name == "eval" and new.hydra.runtime.choices["extension"] == "self_extend"
    assert to_job(new) == to_job(old) and to_job(old).eval.multipliers == [1, 2]


@pytest.mark.parametrize("args, resolved", [
    (["-cn", "evaluate", "run=x"], ["-cn", "eval", "run=x"]),
    (["--config-name", "evaluate"], ["--config-name", "eval"]),
    (["--config-name=evaluate", "-m"], ["--config-name=eval", "-m"]),
    (["-cn=evaluate"], ["-cn=eval"]),
    (["-cn", "train"], ["-cn", "train"]),
    (["run=evaluate", "evaluate"], ["run=evaluate", "evaluate"]),  # an override's value, not a config name
])
def test_a_command_line_naming_the_old_config_runs_the_new(args, resolved):
    assert cli.resolve_config_names(args) == resolved


@pytest.mark.slow  # three processes
def test_the_app_run_with_the_old_config_name_runs_the_same_config():
    plain = run_eval("--cfg", "job", "eval.max_tokens=7")
    assert plain.returncode == 0, plain.stderr
    assert "max_tokens: 7" in plain.stdout
    for flag in (["-cn", "evaluate"], ["--config-name=evaluate"]):
        aliased = run_eval(*flag, "--cfg", "job", "eval.max_tokens=7")
        assert (aliased.returncode, aliased.stdout) == (0, plain.stdout), aliased.stderr


def test_an_unknown_config_name_is_one_line_naming_the_apps_configs():
    done = run_eval("-cn", "evalx")
    apps = ", ".join(sorted(p.stem for p in (REPO / "configs").glob("*.yaml")))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [f"error: unknown config 'evalx' (--config-name); did you mean eval? choose one "
                                        f"of {apps}, or leave the flag out to run the app's own"]


# ---- the help and the make targets ---------------------------------------------------------------------------------

def test_the_help_names_the_module_and_both_make_targets():
    done = run_eval("--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("alibi_lm.eval: ")
    assert "\nusage: python -m alibi_lm.eval " in done.stdout
    assert '\n       make eval ARGS="key=value ..."  (or its alias, make eval-extrapolation)\n' in done.stdout


def test_make_eval_and_its_alias_run_the_same_command():
    eval_, alias = make("-n", "eval", "ARGS=run=runs/x eval.split=test"), make("-n", "eval-extrapolation",
                                                                                "ARGS=run=runs/x eval.split=test")
    assert eval_.returncode == alias.returncode == 0, eval_.stderr + alias.stderr
    assert eval_.stdout == alias.stdout
    assert eval_.stdout.splitlines()[-1].split()[1:] == ["-m", "alibi_lm.eval", "run=runs/x", "eval.split=test"]


def test_the_makefile_has_one_eval_recipe_and_make_help_names_the_alias():
    recipes = re.findall(r"^\t.*-m alibi_lm\.eval\b.*$", (REPO / "Makefile").read_text(), re.M)
    assert len(recipes) == 1  # eval-extrapolation depends on eval, it does not copy the recipe
    lines = [re.sub(r"\x1b\[\d+m", "", line) for line in make("help").stdout.splitlines()]  # no colours
    listed = {line.split()[0]: line for line in lines}
    assert "eval" in listed and "python -m alibi_lm.eval" in listed["eval"]
    assert "eval-extrapolation" in listed and "make eval (its alias)" in listed["eval-extrapolation"]
