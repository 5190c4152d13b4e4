"""alibi_lm.finished: a plan driver's in-process answer to "would this train or evaluate command do anything?",
which must say yes whenever the app would train, resume, refuse or score something."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import write_corpus

from alibi_lm.cli import output_dir
from alibi_lm.config import compose, to_job
from alibi_lm.finished import finished

SMALL = ["model.n_layer=1", "model.d_model=32", "model.d_ff=64", "train.seq_len=16", "train.batch_size=4",
         "train.max_steps=4", "train.warmup_steps=1", "train.eval_every=4", "train.checkpoint_every=4",
         "train.progress=false", "train.resume=auto", "eval.multipliers=[1,2]", "paths.runs=runs",
         "paths.results=results"]
TASK = ["experiment=tasks", "name=tasks", "task=copy", "task.symbols=4", "eval.examples=8", *SMALL]
LM = ["name=lm", "data=wikitext2", "data.root=data", "data.cache_dir=cache", "tokenizer=word", "train.eval_tokens=256",
      "train.evaluate_after=true", "eval.max_tokens=600", "logger.wandb.mode=disabled", *SMALL]


def trained(root: Path, args: list[str]) -> Path:
    """Train (and, with train.evaluate_after, score) the run of `python -m alibi_lm.train *args` started in root."""
    before = Path.cwd()
    os.chdir(root)
    try:
        cfg = compose("train", args)
        from alibi_lm.train import train

        train(to_job(cfg), output_dir(cfg, multirun=False))
        return root / output_dir(cfg, multirun=False)
    finally:
        os.chdir(before)


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    """Three finished runs: a task run with learned ALiBi slopes (learned.csv, retrieval.csv), a learned table of
    L rows (no retrieval rows past L: nothing left to measure there) and a language model."""
    root = tmp_path_factory.mktemp("finished")
    write_corpus(root / "data")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "disabled")
        trained(root, [*TASK, "position=alibi", "position.learn_slopes=true"])
        trained(root, [*TASK, "position=learned"])
        trained(root, [*LM, "position=alibi"])
    return root


def without_rows(path: Path, keep) -> pd.DataFrame:
    """Drop the rows of the CSV at path for which keep(df) is False; the rows before (to put back)."""
    rows = pd.read_csv(path, keep_default_na=False)
    rows[keep(rows)].to_csv(path, index=False)
    return rows


def test_a_trained_and_scored_task_run_is_finished_and_every_change_or_gap_is_not(ws):
    learn = [*TASK, "position=alibi", "position.learn_slopes=true"]
    assert finished("train", learn, ws) and finished("train", [*TASK, "position=learned"], ws)
    run = "runs/tasks/copy-alibi+learn_slopes-L16-seed0"
    evaluate = [f"run={run}", "eval.skip_done=true", "eval.multipliers=[1,2]", "eval.examples=8", "paths.results=results"]
    assert finished("eval", evaluate, ws)
    assert not finished("train", [*TASK, "position=alibi"], ws)  # not trained
    # other settings for the same folder: the app refuses them in one line, so the step must run to say so
    assert not finished("train", [*learn, "model.d_ff=128"], ws)
    assert not finished("train", [*learn, "train.resume=true", "train.max_steps=8"], ws)  # trains further
    assert not finished("train", [*learn, "eval.multipliers=[1,2,4]"], ws)  # a cell to score
    assert not finished("eval", [*evaluate, "eval.multipliers=[1,2,4]"], ws)
    assert not finished("eval", [e for e in evaluate if "skip_done" not in e], ws)  # scores everything again
    assert not finished("eval", [*evaluate, "position.scaling=yarn"], ws)  # refused for a task run
    assert not finished("train", learn, ws / "elsewhere")  # relative to the step's folder
    # what compose() does not run: a sweep, another config, a job that changes folder, a device not there
    assert not finished("train", ["-m", *learn], ws) and not finished("train", ["-cn", "evaluate", *learn], ws)
    assert not finished("train", [*learn, "hydra.job.chdir=true"], ws)
    if not torch.cuda.is_available():
        assert not finished("train", [*learn, "train.device=cuda"], ws)
    results = ws / "results" / "tasks"
    for table, lost in (("tasks.csv", lambda df: df.index > 0),  # a cell (a kill between two cells)
                        ("retrieval.csv", lambda df: ~df["run"].str.endswith("learn_slopes-L16-seed0")),
                        ("learned.csv", lambda df: df.index > 0)):
        rows = without_rows(results / table, lost)
        assert not finished("train", learn, ws) and not finished("eval", evaluate, ws), table
        rows.to_csv(results / table, index=False)
        assert finished("train", learn, ws), table
    status = ws / run / "status.json"
    saved = status.read_text()
    status.write_text(json.dumps({**json.loads(saved), "status": "interrupted"}))
    assert not finished("train", learn, ws)
    status.write_text("{not json")  # a damaged folder: the app says what is wrong
    assert not finished("train", learn, ws)
    status.write_text(saved)
    assert finished("train", learn, ws)


def test_a_trained_and_scored_language_model_is_finished_until_a_row_or_its_report_is_missing(ws):
    assert finished("train", [*LM, "position=alibi"], ws)
    evaluate = ["run=runs/lm/alibi-L16-seed0", "eval.skip_done=true", "eval.multipliers=[1,2]", "eval.max_tokens=600",
                "data=wikitext2", "data.root=data", "data.cache_dir=cache", "paths.results=results"]
    assert finished("eval", evaluate, ws)
    assert not finished("train", [*LM, "position=alibi", "data.root=nowhere"], ws)  # the app's data check
    csv, report = ws / "results" / "lm" / "extrapolation.csv", ws / "results" / "lm" / "extrapolation.md"
    rows = without_rows(csv, lambda df: df.index > 0)
    assert not finished("train", [*LM, "position=alibi"], ws) and not finished("eval", evaluate, ws)
    rows.to_csv(csv, index=False)
    os.utime(report, (csv.stat().st_mtime - 10,) * 2)  # rows newer than the report: the app rebuilds it
    assert not finished("eval", evaluate, ws)
    os.utime(report, (csv.stat().st_mtime + 10,) * 2)
    assert finished("eval", evaluate, ws)


def test_a_finished_step_starts_no_process_and_the_steps_after_it_run(ws, tmp_path):
    from alibi_lm.plans import run_record
    from alibi_lm.plans.steps import Step, run_steps

    events, skipped = [], []
    train = [sys.executable, "-m", "alibi_lm.train", *TASK, "position=learned"]  # asked of alibi_lm.finished
    steps = [Step("train learned", train, makes="learned"),
             Step("eval learned", [sys.executable, "-c", "pass"], needs=("learned",), done=lambda: False),
             Step("report", [sys.executable, "-c", "pass"], barrier=True)]
    failed = run_steps(steps, 2, ws, None, lambda s, threads: events.append(("begin", s.name)),
                       lambda s, code, seconds: events.append(("end", s.name, code)), skipped.append)
    assert failed == [] and [s.name for s in skipped] == ["train learned"]
    assert events == [("begin", "eval learned"), ("end", "eval learned", 0), ("begin", "report"), ("end", "report", 0)]
    log = tmp_path / "results" / run_record.RUN_LOG
    run_record.log_event(log, event="start", hardware="CPU", head="aaaaaaa", data="-", omp="1", argv="python")
    run_record.log_event(log, event="skipped", step="train learned")
    assert "found their cells done: 1" in run_record.run_info("exp", log, tmp_path / "runs")


def test_status_counts_the_finished_train_and_evaluate_steps_and_names_the_next_ones(ws, capsys):
    from alibi_lm.plans import reproduce
    from alibi_lm.plans import task_suite as tasks
    from alibi_lm.plans.steps import Step, plan_status, trained_run_finished

    def train(*args):
        return [sys.executable, "-m", "alibi_lm.train", *TASK, *args]

    learned, folder = train("position=learned"), Path("runs/tasks/copy-learned-L16-seed0")
    assert trained_run_finished(learned, folder, ws)() and finished("train", learned[3:], ws)
    assert not trained_run_finished(learned, folder.with_name("elsewhere"), ws)()  # no status.json: not asked
    steps = [Step("train learned", learned), Step("train alibi", train("position=alibi"),
                                                  done=trained_run_finished(train("position=alibi"), folder, ws)),
             Step("probes", [sys.executable, "-m", "alibi_lm.probes", "run=x"]),
             Step("report", [sys.executable, "-m", "alibi_lm.results", "results/tasks"], barrier=True)]
    assert plan_status(steps, ws).splitlines() == [
        "1 of 2 train and evaluate steps finished, 1 left (a step under way counts as left)", "  next: train alibi",
        "2 other step(s) (probes, the report) run each time the plan does and skip what is done"]
    assert "checking" not in capsys.readouterr().err  # no progress-bar frames where stderr is not a terminal
    assert tasks.arguments(["--status"]).status and reproduce.arguments(["--status"]).status


def test_the_plans_name_each_training_step_after_the_folder_the_train_app_writes():
    """trained_run_finished looks for status.json in runs/<name>/<makes>: a plan whose names drifted from the
    train app's folders would never skip a finished run (never skip a wrong one: the app's checks still decide)."""
    from alibi_lm.plans import reproduce
    from alibi_lm.plans import task_suite as tasks

    suite = tasks.plan(tasks.arguments(["--tasks", "flipflop", "--schemes", "alibi,fox+rope", "--seeds", "1"]))
    cpu = reproduce.plan(reproduce.arguments(["--schemes", "alibi,irope", "--seeds", "0", "--length-schemes", "",
                                              "--no-context-probes"]))
    trainings = [s for s in suite + cpu if s.makes]
    assert len(trainings) >= 5 and any("random" in s.makes for s in trainings)
    for step in trainings:
        folder = output_dir(compose("train", step.command[3:]), multirun=False)
        assert folder.name == step.makes and folder.parent.name in ("tasks", "cpu-wt2"), step.name
