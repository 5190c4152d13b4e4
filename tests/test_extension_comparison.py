"""The extension comparison (alibi_lm/plans/extension/): the runs it wants and in which order, the training commands
of its fine-tunes (RoPE's with Position Interpolation) and references as composed configs, the folders it refuses to
reuse, its dry run, the task models scored with each method (parity with the task evaluation's own rows), and the
tables' columns."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import compose_job

from alibi_lm.errors import UserError
from alibi_lm.plans import extension
from alibi_lm.plans.extension import runs as plan_runs
from alibi_lm.plans.extension.plan import training_seconds
from alibi_lm.plans.extension.runs import Job, jobs, stale_runs
from alibi_lm.plans.extension.tables import columns_of
from alibi_lm.plans.extension.tasks import pending, score_task_run, task_runs, task_table
from alibi_lm.results.task_store import TASKS_CSV, read_task_results

RUNS = Path("runs/extension")


def test_the_comparison_wants_each_schemes_base_runs_then_its_finetunes_then_its_reference():
    names = [j.folder(RUNS).name for j in jobs(["alibi", "rope"], [0, 1], [0], ["rope"])]
    fine = [f"ft{s}x{f}" for s in (2, 4) for f in ("0.01", "0.05", "0.125")]
    assert names == ["alibi-L64-seed0", "alibi-L64-seed1", *[f"alibi-L64-seed0-{f}" for f in fine],
                     "rope-L64-seed0", "rope-L64-seed1", *[f"rope-L64-seed0-{f}-linear" for f in fine], "rope-L256-seed0"]


def command_job(job: Job):
    """The TrainJob that job's training command composes (its hydra.run.dir aside, which only places the folder)."""
    overrides = [o for o in job.command(RUNS)[3:] if not o.startswith("hydra.run.dir=")]
    return compose_job("train", *overrides)


def test_the_training_commands_compose_the_runs_they_name():
    rope = command_job(Job("rope", 1, 4, 0.05)).train
    assert (rope.seq_len, rope.batch_size, rope.init_from, rope.finetune_fraction, rope.finetune_scaling) == (
        256, 8, "runs/extension/rope-L64-seed1", 0.05, "linear")
    alibi = command_job(Job("alibi", 0, 2, 0.125)).train
    assert (alibi.seq_len, alibi.batch_size, alibi.finetune_scaling) == (128, 16, None)  # as it is
    reference = command_job(Job("alibi", 0, 4))
    assert (reference.train.seq_len, reference.train.max_tokens) == (256, 614400 + 76800)  # base + largest fine-tune
    base = command_job(Job("t5", 2))
    assert (base.train.seq_len, base.train.max_steps, base.seed, base.name) == (64, 300, 2, "extension")
    assert f"hydra.run.dir={RUNS}/rope-L64-seed1-ft4x0.05-linear" in Job("rope", 1, 4, 0.05).command(RUNS)
    # FIRE's config derives init_threshold from train.seq_len (L / 4): its fine-tune keeps the parent's 16, which
    # the trainer checks against the parent's checkpoint; a reference from scratch at 4L takes its own 64
    fire, fire_reference = command_job(Job("fire", 0, 2, 0.05)), command_job(Job("fire", 0, 4))
    assert (fire.train.seq_len, fire.model.position_options["init_threshold"]) == (128, 16.0)
    assert fire_reference.model.position_options["init_threshold"] == 64.0
    assert not [a for a in Job("alibi", 0, 2, 0.05).command(RUNS) if a.startswith("position.")]


def fake_run(folder: Path, commits=("abc1234",), seq_len=256, max_tokens=None, record=None) -> None:
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(json.dumps({"train": {"seq_len": seq_len, "max_tokens": max_tokens}}))
    (folder / "status.json").write_text(json.dumps({"status": "completed", "train_commits": list(commits)}))
    if record is not None:
        (folder / "finetune.json").write_text(json.dumps(record))


