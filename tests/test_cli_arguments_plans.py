"""The plan drivers (scripts/tasks.py, scripts/reproduce.py, scripts/extension.py) refuse bad arguments in one line
(exit 2) before any step runs or anything is written: --steps 0 (once read as each task's budget), a seed that is no
number, --jobs 0, a --name that is not a plain folder name (RUN_INFO.md went outside results/), --seq-len 0, an
unknown --experiment, a zero stride, multiplier or token count."""

from __future__ import annotations

import pytest

from alibi_lm.plans import driver, extension, reproduce, task_suite


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """The drivers' checkout root moved to an empty folder, and steps that would run a failure: a plan that is not
    refused fails its test rather than training, and whatever it would write lands in the folder (checked empty)."""
    for module in (driver, task_suite, reproduce):
        monkeypatch.setattr(module, "ROOT", tmp_path)

    def ran(*_, **__):
        raise AssertionError("the plan's steps ran")

    monkeypatch.setattr(driver, "run_steps", ran)
    return tmp_path


def refused(main, argv: list[str], folder, capsys) -> str:
    """main(argv) exits 2 with one error line and no traceback, and nothing is written to folder: that line."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert stop.value.code == 2 and "Traceback" not in err and len(errors) == 1, err
    assert err.strip() == errors[0], err  # no usage block around it
    assert not any(folder.rglob("*")), sorted(folder.rglob("*"))
    return errors[0]


TASKS = [(["seed=5"], "sets seed, which the plan sets for every run itself"), (["+task=copy"], "use --tasks"),
         (["train.max_steps=9"], "use --steps"), (["paths.runs=x"], "use --runs"),
         (["--steps", "0"], "--steps"), (["--steps", "-3"], "--steps"), (["--seeds", "a"], "--seeds"),
         (["--seeds", "0,-1"], "--seeds"), (["--jobs", "0"], "--jobs"), (["--name", "../x"], "--name='../x'"),
         (["--name", "a/b"], "--name='a/b'"), (["--name", ".."], "--name='..'")]


@pytest.mark.parametrize("argv, named", TASKS, ids=[" ".join(a) for a, _ in TASKS])
def test_tasks_refuses_bad_arguments_before_writing(argv, named, isolated, capsys):
    common = ["--tasks", "copy", "--schemes", "alibi", "--random-schemes", "", "--runs", str(isolated / "runs")]
    assert named in refused(task_suite.main, [*common, *argv], isolated, capsys)


REPRODUCE = [(["--seq-len", "0"], "--seq-len"), (["--experiment", "nosuch"], "unknown experiment 'nosuch'"),
             (["--sliding-stride", "0"], "--sliding-stride"), (["--multipliers", "1,0"], "--multipliers"),
             (["--multipliers", "1,nan"], "--multipliers"), (["--max-tokens", "-5"], "--max-tokens"),
             (["--seeds", "0,x"], "--seeds"), (["--more-seeds", "x"], "--more-seeds"),
             (["--other-lengths", "0"], "--other-lengths"), (["--tokens-per-step", "0"], "--tokens-per-step"),
             (["--data", "wikitext5"], "unknown --data 'wikitext5'; choose from wikitext103,wikitext2"),
             (["--tokens-per-step", "100"], "--tokens-per-step 100 is below L=128"),
             (["--sliding-stride", "100000"], "--sliding-stride 100000 exceeds L=128"),
             (["--rope-scalings", "yarnn"], "unknown --rope-scalings ['yarnn']")]


@pytest.mark.parametrize("argv, named", REPRODUCE, ids=[" ".join(a) for a, _ in REPRODUCE])
def test_reproduce_refuses_bad_arguments_before_any_step(argv, named, isolated, capsys):
    """(--sliding-stride 64 and --tokens-per-step 3000 are fine at L = 128: test_reproduce_takes_what_fits.)"""
    common = ["--dry-run", "--schemes", "alibi", "--seed-schemes", "alibi", "--runs", str(isolated / "runs")]
    assert named in refused(reproduce.main, [*common, *argv], isolated, capsys)


@pytest.mark.parametrize("argv", [["--max-tokens", "0"], ["--max-tokens", "x"], ["--task-examples", "0"]],
                         ids=lambda a: " ".join(a))
def test_extension_refuses_bad_arguments_before_any_step(argv, tmp_path, capsys):
    common = ["--dry-run", "--runs", str(tmp_path / "runs"), "--results", str(tmp_path / "results")]
    assert argv[0] in refused(extension.main, [*common, *argv], tmp_path, capsys)


def test_tasks_refuses_to_train_a_recorded_run_again_with_other_settings(isolated, capsys):
    """--name tasks with another budget: the committed runs of results/tasks/ (RUN_LOG.jsonl) would have their rows
    replaced by a 3-step training's; the suite's own settings are its runs, and plan as before."""
    from conftest import REPO

    (isolated / "results" / "tasks").mkdir(parents=True)
    log = (REPO / "results" / "tasks" / "RUN_LOG.jsonl").read_text()
    (isolated / "results" / "tasks" / "RUN_LOG.jsonl").write_text(log)
    common = ["--tasks", "passkey", "--schemes", "alibi", "--seeds", "0", "--random-schemes", "", "--name", "tasks"]
    with pytest.raises(SystemExit) as stop:
        task_suite.main([*common, "--steps", "3", "--dry-run"])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and "\n" not in err
    assert err.startswith("error: results/tasks/ holds passkey-alibi-L64-seed0 trained with other settings (")
    assert "train.max_steps=8000 there, 3 here" in err and err.endswith("give --name <a folder of its own>")
    with pytest.raises(SystemExit) as stop:  # fewer examples a cell: rows that would replace the committed ones too
        task_suite.main([*common, "--dry-run", "eval.examples=64"])
    assert stop.value.code == 2 and "eval.examples=1024 there, 64 here" in capsys.readouterr().err
    task_suite.main([*common, "--dry-run"])
    assert "train passkey-alibi-L64-seed0: -m alibi_lm.train task=passkey" in capsys.readouterr().out


def test_reproduce_takes_what_fits():
    args = reproduce.arguments(["--dry-run", "--sliding-stride", "64", "--tokens-per-step", "3000"])  # batches of 23
    assert (args.sliding_stride, args.tokens_per_step) == (64, 3000)
    reproduce.arguments(["--dry-run", "--tokens-per-step", "1024", "--other-lengths", "2048", "--length-schemes", ""])
