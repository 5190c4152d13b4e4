"""make tasks, the second protocol: each task's fixed budget in every run's command, five seeds for the paper's
schemes and NoPE and three for the rest, kept checkpoints for the paper's schemes, the estimate, training.md with the
step of the criterion, and results committed run by run."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO
from forked_app import run_python

from alibi_lm.plans import finished_commit, reproduce, run_record, training_curves
from alibi_lm.plans import task_suite as tasks
from alibi_lm.results.task_store import COLUMNS
from alibi_lm.tasks.budgets import Budget
from alibi_lm.training.run_log import steps_ended_well, steps_under_way


def test_the_plan_gives_each_task_its_budget_and_the_paper_schemes_five_seeds_and_kept_checkpoints():
    steps = tasks.plan(tasks.arguments(["--tasks", "passkey,flipflop", "--schemes", "alibi,fire", "--random-schemes",
                                        "alibi"]))
    names = [s.name for s in steps]
    def per_seed(s):
        return [f"train {r}-L64-seed{s}" for r in ("passkey-alibi", "passkey-fire", "flipflop-alibi", "flipflop-fire",
                                                   "passkey-alibi-random", "flipflop-alibi-random")]

    def later(s):
        return [f"train passkey-alibi-L64-seed{s}", f"train flipflop-alibi-L64-seed{s}"]

    assert names == [*per_seed(0), *per_seed(1), *per_seed(2), *later(3), *later(4), "report"]
    command = {s.name: " ".join(s.command) for s in steps[:-1]}
    assert "train.max_steps=8000 train.keep_checkpoints_every=1000" in command["train passkey-alibi-L64-seed4"]
    assert "train.max_steps=6000 train.keep_checkpoints_every=500" in command["train flipflop-alibi-L64-seed0"]
    assert "keep_checkpoints" not in command["train passkey-fire-L64-seed0"]  # kept for the paper's schemes only
    assert "keep_checkpoints" not in command["train passkey-alibi-random-L64-seed0"]
    assert "train.max_steps=8000" in command["train passkey-alibi-random-L64-seed0"]
    runs, budget = len(steps) - 1, sum(int(c.split("train.max_steps=")[1].split()[0]) for c in command.values())
    # evaluation: 5 lengths of the task and of each of the passkey's 5 depths; the paper's scheme's kept checkpoints
    cells = {"passkey": 5 * 6, "flipflop": 5}
    kept = {"passkey": 8000 // 1000, "flipflop": 6000 // 500}
    scoring = sum(tasks.CELL_SECONDS * cells[name.split()[1].split("-")[0]] + tasks.RUN_SECONDS
                  + tasks.KEPT_SECONDS * (kept[name.split()[1].split("-")[0]] if "keep_checkpoints" in c else 0)
                  for name, c in command.items())
    hours = (budget * tasks.SECONDS_PER_STEP + scoring) / 3600
    assert tasks.estimate(steps).startswith(f"estimate: {runs} run(s) to train ({budget:,} training "
                                            f"steps): about {hours:.0f} h of one-thread time, {scoring / 3600:.0f} h "
                                            f"of it evaluation")


def test_a_task_without_a_chosen_budget_is_one_line_unless_steps_are_given(capsys, monkeypatch):
    monkeypatch.delitem(tasks.BUDGETS, "mqar")  # a task whose probes have not chosen its budget yet
    with pytest.raises(SystemExit) as stopped:
        tasks.arguments(["--tasks", "mqar"])
    assert stopped.value.code == 2 and "task(s) mqar have no budget chosen yet" in capsys.readouterr().err
    args = tasks.arguments(["--tasks", "mqar", "--steps", "500", "--schemes", "alibi", "--seeds", "0",
                            "--random-schemes", ""])
    step = tasks.plan(args)[0]
    assert args.name == "tasks-custom" and "train.max_steps=500" in step.command and \
        not any(a.startswith("train.keep_checkpoints_every") for a in step.command)


def test_the_whole_suite_has_every_synthetic_task_and_mqar_trains_at_its_own_depth():
    done = run_python(["scripts/tasks.py", "--dry-run", "--schemes", "nope,rope"], cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout.splitlines()
    # (5 seeds of each + 3 randomized of RoPE's) x 4 tasks: NoPE has no positions to randomize
    out = [line for line in out if not line.startswith("note: ")]  # the runs it would train again, if committed
    assert out[0].startswith("estimate: 52 run(s)") and out[-1].startswith("report")
    assert not any("nope-random" in line for line in out) and any("rope-random" in line for line in out)
    assert tasks.arguments([]).tasks == ["passkey", "mqar", "copy", "flipflop"]  # every task has a budget now
    mqar = [line for line in out if line.startswith("train mqar-nope-L64-seed0:")]
    assert len(mqar) == 1 and "model.n_layer=4" in mqar[0] and "train.max_steps=5000" in mqar[0]


def test_training_md_gives_exact_match_the_budget_and_the_step_of_the_criterion(tmp_path):
    runs, results = tmp_path / "runs" / "tasks", tmp_path / "results" / "tasks"

    def curves() -> str:  # training.csv updated from the runs here, training.md rebuilt from it: its text
        training_curves.training_curves(results, runs)
        return (results / "training.md").read_text()

    run = runs / "flipflop-alibi-L64-seed0"
    run.mkdir(parents=True)
    (run / "log.jsonl").write_text("\n".join(json.dumps(r) for r in (
        dict(step=250, loss=2.0, val_exact=0.5), dict(step=500, loss=0.1, val_exact=0.96),
        dict(step=750, loss=0.01, val_exact=0.94))) + "\n")
    (run / "status.json").write_text(json.dumps(dict(status="completed", steps=750, train_seconds=120.0)))
    old = runs / "copy-alibi-L64-seed0"  # a first-protocol run: answer-token accuracy, an early stop
    old.mkdir()
    (old / "log.jsonl").write_text(json.dumps(dict(step=250, loss=2.0, val_acc=0.99)) + "\n")
    (old / "status.json").write_text(json.dumps(dict(status="completed", steps=4000, solved_at_step=250)))
    results.mkdir(parents=True)
    text = curves()
    assert "| run | 250 | 500 | 750 | budget | learned at | last loss | train min | eval min |" in text
    assert "| flipflop-alibi-L64-seed0 | 0.50 | 0.96 | 0.94 | 750 | 500 | 0.010 | 2.0 | 0.0 |" in text
    assert "| copy-alibi-L64-seed0 |  |  |  | 4000 |  | 2.000 |  | 0.0 |" in text
    table = pd.read_csv(results / "training.csv")
    assert table.loc[table["run"] == "copy-alibi-L64-seed0", "val_acc"].tolist() == [0.99]
    (run / "status.json").write_text(json.dumps(dict(status="completed", steps=750, learned_at_step=750)))
    assert "| 750 | 750 |" in curves()  # status.json's record is the one shown
    # the run stopped part-way here while another machine trained it (its rows came back): the committed curve stays
    (run / "status.json").write_text(json.dumps(dict(status="interrupted", steps=250)))
    (run / "log.jsonl").write_text(json.dumps(dict(step=250, loss=2.5, val_exact=0.1)) + "\n")
    assert "| flipflop-alibi-L64-seed0 | 0.50 | 0.96 | 0.94 | 750 | 750 |" in curves()
    unfinished = runs / "passkey-alibi-L64-seed0"  # under way here, trained nowhere else: its curve so far
    unfinished.mkdir()
    (unfinished / "log.jsonl").write_text(json.dumps(dict(step=250, loss=2.5, val_exact=0.3)) + "\n")
    assert "| passkey-alibi-L64-seed0 *(under way)* | 0.30 |" in curves()
    assert "| flipflop-alibi-L64-seed0 | 0.50 |" in curves()  # trained elsewhere: not under way
    # trained to the end here, its evaluation still running (RUN_LOG: begun, not ended), its curve already in training.csv
    (results / "RUN_LOG.jsonl").write_text("\n".join(json.dumps(e) for e in (
        dict(event="begin", step="train copy-alibi-L64-seed0"), dict(event="begin", step="train flipflop-alibi-L64-seed0"),
        dict(event="end", step="train flipflop-alibi-L64-seed0", status=0))) + "\n")
    text = curves()
    assert "| copy-alibi-L64-seed0 *(under way)* |" in text and "| flipflop-alibi-L64-seed0 | 0.50 |" in text
    assert "| passkey-alibi-L64-seed0 *(under way)* | 0.30 |" in text  # its curve written before: still under way
    (unfinished / "log.jsonl").write_text("\n".join(json.dumps(dict(step=s, loss=2.5, val_exact=v))
                                                   for s, v in ((250, 0.3), (500, 0.7))) + "\n")
    assert "| passkey-alibi-L64-seed0 *(under way)* | 0.30 | 0.70 |" in curves()  # not stale


def git(*args, cwd) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout


@pytest.fixture
def checkout(tmp_path, monkeypatch) -> Path:
    """A git checkout for the suite (tasks.ROOT) whose first commit holds other.txt ("v1") and a .gitignore as
    the project's (lock files under results/); commits need no identity of the machine's."""
    monkeypatch.setattr(tasks, "ROOT", tmp_path)
    for key in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL"):
        monkeypatch.setenv(key, "t")
    git("init", "-q", cwd=tmp_path)
    (tmp_path / "other.txt").write_text("v1\n")
    (tmp_path / ".gitignore").write_text("results/**/.lock\n")
    git("add", "other.txt", ".gitignore", cwd=tmp_path)
    git("commit", "-qm", "start", cwd=tmp_path)
    return tmp_path


def test_commit_results_commits_the_results_folder_alone_when_runs_finished(checkout):
    tmp_path = checkout
    (tmp_path / "other.txt").write_text("changed, not to be committed\n")
    folder = tmp_path / "results" / "tasks"
    folder.mkdir(parents=True)
    rows = [dict(task="flipflop", task_options="", position="alibi", positions="sequential", train_len=64,
                 eval_len=64, variant="", seed=0, run="runs/tasks/flipflop-alibi-L64-seed0", weights="w")]
    pd.DataFrame(rows).reindex(columns=COLUMNS).to_csv(folder / "tasks.csv", index=False)
    events = [dict(event="begin", step="train flipflop-alibi-L64-seed0"), dict(event="begin", step="report")]
    (folder / "RUN_LOG.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    # its first cells are written, but its step (kept checkpoints, retrieval) has not ended: nothing to commit yet
    assert tasks.commit_results("tasks", {}) == {} and len(git("log", "--format=%s", cwd=tmp_path).splitlines()) == 1
    with open(folder / "RUN_LOG.jsonl", "a") as log:
        log.write(json.dumps(dict(event="end", step="report", seconds=1.0, status=0)) + "\n")  # not a run
        log.write(json.dumps(dict(event="end", step="train flipflop-alibi-L64-seed0", seconds=9.0, status=0)) + "\n")
    done = tasks.commit_results("tasks", {})
    assert set(done) == {"flipflop-alibi-L64-seed0"}
    log = git("log", "--format=%s", cwd=tmp_path).splitlines()
    assert log[0] == "tasks: flipflop-alibi-L64-seed0 (1 runs in results/tasks)"
    assert git("show", "--name-only", "--format=", "HEAD", cwd=tmp_path).split() == ["results/tasks/RUN_LOG.jsonl",
                                                                                      "results/tasks/tasks.csv"]
    assert "other.txt" in git("status", "--porcelain", cwd=tmp_path)  # left as it was
    assert tasks.commit_results("tasks", done) == done and len(git("log", "--format=%s", cwd=tmp_path).splitlines()) == 2
    with open(folder / "RUN_LOG.jsonl", "a") as log:  # a step that failed is not finished
        log.write(json.dumps(dict(event="end", step="train copy-alibi-L64-seed0", seconds=9.0, status=1)) + "\n")
    assert tasks.commit_results("tasks", done) == done and len(git("log", "--format=%s", cwd=tmp_path).splitlines()) == 2
    with open(folder / "RUN_LOG.jsonl", "a") as log:  # the next invocation skips it as done: no new end to commit
        log.write(json.dumps(dict(event="skipped", step="train flipflop-alibi-L64-seed0")) + "\n")
    assert tasks.commit_results("tasks", done) == done and len(git("log", "--format=%s", cwd=tmp_path).splitlines()) == 2
    with open(folder / "RUN_LOG.jsonl", "a") as log:  # trained again (another budget): under way, then ended anew
        log.write(json.dumps(dict(event="begin", step="train flipflop-alibi-L64-seed0")) + "\n")
    assert tasks.commit_results("tasks", done) == {} and len(git("log", "--format=%s", cwd=tmp_path).splitlines()) == 2
    with open(folder / "RUN_LOG.jsonl", "a") as log:
        log.write(json.dumps(dict(event="end", step="train flipflop-alibi-L64-seed0", seconds=9.0, status=0)) + "\n")
    (folder / "tasks.csv").write_text((folder / "tasks.csv").read_text() + "\n")
    assert set(tasks.commit_results("tasks", done)) == {"flipflop-alibi-L64-seed0"}
    assert len(git("log", "--format=%s", cwd=tmp_path).splitlines()) == 3


def test_a_commit_leaves_out_the_rows_of_a_run_still_being_scored_and_the_report_counts_only_finished_runs(checkout):
    """--jobs 2: a run's step ends while the other run's cells are being scored. The commit holds the finished run's
    rows and a report built from them alone; the working tree keeps the other run's rows for its step to go on, and
    the checkout's index matches the new commit."""
    tmp_path = checkout
    folder = tmp_path / "results" / "tasks"
    folder.mkdir(parents=True)
    finished, scoring = "runs/tasks/flipflop-alibi-L64-seed0", "runs/tasks/copy-alibi-L64-seed0"
    for table in ("tasks.csv", "over_training.csv"):  # the committed suite's rows of two runs, as written
        rows = pd.read_csv(REPO / "results" / "tasks" / table, dtype=str)
        rows[rows["run"].isin([finished, scoring])].to_csv(folder / table, index=False)
    begun = dict(event="begin", command="python -m alibi_lm.train ...", commit="abc1234")
    events = [dict(begun, step="train flipflop-alibi-L64-seed0"), dict(begun, step="train copy-alibi-L64-seed0"),
              dict(begun, step="train passkey-alibi-L64-seed0"),  # just begun: a status.json, no row anywhere yet
              dict(event="end", step="train flipflop-alibi-L64-seed0", seconds=9.0, status=0)]
    (folder / "RUN_LOG.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    learned = pd.read_csv(REPO / "results" / "tasks-d718115" / "learned.csv", dtype=str).head(2)
    learned.assign(run=scoring).to_csv(folder / "learned.csv", index=False)  # written before the run's first cell
    (folder / ".tasks.csv.0123456789ab.tmp").write_text("half a table being written\n")  # another writer's
    curves = pd.read_csv(REPO / "results" / "tasks" / "training.csv", dtype=str)  # both curves, the copy one so far
    curves = curves[curves["run"].isin([Path(finished).name, Path(scoring).name])]
    curves.loc[curves["run"] == Path(scoring).name, "learned_at"] = None  # not met yet: a blank in an integer column
    curves.to_csv(folder / "training.csv", index=False)
    (folder / "training.md").write_text(training_curves.training_report(folder, {Path(scoring).name}))
    for run, step in ((finished, 6000), (scoring, 2500), ("runs/tasks/passkey-alibi-L64-seed0", 0)):  # each cost
        (tmp_path / run).mkdir(parents=True)
        (tmp_path / run / "status.json").write_text(json.dumps(dict(step=step, train_seconds=60.0 * step / 500)))
    run_record.write_run_info("tasks", folder / "RUN_LOG.jsonl", tmp_path / "runs" / "tasks")
    before = {table: (folder / table).read_bytes() for table in ("tasks.csv", "over_training.csv", "learned.csv",
                                                                "training.csv", "training.md", "RUN_INFO.md")}

    assert set(tasks.commit_results("tasks", {})) == {"flipflop-alibi-L64-seed0"}
    message = git("log", "-1", "--format=%s", cwd=tmp_path)
    assert message == ("tasks: flipflop-alibi-L64-seed0 (1 runs in results/tasks) (without the rows of "
                       "copy-alibi-L64-seed0, passkey-alibi-L64-seed0: under way)\n")
    for table in ("tasks.csv", "over_training.csv"):
        committed = pd.read_csv(io.StringIO(git("show", f"HEAD:results/tasks/{table}", cwd=tmp_path)))
        assert set(committed["run"]) == {finished} and len(committed) > 0
        assert (folder / table).read_bytes() == before[table]  # the run under way keeps its rows here
    assert len(pd.read_csv(io.StringIO(git("show", "HEAD:results/tasks/learned.csv", cwd=tmp_path)))) == 0
    assert (folder / "learned.csv").read_bytes() == before["learned.csv"]
    curve = pd.read_csv(io.StringIO(git("show", "HEAD:results/tasks/training.csv", cwd=tmp_path)), dtype=str)
    assert set(curve["run"]) == {"flipflop-alibi-L64-seed0"} and set(curve["learned_at"]) == {"500"}  # not 500.0
    training_md = git("show", "HEAD:results/tasks/training.md", cwd=tmp_path)
    minutes = pd.read_csv(folder / "tasks.csv").query("run == @finished")["wall_s"].sum() / 60
    assert "copy-alibi" not in training_md and f"| {minutes:.1f} |" in training_md.split("flipflop-alibi-L64-seed0")[1]
    assert "| copy-alibi-L64-seed0 *(under way)* |" in before["training.md"].decode()  # the working tree's says so
    assert all((folder / t).read_bytes() == before[t] for t in ("training.csv", "training.md", "RUN_INFO.md"))
    info = git("show", "HEAD:results/tasks/RUN_INFO.md", cwd=tmp_path)  # its cost rows: of the finished run alone
    assert "| flipflop-alibi-L64-seed0 | 6000 |" in info and "| copy-alibi-L64-seed0 | 2500 |" not in info
    assert "| passkey-alibi-L64-seed0 |" not in info
    assert "| copy-alibi-L64-seed0 | 2500 |" in (written := before["RUN_INFO.md"].decode())
    assert "| passkey-alibi-L64-seed0 | 0 |" in written
    assert info.split("Cost of each run")[0] == before["RUN_INFO.md"].decode().split("Cost of each run")[0]  # the log
    files = set(git("ls-tree", "-r", "--name-only", "HEAD", cwd=tmp_path).split())
    assert "results/tasks/tasks-flipflop-L64.png" in files and "results/tasks/tasks-copy-L64.png" not in files
    assert not any(name.endswith((".lock", ".tmp")) for name in files)
    report = git("show", "HEAD:results/tasks/tasks.md", cwd=tmp_path)
    assert "## flipflop, L = 64" in report and "## copy" not in report
    assert git("diff", "--cached", "--name-only", cwd=tmp_path) == ""  # the index is the new commit's
    # the other run's step ends: its rows are committed with it
    with open(folder / "RUN_LOG.jsonl", "a") as log:
        log.write(json.dumps(dict(event="end", step="train copy-alibi-L64-seed0", seconds=9.0, status=0)) + "\n")
    assert set(tasks.commit_results("tasks", {"flipflop-alibi-L64-seed0": 2})) == {"flipflop-alibi-L64-seed0",
                                                                                  "copy-alibi-L64-seed0"}
    assert git("show", "HEAD:results/tasks/tasks.csv", cwd=tmp_path).encode() == before["tasks.csv"]


def test_a_commit_made_by_someone_else_while_the_folder_is_copied_is_kept(checkout, monkeypatch):
    """The suite's commit goes on top of the HEAD its copy was read from only if HEAD is still there: a commit made
    meanwhile (by hand, or by another plan) is never undone; the suite's is made again on top of it."""
    tmp_path = checkout
    monkeypatch.setattr(tasks.time, "sleep", lambda seconds: None)
    folder = tmp_path / "results" / "tasks"
    folder.mkdir(parents=True)
    end = [dict(event="begin", step="train flipflop-alibi-L64-seed0"),
           dict(event="end", step="train flipflop-alibi-L64-seed0", seconds=9.0, status=0)]
    (folder / "RUN_LOG.jsonl").write_text("".join(json.dumps(e) + "\n" for e in end))
    copy, calls = finished_commit.finished_copy, []

    def copy_while_someone_commits(root, folder, into):
        if not calls:  # the first attempt only
            (tmp_path / "other.txt").write_text("v2\n")
            git("commit", "-qam", "someone else's", cwd=tmp_path)
        calls.append(1)
        return copy(root, folder, into)

    monkeypatch.setattr(finished_commit, "finished_copy", copy_while_someone_commits)
    assert set(tasks.commit_results("tasks", {})) == {"flipflop-alibi-L64-seed0"} and len(calls) == 2
    log = git("log", "--format=%s", cwd=tmp_path).splitlines()
    assert log == ["tasks: flipflop-alibi-L64-seed0 (1 runs in results/tasks)", "someone else's", "start"]
    assert git("show", "HEAD:other.txt", cwd=tmp_path) == "v2\n" and git("status", "--porcelain", cwd=tmp_path) == ""


def test_extra_overrides_label_the_run_and_are_checked_against_the_tasks(capsys):
    """An option given as an extra override labels the run (fox+gate_bias_init5); a task's option applies to the
    tasks chosen, and one that does not take it stops the plan in one line."""
    probe = ["--tasks", "passkey", "--seeds", "0", "--random-schemes", ""]
    steps = tasks.plan(tasks.arguments([*probe, "--schemes", "fox", "position.gate_bias_init=5"]))
    assert [step.name for step in steps] == ["train passkey-fox+gate_bias_init5-L64-seed0", "report"]
    steps = tasks.plan(tasks.arguments(["--tasks", "copy", "--steps", "500", "--seeds", "0", "--random-schemes", "",
                                        "--schemes", "alibi", "task.alphabet=64"]))
    assert [step.name for step in steps] == ["train copy-alibi-L64-seed0", "report"]
    with pytest.raises(SystemExit) as stopped:
        tasks.arguments(["--tasks", "copy,mqar", "--steps", "500", "--seeds", "0", "--schemes", "alibi",
                         "task.alphabet=64"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert stopped.value.code == 2 and "error: alibi on task=mqar cannot take the extra overrides task.alphabet=64" in last
    with pytest.raises(SystemExit) as stopped:  # a key no cell has: the app's own line, with its "did you mean"
        tasks.arguments([*probe, "--schemes", "alibi,rope", "trian.lr=3"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert stopped.value.code == 2 and "the extra overrides trian.lr=3 fit no run of the plan: unknown config key " \
        "'trian' (misspelled?); did you mean train?" in last


def test_the_suites_flags_are_checked_before_any_step(capsys):
    """A list naming an entry twice would train its runs twice; --dry-run and --status each run nothing else;
    a negative start limit or no job is no plan."""
    for bad, message in ((["--seeds", "0,1,1"], "--seeds names 1 twice; give each entry once"),
                         (["--tasks", "copy,copy"], "--tasks names copy twice"),
                         (["--dry-run", "--status"], "argument --status: not allowed with argument --dry-run"),
                         (["--stop-starting-after", "-3"], "argument --stop-starting-after: must be a number >= 0"),
                         (["--jobs", "0"], "argument --jobs: must be an integer >= 1, got '0'")):
        with pytest.raises(SystemExit) as stopped:
            tasks.arguments(["--schemes", "alibi", *bad])
        err = capsys.readouterr().err
        assert stopped.value.code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_a_task_of_its_own_depth_trains_every_scheme_at_it_and_irope_keeps_its_last_layer_nope(monkeypatch, capsys):
    monkeypatch.setitem(tasks.BUDGETS, "copy", Budget(4000, 500, layers=4))
    steps = tasks.plan(tasks.arguments(["--tasks", "copy,flipflop", "--schemes", "alibi,irope", "--seeds", "0",
                                        "--random-schemes", "", "--name", "tasks-depth"]))  # not the suite's protocol
    command = {s.name: s.command for s in steps[:-1]}
    assert list(command) == ["train copy-alibi-L64-seed0", "train copy-rope+nope4-L64-seed0",
                             "train flipflop-alibi-L64-seed0", "train flipflop-rope+nope2-L64-seed0"]
    assert {"model.n_layer=4", "model.nope_every=4", "train.max_steps=4000"} <= set(command["train copy-rope+nope4-L64-seed0"])
    assert "train.keep_checkpoints_every=500" in command["train copy-alibi-L64-seed0"]
    assert not any(a.startswith("model.n_layer") for a in command["train flipflop-rope+nope2-L64-seed0"])
    # --schemes irope: the plan says what its runs are named by, once
    assert capsys.readouterr().out.count("note: irope's runs and rows are named rope+nope2, rope+nope4 (") == 1


def test_a_step_whose_work_a_later_invocation_found_done_has_ended_well(tmp_path):
    """A step stopped by a signal after its last row (exit 75), which the next invocation skips as done, has ended
    well (training.md does not call it under way, --commit and --keep-committed count it); a failed step, or one begun
    and never ended or skipped, has not."""
    events = [dict(event="begin", step="train a"), dict(event="end", step="train a", seconds=9.0, status=75),
              dict(event="skipped", step="train a"),
              dict(event="begin", step="train b"), dict(event="end", step="train b", seconds=9.0, status=1),
              dict(event="begin", step="train c"),
              dict(event="begin", step="train d"), dict(event="end", step="train d", seconds=9.0, status=0),
              dict(event="begin", step="train e"), dict(event="end", step="train e", seconds=9.0, status=0),
              dict(event="begin", step="train e")]  # e trained again: under way until it ends again
    log = tmp_path / "RUN_LOG.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in events))
    assert steps_ended_well(log) == {"train a", "train d"}
    assert steps_under_way(log) == {"train b", "train c", "train e"}


def test_the_estimate_times_a_run_by_its_settings_recorded_runs_else_its_tasks_and_leaves_out_done_runs(
        tmp_path, monkeypatch):
    """Only runs timed whole in one attempt count (a resumed run's last attempt timed its rest; a run begun again is
    under way); a run takes the median of its setting's (the run less its seed, same budget), else of its task's with
    the same kept checkpoints and budget, else the constant model; the runs whose step is done are not counted."""
    monkeypatch.setattr(tasks, "ROOT", tmp_path)
    kept = "task=passkey train.max_steps=8000 train.keep_checkpoints_every=1000"
    plain = "task=passkey train.max_steps=8000"

    def run(name, *attempts, command=kept):
        return [e for seconds, status in attempts for e in (dict(event="begin", step=f"train {name}",
                command=f"python -m alibi_lm.train {command}"), dict(event="end", step=f"train {name}",
                seconds=seconds, status=status))]
    events = [*run("passkey-alibi-L64-seed1", (36000.0, 0)), *run("passkey-alibi-L64-seed2", (108000.0, 0)),
              *run("passkey-alibi-L64-seed3", (40000.0, 0)),
              *run("passkey-alibi-L64-seed4", (60.0, 75), (1.0, 0)),  # stopped, then its rest only
              *run("passkey-alibi-L64-seed5", (500.0, 0)), dict(event="begin", step="train passkey-alibi-L64-seed5"),
              *run("passkey-alibi-L64-seed6", (1.0, 0),
                   command="task=passkey train.max_steps=200 train.keep_checkpoints_every=100"),
              *run("passkey-t5-L64-seed0", (360000.0, 0)), *run("passkey-t5-L64-seed2", (9.0, 1)),  # failed
              *run("passkey-sandwich-L64-seed0", (25200.0, 0), command=plain), dict(event="skipped", step="report")]
    (tmp_path / "results" / "tasks").mkdir(parents=True)
    (tmp_path / "results" / "tasks" / "RUN_LOG.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    recorded = tasks.recorded_seconds("tasks")
    assert dict(recorded.by_setting) == {("passkey-alibi-L64", "8000"): [36000.0, 108000.0, 40000.0],
                                         ("passkey-alibi-L64", "200"): [1.0], ("passkey-t5-L64", "8000"): [360000.0],
                                         ("passkey-sandwich-L64", "8000"): [25200.0]}
    assert dict(recorded.by_task) == {("passkey", True, "8000"): [36000.0, 108000.0, 40000.0, 360000.0],
                                      ("passkey", True, "200"): [1.0], ("passkey", False, "8000"): [25200.0]}
    steps = tasks.plan(tasks.arguments(["--tasks", "passkey", "--schemes", "alibi,fire", "--seeds", "0",
                                        "--random-schemes", ""]))
    # ALiBi: its setting's median, 40,000 s (not its task's 74,000); FIRE: the passkey's runs without kept
    # checkpoints, 25,200 s
    assert tasks.estimate(steps, recorded, jobs=3).startswith(
        "estimate: 2 run(s) to train (16,000 training steps): about 18 h of one-thread time (6 h at --jobs 3): 1 at "
        "the median wall time of their setting's runs")
    assert "records whole, 1 at that of their task's" in tasks.estimate(steps, recorded)
    del recorded.by_setting[("passkey-alibi-L64", "8000")]  # ALiBi by its task's runs with kept checkpoints
    assert "about 28 h of one-thread time: 0 at the median" in tasks.estimate(steps, recorded)
    del recorded.by_task[("passkey", False, "8000")]  # FIRE by the model: 8,000 steps and 30 cells
    fire = 8000 * tasks.SECONDS_PER_STEP + 30 * tasks.CELL_SECONDS + tasks.RUN_SECONDS
    assert f"about {(74000 + fire) / 3600:.0f} h of one-thread time" in tasks.estimate(steps, recorded)
    assert "; 1 at 0.16 s a step" in tasks.estimate(steps, recorded)
    steps[0].done = lambda: True  # ALiBi trained and scored here
    left = tasks.estimate(steps, recorded)
    assert left.startswith(f"estimate: 1 run(s) to train (8,000 training steps): about {fire / 3600:.0f} h") and \
        "the plan's 1 run(s) trained and scored here already are not counted" in left
    (tmp_path / "runs" / "tasks" / "passkey-fire-L64-seed0").mkdir(parents=True)  # stopped: still to train
    (tmp_path / "runs" / "tasks" / "passkey-fire-L64-seed0" / "status.json").write_text('{"status": "stopped"}')
    assert tasks.estimate(steps, recorded).startswith("estimate: 1 run(s) to train")


def test_a_commit_that_fails_says_so_and_is_tried_again_at_the_next_finished_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tasks, "ROOT", tmp_path)  # no git repository here: every add fails
    monkeypatch.setattr(tasks.time, "sleep", lambda seconds: None)
    folder = tmp_path / "results" / "tasks"
    folder.mkdir(parents=True)
    end = dict(event="end", step="train flipflop-alibi-L64-seed0", seconds=9.0, status=0)
    (folder / "RUN_LOG.jsonl").write_text(json.dumps(end) + "\n")
    assert tasks.commit_results("tasks", {}) == {}  # still to commit
    assert "warning: results/tasks not committed for a minute (git read-tree failed)" in capsys.readouterr().err


@pytest.mark.parametrize("task, scheme, random", [("passkey", "alibi", False), ("mqar", "rope", False),
                                                  ("copy", "fire", False), ("flipflop", "t5", True),
                                                  ("mqar", "sinusoidal", True)])
def test_a_run_by_hand_is_the_suites_only_with_the_tasks_budget(task, scheme, random):
    """experiment=tasks alone trains 4,000 steps: such a run by hand is a trial of its own (it once trained into
    results/tasks/, replacing the suite's 8,000-step passkey rows); with the task's budget as the suite gives it
    (tasks/budgets.py suite_overrides), it trains the suite's model and is the suite's run."""
    from alibi_lm.naming import custom_name
    from alibi_lm.tasks.budgets import suite_overrides
    from alibi_lm.train import NOT_MODEL_KEYS

    steps = tasks.plan(tasks.arguments(["--tasks", task, "--schemes", scheme, "--seeds", "1",
                                        "--random-schemes", scheme if random else ""]))
    planned = steps[-2].command[3:]  # the last run: the randomized one where asked for
    positions = ["train.positions=random", "train.max_position=1024"] if random else []
    by_hand = ["experiment=tasks", f"task={task}", f"position={scheme}", "seed=1", *positions]
    suites = [*by_hand, *suite_overrides(task, scheme, "random" if random else "sequential")]
    assert tasks.same_model(" ".join(["python", "-m", "alibi_lm.train", *suites]), planned)
    assert custom_name(suites, NOT_MODEL_KEYS) == suites  # the suite's folder: name=tasks
    assert custom_name(by_hand, NOT_MODEL_KEYS)[len(by_hand)].startswith("name=tasks-custom-")


def test_a_plans_trial_folder_is_git_ignored_and_the_suites_is_not():
    """results/ commits experiments only: the folder a trial of the suite goes to (--steps) is ignored by git, so it
    is neither committed by accident nor left untracked in `git status`; the suite's own folder is not."""
    trial = tasks.arguments(["--tasks", "copy", "--steps", "100"]).name
    assert trial == "tasks-custom"

    def ignored(folder: str) -> bool:
        return subprocess.run(["git", "check-ignore", "-q", f"results/{folder}/tasks.csv"], cwd=REPO).returncode == 0

    reproduction = reproduce.arguments(["--max-tokens", "40960"]).folder  # the reproduction's trial: <experiment>-custom-
    assert ignored(trial) and ignored(reproduction) and reproduction.startswith("cpu-wt2-custom-")
    assert not ignored(tasks.arguments(["--tasks", "copy"]).name) and not ignored(reproduce.arguments([]).folder)


def test_a_plan_without_keep_committed_says_which_committed_runs_it_would_train_again(capsys):
    """A subset whose runs are all committed (results/tasks/): without --keep-committed the plan trains them again,
    and says so, naming the flag; with it, they are skipped."""
    subset = ["--tasks", "flipflop", "--schemes", "alibi", "--seeds", "0", "--random-schemes", ""]
    steps = tasks.plan(tasks.arguments(subset))
    out = capsys.readouterr().out
    assert [s.name for s in steps if s.makes] == ["train flipflop-alibi-L64-seed0"]
    assert "note: 1 of these run(s) have every cell in results/tasks/tasks.csv (trained elsewhere) and are planned " \
           "to be trained again here; --keep-committed skips them" in out
    kept = tasks.plan(tasks.arguments([*subset, "--keep-committed"]))
    assert not [s for s in kept if s.makes] and "planned to be trained again" not in capsys.readouterr().out
