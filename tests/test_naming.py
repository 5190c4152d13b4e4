"""A training command whose settings differ from its experiment's gets a results folder of its own
(alibi_lm/naming.py), so a trial never replaces or joins committed rows; the budget probes' report labels a
run by what it trained (its config.yaml and status.json), not by the probe's name."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
from conftest import REPO
from forked_app import run_python

from alibi_lm.config import compose, to_job
from alibi_lm.errors import UserError
from alibi_lm.naming import custom_name
from alibi_lm.tasks.budgets import suite_overrides
from alibi_lm.train import NOT_MODEL_KEYS
from alibi_lm.training.run_log import check_committed_run


def named(*args: str) -> list[str]:
    """The overrides custom_name adds to `python -m alibi_lm.train *args`."""
    return custom_name(list(args), NOT_MODEL_KEYS)[len(args):]


def test_the_experiments_own_settings_keep_its_name(capsys):
    assert named("experiment=quick") == []
    assert named("experiment=quick", "position=rope", "seed=2", "train.threads=1", "train.evaluate_after=true",
                 "paths.results=/tmp/r", "logger.wandb.mode=disabled") == []  # scheme, seed, how and where it runs
    assert named("experiment=quick", "train.max_tokens=20480", "name=mine") == []  # an explicit name wins
    assert named("position=rope", "train.max_tokens=20480") == []  # no experiment: no committed folder to protect
    assert capsys.readouterr().out == ""


def test_other_settings_get_a_custom_name_and_say_so(capsys):
    budget = named("experiment=quick", "data=wikitext2", "train.max_tokens=20480", "train.evaluate_after=true")
    assert len(budget) == 2 and budget[0].startswith("name=quick-custom-")
    assert budget[1] == "paths.results=${paths.runs}/${name}/results"  # beside its runs, not where the experiment's results go
    out = capsys.readouterr().out
    assert "train.max_tokens=20480" in out and "configs/experiment/quick.yaml" in out and budget[0] in out
    assert named("experiment=quick", "data=wikitext2", "train.max_tokens=20480") == budget  # the same trial, the same folder
    assert named("experiment=quick", "train.max_tokens=40960") != budget
    assert named("experiment=quick", "eval.max_tokens=2048")[0].startswith("name=quick-custom-")  # changes the scores
    # another L: a folder of its own, one for the whole sweep over L (L is in the rows' key, not in the digest)
    assert named("experiment=cpu-wt2", "train.seq_len=64")[0].startswith("name=cpu-wt2-custom-")
    sweep = named("-m", "experiment=quick", "data=wikitext2", "train.seq_len=32,64", "position=alibi,rope")
    assert sweep == named("experiment=quick", "data=wikitext2", "train.seq_len=32")


def test_hydra_flags_and_their_values_are_not_overrides_and_the_name_goes_beside_the_overrides():
    """`--cfg job` shows the config a command would run: its value is no override, and name= joins the overrides
    (argparse takes Hydra's overrides as one run of arguments: one after a flag's value would be refused)."""
    from alibi_lm.cli import command_overrides

    assert command_overrides(["--cfg", "job", "-m", "experiment=demo", "~logger", "--info"]) == [
        "experiment=demo", "~logger"]
    assert command_overrides(["-i", "config", "--cfg=job", "-cd", "/tmp/a=b", "x=1"]) == ["x=1"]
    assert custom_name(["--cfg", "job", "experiment=demo"], NOT_MODEL_KEYS) == ["--cfg", "job", "experiment=demo"]
    renamed = custom_name(["experiment=quick", "data=wikitext2", "--cfg", "job"], NOT_MODEL_KEYS)
    assert renamed[:2] == ["experiment=quick", "data=wikitext2"] and renamed[2].startswith("name=quick-custom-")
    assert renamed[3:] == ["paths.results=${paths.runs}/${name}/results", "--cfg", "job"]


@pytest.mark.slow
def test_a_custom_name_shows_in_cfg_job_with_the_flag_after_the_overrides():
    shown = run_python(["-m", "alibi_lm.train", "experiment=demo", "train.max_steps=7", "--cfg", "job"], cwd=REPO,
                       timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"^name: demo-custom-[0-9a-f]{8}$", shown.stdout, re.M)


def test_the_validation_cadence_is_a_setting_of_runs_that_stop_on_solving_their_task(tmp_path):
    """A run that ends at the first validation reaching train.stop_at_accuracy ends where its validations fall, so
    another train.eval_every is another experiment there (and another run to resume); elsewhere it changes nothing."""
    from conftest import compose_job
    from omegaconf import OmegaConf

    from alibi_lm.checkpoint import atomic_write_text
    from alibi_lm.train import check_same_run

    assert named("experiment=quick", "train.eval_every=100") == []  # language modelling: validation only
    from alibi_lm.tasks.budgets import suite_overrides

    budget = suite_overrides("passkey", "alibi", "sequential")  # a run of the suite's: the task's budget
    assert named("experiment=tasks", "task=passkey", *budget, "train.eval_every=100") == []  # it never stops early
    stop = ("experiment=tasks", "task=passkey", "train.stop_at_accuracy=0.99")
    assert named(*stop, "train.eval_every=100") != named(*stop)  # with a stop, another cadence is another experiment
    atomic_write_text(tmp_path / "config.yaml", OmegaConf.to_yaml(OmegaConf.structured(compose_job("train", *stop))))
    with pytest.raises(UserError, match="train.eval_every=250 there, 100 now"):
        check_same_run(compose_job("train", *stop, "train.eval_every=100"), tmp_path)
    # train.resume=true may lift the target that ended the run, as it may extend the budget
    check_same_run(compose_job("train", "experiment=tasks", "task=passkey", "train.resume=true",
                               "train.stop_at_accuracy=null", "train.max_steps=8000"), tmp_path)


def test_a_sweep_whose_cells_would_need_different_folders_is_refused():
    with pytest.raises(UserError, match="one command per setting"):
        named("-m", "experiment=quick", "train.lr=1e-3,2e-3")


@pytest.mark.slow
def test_a_trial_run_leaves_the_committed_table_alone_and_its_label_is_what_it_trained(ws, tmp_path):
    from alibi_lm.plans import budget_probes as bp

    results, runs = tmp_path / "results", tmp_path / "runs"
    committed = results / "quick" / "extrapolation.csv"
    committed.parent.mkdir(parents=True)
    committed.write_bytes((REPO / "results" / "quick-7761e15" / "extrapolation.csv").read_bytes())  # a committed table
    before = committed.read_bytes()
    args = ["experiment=quick", "data=wikitext2", f"data.root={ws / 'data'}", f"paths.cache={ws / 'cache'}",
            f"paths.runs={runs}", f"paths.results={results}", "train.seq_len=64", "train.batch_size=2",
            "train.max_tokens=1280", "train.evaluate_after=true", "eval.multipliers=[1]", "eval.max_tokens=256",
            "model.n_layer=1", "model.d_model=32", "model.n_head=2", "model.d_ff=64", "model.adaptive_cutoffs=null",
            "train.progress=false", "train.threads=1", "logger.wandb.mode=disabled"]
    out = run_python(["-m", "alibi_lm.train", *args], {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin",
                                                        "OMP_NUM_THREADS": "1"}, REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert committed.read_bytes() == before  # not replaced, not joined
    (custom,) = [p for p in results.iterdir() if p.name.startswith("quick-custom-")]
    assert f"name={custom.name}" in out.stdout
    rows = pd.read_csv(custom / "extrapolation.csv")
    assert list(rows["eval_len"]) == [64] and list(rows["step"]) == [10]
    run = runs / custom.name / "alibi-L64-seed0"
    assert bp.trained_tokens(run, rows, None) == "1,280"  # 10 steps of 2 x 64, from config.yaml and status.json
    assert bp.trained_tokens(tmp_path / "absent", rows, None) == "step 10 (budget not recorded)"


def test_an_experiment_of_the_users_config_folder_is_named_as_the_packaged_ones(tmp_path, capsys):
    """hydra.searchpath (or Hydra's --config-dir, which the apps pass on as it): the experiment found there is
    the reference of the naming, as a packaged one is."""
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /data: wikitext2\nname: mine\ntrain:\n  lr: 0.001\n")
    searchpath = f"hydra.searchpath=[file://{tmp_path}]"
    assert named("experiment=mine", searchpath) == []
    assert named("experiment=mine", searchpath, "train.lr=0.003")[0].startswith("name=mine-custom-")
    assert "train.lr=0.003" in capsys.readouterr().out


def test_config_dir_flags_become_the_searchpath_beside_the_overrides(tmp_path, monkeypatch):
    from alibi_lm.cli import config_dirs_as_searchpath

    monkeypatch.chdir(tmp_path)
    here = f"file://{tmp_path.resolve()}"
    assert config_dirs_as_searchpath(["x=1", "--cfg", "job"]) == ["x=1", "--cfg", "job"]
    assert config_dirs_as_searchpath(["-cd", ".", "x=1", "--cfg", "job"]) == [
        "x=1", f"hydra.searchpath=[{here}]", "--cfg", "job"]
    (tmp_path / "b").mkdir()
    b = f"file://{(tmp_path / 'b').resolve()}"
    assert config_dirs_as_searchpath(["--cfg", "job", f"--config-dir={tmp_path}"]) == [
        f"hydra.searchpath=[{here}]", "--cfg", "job"]
    assert config_dirs_as_searchpath(["hydra.searchpath=[file:///a]", "-cd", "b", "y=2"]) == [
        "y=2", f"hydra.searchpath=[file:///a,{b}]"]
    with pytest.raises(UserError, match="^--config-dir nowhere is no folder; give the folder that holds your config"):
        config_dirs_as_searchpath(["-cd", "nowhere", "y=2"])  # Hydra refuses it; a searchpath entry it would skip


def test_a_users_experiment_from_config_dir_runs(tmp_path):
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text("# @package _global_\nname: mine\ntrain:\n  lr: 0.00123\n")
    shown = run_python(["-m", "alibi_lm.train", "-cd", tmp_path, "experiment=mine", "--cfg", "job"], cwd=REPO)
    assert shown.returncode == 0, shown.stderr
    assert "name: mine\n" in shown.stdout and "lr: 0.00123" in shown.stdout


PLANNED = ["task=copy", "position=alibi", "seed=0", "train.max_steps=5000", "experiment=tasks", "name=tasks",
           "paths.runs=runs", "train.resume=auto", "train.progress=false"]


def committed_log(results, *events: dict) -> None:
    """results/tasks/RUN_LOG.jsonl as the suite's plan writes it: each step's begin (with its command) and end."""
    folder = results / "tasks"
    folder.mkdir(parents=True)
    (folder / "RUN_LOG.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def job_of(results, *overrides: str):
    return to_job(compose("train", [*PLANNED, f"paths.results={results}", *overrides]))


def test_a_trial_under_the_experiments_own_name_is_refused_where_its_plan_committed_the_run(tmp_path):
    """An explicit name= wins, but where results/<name>/RUN_LOG.jsonl holds the run trained to the end by its plan
    with other settings (a budget, fewer examples a cell), the command is refused before it trains: its rows would
    replace the committed run's. The plan's own command passes, on any device and thread count."""
    command = " ".join(["python", "-m", "alibi_lm.train", *PLANNED])
    committed_log(tmp_path, dict(event="start", argv="scripts/tasks.py --jobs 2"),
                  dict(event="begin", step="train copy-alibi-L64-seed0", command=command),
                  dict(event="end", step="train copy-alibi-L64-seed0", seconds=9.0, status=0))
    check_committed_run(job_of(tmp_path, "train.threads=2", "train.device=cpu", "train.precision=fp32"))
    check_committed_run(job_of(tmp_path, "seed=7"))  # a seed the plan has not trained, with the plan's settings
    # another seed with a changed budget would join the committed seeds' rows as the same experiment's
    with pytest.raises(UserError, match=r"holds committed runs of this task, scheme and L \(seed 0\), trained by its "
                                        r"plan with other settings \(seed 0: train\.max_steps=5000 there, 200 here\)"):
        check_committed_run(job_of(tmp_path, "train.max_steps=200", "seed=7"))
    check_committed_run(job_of(tmp_path, "train.max_steps=200", "position=rope"))  # no committed run of rope
    with pytest.raises(UserError, match=r"holds the committed run copy-alibi-L64-seed0.*train\.max_steps=5000 there, "
                                        r"200 here.*name=<another folder>, or run its plan again "
                                        r"\(`scripts/tasks.py --jobs 2`\)"):
        check_committed_run(job_of(tmp_path, "train.max_steps=200"))
    with pytest.raises(UserError, match=r"eval\.examples=1024 there, 64 here"):
        check_committed_run(job_of(tmp_path, "eval.examples=64"))
    # the run is found by what it trains, not by the folder a command points hydra.run.dir at
    with pytest.raises(UserError, match="holds the committed run copy-alibi-L64-seed0"):
        check_committed_run(job_of(tmp_path, "train.max_steps=200", "hydra.run.dir=runs/tasks/trial"))


def test_a_log_line_cut_short_by_a_kill_is_passed_over(tmp_path):
    """A kill while a record was written (or a merge's conflict markers) leaves a line that is no record: the others
    still say what was committed, and no training command fails on the log."""
    command = " ".join(["python", "-m", "alibi_lm.train", *PLANNED])
    committed_log(tmp_path, dict(event="begin", step="train copy-alibi-L64-seed0", command=command),
                  dict(event="end", step="train copy-alibi-L64-seed0", seconds=9.0, status=0))
    log = tmp_path / "tasks" / "RUN_LOG.jsonl"
    log.write_text(log.read_text() + '{"event": "begin", "step": "train co\n<<<<<<< HEAD\n')
    check_committed_run(job_of(tmp_path, "seed=1"))
    with pytest.raises(UserError, match="train.max_steps=5000 there, 200 here"):
        check_committed_run(job_of(tmp_path, "train.max_steps=200"))


def test_a_plan_training_its_run_again_is_not_refused_by_its_own_earlier_record(tmp_path):
    """The plan logs a step's begin before the step runs: a run trained again under a changed protocol is under way,
    not committed, while it trains."""
    command = " ".join(["python", "-m", "alibi_lm.train", *PLANNED])
    step = "train copy-alibi-L64-seed0"
    committed_log(tmp_path, dict(event="begin", step=step, command=command), dict(event="end", step=step, status=0),
                  dict(event="begin", step=step, command=command.replace("5000", "6000")))
    check_committed_run(job_of(tmp_path, "train.max_steps=6000"))
    # the plan's next seed, under way too: not held to the earlier protocol of the seeds before it
    committed_log(tmp_path / "next", dict(event="begin", step=step, command=command),
                  dict(event="end", step=step, status=0),
                  dict(event="begin", step="train copy-alibi-L64-seed1", command=command.replace("5000", "6000")))
    check_committed_run(job_of(tmp_path / "next", "train.max_steps=6000", "seed=1"))


def test_the_train_app_refuses_the_trial_in_one_line_before_it_trains(tmp_path):
    command = " ".join(["python", "-m", "alibi_lm.train", *PLANNED])
    committed_log(tmp_path, dict(event="begin", step="train copy-alibi-L64-seed0", command=command),
                  dict(event="end", step="train copy-alibi-L64-seed0", seconds=9.0, status=0))
    out = run_python(["-m", "alibi_lm.train", *PLANNED, "train.max_steps=20", f"paths.results={tmp_path}",
                      f"paths.runs={tmp_path / 'runs'}"], cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1 and "train.max_steps=5000 there, 20 here" in out.stderr
    assert not (tmp_path / "runs").exists()  # refused before the run folder was made


def test_fewer_examples_a_cell_make_a_task_run_a_trial_but_not_a_language_models():
    """eval.examples is how many sequences a task cell scores: a run that scores fewer is not the suite's; an LM
    experiment's rows do not depend on it."""
    suite = ["experiment=tasks", "task=copy", "position=alibi", *suite_overrides("copy", "alibi", "sequential")]
    assert named(*suite) == []
    assert named(*suite, "eval.examples=64")[0].startswith("name=tasks-custom-")
    assert named("experiment=quick", "eval.examples=64") == []


def test_a_folder_of_the_users_own_under_a_committed_experiment_goes_beside_its_runs(capsys):
    """experiment=tasks (or cpu-wt2) writes its rows under results/; name=<a folder of the user's> is a trial's
    folder, so its rows go beside its runs (results/ holds committed experiments only), and one line says so. The
    experiment's own name, an explicit paths.results (the plans' for their committed folders), and an experiment whose
    rows go beside its runs anyway keep the command as it is."""
    assert named("experiment=tasks", "task=copy", "name=walk") == ["paths.results=${paths.runs}/${name}/results"]
    assert "note: name=walk is not experiment tasks's own folder, so its rows go beside its runs" in capsys.readouterr().out
    assert named("experiment=cpu-wt2", "name=mine")[0] == "paths.results=${paths.runs}/${name}/results"
    assert named("experiment=tasks", "task=copy", "name=tasks-try", "paths.results=results") == []
    assert named("experiment=tasks", "task=copy", "train.max_steps=5000", "name=tasks") == []
    assert named("experiment=quick", "name=mine") == []  # quick's rows go beside its runs already