def test_folders_that_are_not_the_wanted_runs_are_refused_before_any_work(tmp_path, monkeypatch):
    runs = tmp_path / "extension"
    record = dict(parent=str(runs / "rope-L64-seed0"), scale=4.0, fraction=0.05, rescaling="linear")
    fake_run(runs / "rope-L64-seed0-ft4x0.05-linear", record=record)  # what the comparison wants
    fake_run(runs / "rope-L64-seed0-ft2x0.05-linear", record=dict(record, scale=2.0, rescaling=None))  # as is
    fake_run(runs / "rope-L64-seed0-ft2x0.01-linear", commits=["abc1234 (with uncommitted changes)"],
             record=dict(record, scale=2.0, fraction=0.01))
    fake_run(runs / "rope-L256-seed0", max_tokens=614400)
    lines = stale_runs(jobs(["rope"], [0], [0], ["rope"]), runs)
    assert [line.split(" is not")[0] for line in lines] == [
        str(runs / n) for n in ("rope-L64-seed0-ft2x0.01-linear", "rope-L64-seed0-ft2x0.05-linear", "rope-L256-seed0")]
    assert "uncommitted changes" in lines[0] and "rescaling None, wanted 'linear'" in lines[1]
    assert "max_tokens = (256, 614400), wanted (256, 691200)" in lines[2]
    assert all("move it aside or delete it" in line and "\n" not in line for line in lines)
    monkeypatch.setattr(extension, "train", lambda *a: pytest.fail("trained despite a folder to clear"))
    with pytest.raises(UserError, match=r"ft2x0.01-linear is not the run .* \(and 2 more: --dry-run lists them\)"):
        extension.run_all(jobs(["rope"], [0], [0], ["rope"]), runs, tmp_path / "results", 256)

    # the dry run's estimate counts only the folders it would keep: not a reference of another budget's time
    for name, seconds in (("rope-L256-seed0", 60.0), ("rope-L64-seed0-ft4x0.05-linear", 30.0)):
        status = json.loads((runs / name / "status.json").read_text())
        (runs / name / "status.json").write_text(json.dumps(dict(status, train_seconds=seconds)))
    recorded = training_seconds(runs, jobs(["rope"], [0], [0], ["rope"]))
    assert recorded == {"base": [], "reference": [], "finetune": {(4.0, 0.05): [30.0]}}


def test_the_dry_run_lists_every_run_in_order_and_refuses_finetune_seeds_not_trained(tmp_path, capsys):
    extension.main(["--runs", str(tmp_path / "extension"), "--results", str(tmp_path / "results"), "--schemes",
                    "alibi", "--seeds", "0", "--dry-run"])
    out = capsys.readouterr().out
    trained = [line.split(":")[0].strip() for line in out.splitlines() if ": train (" in line]
    assert trained == [j.folder(RUNS).name for j in jobs(["alibi"], [0], [0], ["alibi", "rope"])]
    assert len(trained) == 8 and out.splitlines()[-1].startswith("estimate: ")
    with pytest.raises(SystemExit):
        extension.main(["--seeds", "0", "--finetune-seeds", "1", "--dry-run"])
    assert "--finetune-seeds 1 is not among --seeds [0]" in capsys.readouterr().err


