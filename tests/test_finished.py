"""alibi_lm.finished: a plan driver's in-process answer to "would this train or evaluate command do anything?",
which must say yes whenever the app would train, resume, refuse or score something."""

from __future__ import annotations

import json

import pandas as pd

from alibi_lm.cli import output_dir
from alibi_lm.config import compose, to_job
from alibi_lm.finished import finished

TRAIN = ["experiment=tasks", "name=tasks", "task=copy", "position=alibi", "model.n_layer=1", "model.d_model=32",
         "model.d_ff=64", "train.seq_len=16", "train.batch_size=4", "train.max_steps=4", "train.warmup_steps=1",
         "train.eval_every=4", "train.checkpoint_every=4", "train.progress=false", "train.resume=auto",
         "eval.multipliers=[1,2]", "eval.examples=8", "paths.runs=runs", "paths.results=results"]
RUN = "runs/tasks/copy-alibi-L16-seed0"


def test_a_trained_and_scored_run_is_finished_and_every_change_or_gap_is_not(tmp_path, monkeypatch):
    from alibi_lm.train import train

    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert not finished("train", TRAIN, tmp_path)  # nothing trained yet
    monkeypatch.chdir(tmp_path)  # the relative paths of the command, as in a step's process
    cfg = compose("train", TRAIN)
    train(to_job(cfg), output_dir(cfg, multirun=False))
    monkeypatch.chdir("/")
    assert str(output_dir(cfg, multirun=False)) == RUN
    assert finished("train", TRAIN, tmp_path)
    evaluate = [f"run={RUN}", "eval.skip_done=true", "eval.multipliers=[1,2]", "eval.examples=8", "paths.results=results"]
    assert finished("eval", evaluate, tmp_path)
    # other settings for the same folder: the app refuses them in one line, so the step must run to say so
    assert not finished("train", [*TRAIN, "model.d_ff=128"], tmp_path)
    assert not finished("train", [*TRAIN, "train.resume=true", "train.max_steps=8"], tmp_path)  # trains further
    assert not finished("train", [*TRAIN, "eval.multipliers=[1,2,4]"], tmp_path)  # a cell to score
    assert not finished("eval", [*evaluate, "eval.multipliers=[1,2,4]"], tmp_path)
    assert not finished("eval", [e for e in evaluate if "skip_done" not in e], tmp_path)  # scores everything again
    assert not finished("train", TRAIN, tmp_path / "elsewhere")  # relative to the step's folder
    csv = tmp_path / "results" / "tasks" / "tasks.csv"
    rows = pd.read_csv(csv, keep_default_na=False)
    rows.iloc[1:].to_csv(csv, index=False)  # a cell lost (a kill between two cells)
    assert not finished("train", TRAIN, tmp_path) and not finished("eval", evaluate, tmp_path)
    rows.to_csv(csv, index=False)
    assert finished("train", TRAIN, tmp_path)
    status = tmp_path / RUN / "status.json"
    status.write_text(json.dumps({**json.loads(status.read_text()), "status": "interrupted"}))
    assert not finished("train", TRAIN, tmp_path)
    status.write_text("{not json")  # a damaged folder: the app says what is wrong
    assert not finished("train", TRAIN, tmp_path)


def test_a_step_found_finished_starts_no_process_and_the_steps_after_it_run(tmp_path):
    import sys

    from scripts import reproduce
    from scripts.steps import Step, run_steps

    events, skipped = [], []
    steps = [Step("train a", [sys.executable, "-c", "raise SystemExit(9)"], makes="a", done=lambda: True),
             Step("eval a", [sys.executable, "-c", "pass"], needs=("a",), done=lambda: False),
             Step("report", [sys.executable, "-c", "pass"], barrier=True, done=lambda: False)]
    failed = run_steps(steps, 2, tmp_path, None, lambda s, threads: events.append(("begin", s.name)),
                       lambda s, code, seconds: events.append(("end", s.name, code)), skipped.append)
    assert failed == [] and [s.name for s in skipped] == ["train a"]
    assert events == [("begin", "eval a"), ("end", "eval a", 0), ("begin", "report"), ("end", "report", 0)]
    log = tmp_path / "results" / reproduce.RUN_LOG
    reproduce.log_event(log, event="start", hardware="CPU", head="aaaaaaa", data="-", omp="1", argv="python")
    reproduce.log_event(log, event="skipped", step="train a")
    assert "found their cells done: 1" in reproduce.run_info("exp", log, tmp_path / "runs")