@pytest.mark.parametrize("bad, message", [
    (["--seeds", "0,0"], "argument --seeds: names 0 twice in '0,0'; give each entry once"),
    (["--schemes", "alibi,t5,alibi"], "argument --schemes: names alibi twice"),
    (["--schemes", "t5", "--reference-schemes", "alibi"], "--reference-schemes alibi is not among --schemes t5"),
    (["--report-only"], "argument --report-only: not allowed with argument --dry-run"),
])
def test_flags_that_would_train_twice_or_nothing_are_refused_in_one_line(bad, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        extension.main(["--dry-run", *bad])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_the_default_references_are_those_of_the_schemes_chosen():
    assert extension.parse(["--schemes", "t5"]).reference_schemes == []
    assert extension.parse(["--schemes", "t5,rope"]).reference_schemes == ["rope"]
    assert extension.parse([]).reference_schemes == ["alibi", "rope"]


def test_columns_name_finetunes_with_their_rescaling_and_the_reference_by_its_scale():
    rows = [dict(position=p, train_len=L, eval_len=e, rope_scaling=m, mode="nonoverlapping")
            for p, L, e, m in (("rope", 64, 128, ""), ("rope", 64, 128, "yarn"), ("rope+ft4x0.05-linear", 64, 128, ""),
                               ("alibi+ft2x0.01", 64, 128, ""), ("rope", 256, 128, ""))]
    df = columns_of(pd.DataFrame(rows))
    assert df["method"].tolist() == ["none", "yarn", "ft4x0.05-linear", "ft2x0.01", "scratch4x"]
    assert df["position"].tolist() == ["rope", "rope", "rope", "alibi", "rope"] and set(df["train_len"]) == {64}


def test_the_task_table_gives_wilson_intervals_and_the_effective_length():
    rows = [dict(task="passkey", position="alibi", rope_scaling=m, variant="", seed=0, train_len=16, eval_len=16 * r,
                 exact=e, examples=100) for m, values in (("", (1.0, 0.9, 0.5)), ("streaming", (0.5, 0.4, 0.5)),
                                                        ("rerope", (0.0, 0.1, 0.0)))
            for r, e in zip((1, 2, 4), values)]
    table = task_table(pd.DataFrame(rows))
    none, rerope, streaming = (line for line in table.splitlines() if "| passkey" in line)
    assert "| 1L | 2L | 4L | effective length |" in table
    assert "0.50 [0.40, 0.60]" in none and none.endswith("| 2L | 1 |")  # Wilson(50 of 100); 0.5 < 0.85 x 1.0
    assert "| streaming |" in streaming and streaming.endswith("| 1L | 1 |")  # 0.4 < 0.85 x 0.5 at 2L, whatever 4L
    assert "| rerope |" in rerope and rerope.endswith("| n/a | 1 |")  # nothing at L to keep 85% of


@pytest.fixture(scope="module")
def rope_passkey_run(tmp_path_factory) -> Path:
    """A tiny RoPE passkey run (trained two steps: what it learned does not matter here, only that the comparison
    scores it as the task evaluation does)."""
    from alibi_lm.training.trainer import Trainer

    root = tmp_path_factory.mktemp("task")
    Trainer(compose_job("train", "experiment=tasks", "task=passkey", "position=rope", "model.n_layer=1",
                        "model.d_model=32", "model.d_ff=64", "train.seq_len=32", "train.batch_size=4",
                        "train.max_steps=2", "train.warmup_steps=1", "train.eval_every=2", "train.checkpoint_every=2",
                        "train.progress=false", "train.evaluate_after=false", f"paths.runs={root / 'runs'}"),
            root / "runs" / "passkey-rope-L32-seed0").run()
    return root / "runs" / "passkey-rope-L32-seed0"


def test_task_runs_are_scored_with_every_method_their_scheme_takes(tmp_path, rope_passkey_run, monkeypatch):
    from alibi_lm.eval import task_evaluation

    assert task_runs(str(rope_passkey_run.parent)) == task_runs(str(rope_passkey_run.parent / "passkey-*")) == [rope_passkey_run]
    monkeypatch.setattr(task_evaluation, "git_commit", lambda: "abc1234 (with uncommitted changes)")
    score_task_run(rope_passkey_run, tmp_path / "results", examples=6)
    assert len(pending(rope_passkey_run, tmp_path / "results", 6)) == 10  # a dirty tree's rows: every method again
    monkeypatch.setattr(task_evaluation, "git_commit", lambda: "abc1234")
    score_task_run(rope_passkey_run, tmp_path / "results", examples=6)
    df = read_task_results(tmp_path / "results" / "extension" / TASKS_CSV)
    labels = ["", "dca", "leaky_rerope", "linear", "lm_infinite", "ntk", "rerope", "self_extend", "streaming", "yarn"]
    assert sorted(df["rope_scaling"].unique()) == labels and set(df["variant"]) == {""}
    assert sorted(df["eval_len"].unique()) == [32 * m for m in (1, 2, 4, 8, 16)] and len(df) == 10 * 5
    assert pending(rope_passkey_run, tmp_path / "results", 6) == {}  # a second invocation has nothing to do
    own = task_evaluation.evaluate_task_run(rope_passkey_run, {"multipliers": [1, 2, 4, 8, 16], "examples": 6}, tmp_path / "own",
                            torch.device("cpu"), progress=False)
    mine = df[df["rope_scaling"] == ""].set_index("eval_len")
    for row in (r for r in own if r["variant"] == ""):  # the same sequences, the same teacher-forced scores
        assert (mine.loc[row["eval_len"], "exact"], mine.loc[row["eval_len"], "token_acc"]) == (row["exact"], row["token_acc"])


def test_task_runs_that_are_not_completed_task_runs_are_refused_in_one_line(tmp_path, rope_passkey_run):
    with pytest.raises(UserError, match="no run folder there"):
        task_runs(str(tmp_path / "nothing-*"))
    lm = tmp_path / "lm-run"
    lm.mkdir()
    (lm / "config.yaml").write_text("task_name: lm\n")
    with pytest.raises(UserError, match="is a language-model run"):
        task_runs(str(lm))
    assert plan_runs.completed(rope_passkey_run)


def test_the_report_gives_a_rescaled_finetune_a_column_of_its_own(tmp_path, monkeypatch):
    """A RoPE run and a fine-tune of it with PI (its finetune.json), both scored as the comparison scores them: the
    README's tables hold rope's none and ft4x0.25-linear, and its runs table the fine-tune's budget and rescaling."""
    import shutil

    from conftest import V, fake_run_data, make, write_run

    from alibi_lm.plans.extension.report import report
    from alibi_lm.plans.extension.scoring import evaluate

    fake_run_data(monkeypatch, V, 16 * 8 + 1)
    base = write_run(tmp_path, make("rope"), 16, name="extension")
    tuned = base.with_name("rope-L16-seed0-ft4x0.25-linear")
    shutil.copytree(base, tuned)
    (tuned / "finetune.json").write_text(json.dumps(dict(parent=str(base), parent_train_len=16, parent_tokens=4096,
                                                         parent_step=7, scale=4.0, fraction=0.25, steps=4, tokens=1024,
                                                         rescaling="linear")))
    (tuned / "status.json").write_text(json.dumps({"status": "completed", "train_seconds": 6.0}))
    monkeypatch.setattr("alibi_lm.plans.extension.scoring.methods_for", lambda scheme: ["streaming"])
    for run in (base, tuned):
        evaluate(run, 16, tmp_path / "results", 128)
    with pytest.raises(UserError, match="has no rows yet"):
        report(tmp_path / "empty", "cmd", None, base.parent)
    report(tmp_path / "results", "cmd", None, base.parent)
    readme = (tmp_path / "results" / "extension" / "README.md").read_text()
    perplexity = readme.split("## Perplexity")[1].split("##")[0]
    assert [line.split("|")[2].strip() for line in perplexity.splitlines() if line.startswith("| rope")] == [
        "none", "ft4x0.25-linear", "streaming"]
    assert "| rope-L16-seed0-ft4x0.25-linear | 0.1 |" in readme and "0.25 of 4,096 tokens: 4 steps, linear x4" in readme


def test_a_base_run_trained_with_other_settings_or_from_a_dirty_tree_is_refused(tmp_path):
    """The base runs are checked as the fine-tunes are: one trained with the comparison's settings is reused; one with
    another budget (an earlier TRAIN_STEPS), or trained from uncommitted changes, is named with the fix."""
    from omegaconf import OmegaConf

    from alibi_lm.config import compose, to_job

    runs = tmp_path / "extension"
    wanted = jobs(["alibi"], [0, 1, 2], [], [])
    for job in wanted:
        settings = [a for a in job.command(runs)[3:] if not a.startswith("hydra.")]
        fake_run(job.folder(runs), commits=["abc1234 (with uncommitted changes)"] if job.seed == 2 else ["abc1234"])
        config = OmegaConf.structured(to_job(compose("train", settings)))
        if job.seed == 1:
            config.train.max_tokens = 1000  # an earlier budget
        (job.folder(runs) / "config.yaml").write_text(OmegaConf.to_yaml(config))
    lines = stale_runs(wanted, runs)
    assert [line.split(" is not")[0] for line in lines] == [str(runs / "alibi-L64-seed1"), str(runs / "alibi-L64-seed2")]
    assert "trained with other settings (train.max_tokens=1000 there, " in lines[0]
    assert "uncommitted changes" in lines[1]


def test_a_report_rebuilt_without_the_run_folders_keeps_the_recorded_runs_table(tmp_path):
    """--report-only in a fresh clone (no runs/extension/) replaced the committed table of the runs' training times,
    perplexities and commits, recorded nowhere else, by one line."""
    import shutil

    from conftest import REPO

    from alibi_lm.plans.extension.report import recorded_runs_table, report

    shutil.copytree(REPO / "results" / "extension", tmp_path / "extension")
    before = recorded_runs_table(tmp_path / "extension" / "README.md")
    assert before.startswith("| run | train min |") and before.count("\n") > 20
    report(tmp_path, "python scripts/extension.py --report-only", None, tmp_path / "runs" / "extension")
    assert recorded_runs_table(tmp_path / "extension" / "README.md") == before
    assert recorded_runs_table(tmp_path / "nowhere.md") == "(run folders not on this machine)\n"
