"""make reproduce's plan (scripts/reproduce.py --dry-run): every registered scheme, the RoPE extensions and the
context probes are steps of the committed reproduction."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from forked_app import run_python

from alibi_lm.positions.rope import ROPE_SCALINGS

ROOT = Path(__file__).resolve().parent.parent



def plan(*args: str) -> list[str]:
    """The lines of `scripts/reproduce.py --dry-run *args`, as the command prints them."""
    done = run_python(["scripts/reproduce.py", "--dry-run", *args], cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.splitlines()


def plan_here(*args: str) -> list[str]:
    """plan(), built in this process (no interpreter per plan): the package's schemes, not the tests' example one."""
    import shlex

    from alibi_lm.plans import reproduce
    from alibi_lm.plans.variants import VARIANTS
    from alibi_lm.positions import POSITION_SCHEMES

    package = [s for s, cls in POSITION_SCHEMES.items() if cls.__module__.startswith("alibi_lm.")]
    schemes = [] if any(a.startswith("--schemes") for a in args) else ["--schemes", ",".join([*package, *VARIANTS])]
    steps = reproduce.plan(reproduce.arguments([*schemes, *args]))
    return [f"{step.name}: {shlex.join(step.command[1:])}" for step in steps]


def test_the_plan_covers_every_scheme_rope_extension_and_probe():
    steps = plan()
    listing = run_python(["-m", "alibi_lm.positions"], cwd=ROOT)  # the package's registry (tests add to theirs)
    assert listing.returncode == 0, listing.stderr[-2000:]
    registered = listing.stdout.strip()
    assert len(registered.split(",")) >= 11
    names = [s.split(":")[0] for s in steps]
    trains = [n for n in names if n.startswith("train")]
    assert trains[: len(registered.split(","))] == [f"train {s}-L128-seed0" for s in registered.split(",")]
    for scheme in registered.split(","):
        i = names.index(f"train {scheme}-L128-seed0")
        assert f"position={scheme} seed=0 train.seq_len=128 train.batch_size=16 " in steps[i]
        assert names.index(f"sliding eval {scheme}-L128-seed0") < names.index(f"context probes {scheme}-L128-seed0")
        assert "eval.mode=sliding" in steps[names.index(f"sliding eval {scheme}-L128-seed0")]
    for run in ("alibi-L32-seed0", "sinusoidal-L64-seed0"):  # the length grid's c* against L
        assert names.index(f"train {run}") < names.index(f"context probes {run}")
    for seed in (0, 1, 2):
        for method in ROPE_SCALINGS:
            assert any(s.startswith(f"RoPE extension {method} rope-L128-seed{seed}:") and f"position.scaling={method}" in s
                       for s in steps)
    for L, batch in ((32, 64), (64, 32)):  # the same tokens per step at every L
        for scheme in ("alibi", "sinusoidal"):
            assert f"train.seq_len={L} train.batch_size={batch} " in steps[names.index(f"train {scheme}-L{L}-seed0")]
    assert names[-1] == "report"
    # what the one-seed report needs comes first, the extra seeds last; run by run: every step on a run lies
    # between its training and the next run's, so a plan stopped part-way leaves whole runs
    extra = [i for i, s in enumerate(names) if "-seed1" in s or "-seed2" in s]
    assert all(n.endswith("-seed0") for n in names[: min(extra)]) and len(trains) == len(set(trains))
    starts = [i for i, n in enumerate(names) if n.startswith("train")]
    for i, j in zip(starts, [*starts[1:], len(names)]):
        run = names[i].split(" ", 1)[1]
        assert not any(n.endswith(f" {run}") for n in names[:i] + names[j:]), run
        assert names[i + 1] == f"sliding eval {run}" or "-L128-" not in run
    every = registered.split(",") + ["fox+rope", "rope+nope4", "rope+nope4-w64", "alibi+ssmax", "nope+ssmax",
                                     "rope+qk_norm", "alibi+learn_slopes"]  # and the variants (alibi_lm/plans/variants.py)
    assert [n for n in names if n.startswith("train") and "-L128-seed0" in n] == [f"train {s}-L128-seed0" for s in every]
    assert [n for n in names[min(extra):] if n.startswith("train")] == [f"train {s}-L128-seed{seed}" for seed in (1, 2)
                                                                        for s in every]
    for seed in (0, 1, 2):  # both protocols for every seed; blockwise attention and temperature tuning beside full
        assert f"sliding eval fox+rope-L128-seed{seed}" in names and f"blockwise attention xpos-L128-seed{seed}" in names
        assert f"temperature tuning rope+nope4-L128-seed{seed}" in names
    i = names.index("train rope+nope4-w64-L128-seed0")
    assert "position=rope model.nope_every=4 model.local_window=64 seed=0 " in steps[i]
    assert "eval.attention=bca" in steps[names.index("blockwise attention alibi-L128-seed1")]


def test_extra_seeds_get_the_extra_evaluations_of_their_own_schemes_only():
    """--seed-schemes alibi: the extra seeds train alibi alone, so no RoPE extension, blockwise attention or
    temperature tuning step waits for a rope, xpos or iRoPE run of seed 1 or 2 that nothing trains."""
    steps = plan_here("--schemes", "alibi,rope,xpos,nope,irope", "--seed-schemes", "alibi", "--no-context-probes",
                 "--other-lengths=")
    names = [s.split(":")[0] for s in steps]
    trained = {n.split(" ", 1)[1] for n in names if n.startswith("train")}
    made = {n.rsplit(" ", 1)[1] for n in names if not n.startswith(("train", "report"))}
    assert made <= trained and "blockwise attention alibi-L128-seed1" in names


def test_keep_committed_skips_the_runs_whose_rows_are_all_committed_unless_retrained(tmp_path, monkeypatch):
    """A run with no folder here whose every row is in the committed extrapolation.csv (trained on another machine)
    is left out by --keep-committed; --retrain fire trains fire again; a run with only some of its rows (no sliding
    ones) or none is trained. The committed rows are made here, so the test does not follow results/cpu-wt2/."""
    from alibi_lm.plans import reproduce

    def rows(run, modes):
        return [f"{run.split('-L')[0]},128,{lv},{mode},{'16' if mode == 'sliding' else ''},,full,100.0,runs/cpu-wt2/{run}"
                for mode in modes for lv in (128, 256, 512, 1024, 2048)]

    csv = tmp_path / "results" / "cpu-wt2" / "extrapolation.csv"
    csv.parent.mkdir(parents=True)
    both = ("nonoverlapping", "sliding")
    csv.write_text("\n".join(["position,train_len,eval_len,mode,stride,rope_scaling,attention,ppl,run",
                              *rows("alibi-L128-seed0", both), *rows("fire-L128-seed0", both),
                              *rows("alibi-L128-seed1", ("nonoverlapping",))]) + "\n")
    monkeypatch.setattr(reproduce, "ROOT", tmp_path)
    names = [s.split(":")[0] for s in plan_here("--keep-committed", "--retrain", "fire")]
    assert "train alibi-L128-seed0" not in names and "sliding eval alibi-L128-seed0" not in names
    assert "train fire-L128-seed0" in names and "train fox-L128-seed0" in names
    assert "train alibi-L128-seed1" in names  # its committed rows lack the sliding protocol
    assert "train alibi-L128-seed0" in [s.split(":")[0] for s in plan_here()]


def test_the_plan_leaves_out_what_is_switched_off():
    steps = plan_here("--rope-scalings=", "--no-context-probes", "--more-seeds=", "--other-lengths=")
    assert not any(s.startswith(("RoPE extension", "context probes")) or "-seed1" in s or "-L32-" in s for s in steps)
    steps = plan_here("--more-seeds=")  # the rope run at L alone gets the extensions
    assert sum(s.startswith("RoPE extension") for s in steps) == len(ROPE_SCALINGS) and not any("seed1" in s for s in steps)


def test_empty_entries_in_comma_lists_are_dropped():
    steps = plan_here("--seeds=0,", "--rope-scalings=linear,", "--schemes=alibi,rope,", "--more-seeds=,",
                      "--other-lengths=")
    assert [s.split(":")[0] for s in steps if s.startswith("RoPE")] == ["RoPE extension linear rope-L128-seed0"]
    assert all("position.scaling=" not in s or "position.scaling=linear" in s for s in steps)
    assert [s.split(":")[0] for s in steps if s.startswith("train")] == ["train alibi-L128-seed0", "train rope-L128-seed0"]


def test_a_plan_without_schemes_or_jobs_is_refused(capsys):
    from alibi_lm.plans import reproduce

    for bad, message in ((["--schemes=,"], "--schemes, --seeds and --multipliers need at least one entry"),
                         (["--jobs=0"], "argument --jobs: must be an integer >= 1, got '0'"),
                         (["--seeds=0,1,0"], "--seeds names 0 twice; give each entry once"),
                         (["--schemes=alibi,rope,alibi"], "--schemes names alibi twice"),
                         (["--multipliers=1,2,2.0"], "--multipliers names 2.0 twice"),  # by value
                         (["--seeds=0,1", "--more-seeds=1", "--seed-schemes=alibi"],
                          "seed 1 is in --seeds and in --more-seeds: its runs would train twice"),
                         (["--stop-starting-after=-3"], "argument --stop-starting-after: must be a number >= 0"),
                         (["--status"], "argument --status: not allowed with argument --dry-run"),
                         (["--extra", "train.lrr=3"], "the extra overrides train.lrr=3 fit no run of the plan: unknown "
                                                      "config key 'train.lrr' (misspelled?); did you mean train.lr?")):
        with pytest.raises(SystemExit) as refused:
            reproduce.arguments(["--dry-run", "--schemes=alibi", *bad])
        err = capsys.readouterr().err
        assert refused.value.code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_run_info_covers_every_invocation_and_every_cost(tmp_path):
    """Two sessions: the first killed during a training, the second (two steps at once) finishing it; RUN_INFO.md
    lists both, the stopped step, the work done (not the steps that found their cells done), and each run's cost."""
    import json

    from alibi_lm.plans import run_record

    results, runs = tmp_path / "results" / "exp", tmp_path / "runs" / "exp"
    log = results / run_record.RUN_LOG
    start = dict(hardware="CPU X, 2 cores", head="aaaaaaa", data="wikitext2, local copy (...)", omp="1",
                 argv="python scripts/tasks.py --jobs 2")
    run_record.log_event(log, event="start", **start)  # an invocation from before jobs and threads were logged
    run_record.log_event(log, event="begin", step="all schemes at L", command="python -m alibi_lm.train -m ...",
                        commit="aaaaaaa")
    run_record.log_event(log, event="start", **dict(start, head="bbbbbbb", jobs=2))
    for step in ("train alibi-L16-seed0", "sliding eval t5-L16-seed0"):  # both running at once, ending in turn
        run_record.log_event(log, event="begin", step=step, command=f"python {step}", commit="bbbbbbb", threads="1")
    run_record.log_event(log, event="end", step="sliding eval t5-L16-seed0", seconds=3.0, status=0)
    run_record.log_event(log, event="end", step="train alibi-L16-seed0", seconds=600.0, status=0)
    run = runs / "alibi-L16-seed0"
    run.mkdir(parents=True)
    segments = [dict(commit="aaaaaaa", steps=[0, 250], seconds=120.0),
                dict(commit="bbbbbbb", steps=[250, 500], seconds=60.0, device="cpu: X, 2 cores, 1 threads")]
    (run / "status.json").write_text(json.dumps(dict(status="completed", step=500, train_commits=["aaaaaaa", "bbbbbbb"],
                                                     train_segments=segments, train_seconds=180.0)))
    old = runs / "t5-L16-seed0"  # trained before segments were recorded: its time is a lower bound
    old.mkdir()
    (old / "status.json").write_text(json.dumps(dict(status="completed", step=500, train_seconds=90.0)))
    results.joinpath("extrapolation.csv").write_text(
        "run,mode,wall_s,commit,rope_scaling\nruns/exp/alibi-L16-seed0,nonoverlapping,30,bbbbbbb,\n"
        "runs/exp/alibi-L16-seed0,sliding,60,bbbbbbb,\nruns/exp/alibi-L16-seed0,nonoverlapping,90,bbbbbbb,yarn\n")
    results.joinpath("passkey.csv").write_text("run,wall_s\nruns/exp/alibi-L16-seed0,60\nruns/exp/alibi-L16-seed0,60\n")
    results.joinpath("context_use.csv").write_text("run,split,wall_s\n" + "runs/exp/alibi-L16-seed0,valid,300\n" * 5)
    text = run_record.run_info("exp", log, runs)
    first, second = [e["time"] for e in map(json.loads, log.read_text().splitlines()) if e["event"] == "start"]
    assert "2 invocation(s)" in text and "| # |" not in text  # invocations are named by when they started
    invoked = "`python scripts/tasks.py --jobs 2` | CPU X, 2 cores"
    assert f"| {first} | {invoked} | aaaaaaa | 1 | 1 | wikitext2" in text  # OMP_NUM_THREADS, jobs
    assert f"| {second} | {invoked} | bbbbbbb | 1 | 2 | wikitext2" in text
    assert "Written by `scripts/tasks.py` after every step" in text  # the driver named in the log, not this module
    assert (f"| {first} | all schemes at L | `python -m alibi_lm.train -m ...` | aaaaaaa | - | - | "
            "stopped before it ended |") in text
    assert f"| {second} | train alibi-L16-seed0 | `python train alibi-L16-seed0` | bbbbbbb | 1 | 600 s | done |" in text
    assert "sliding eval t5-L16-seed0" not in text and "found their cells done: 1" in text
    costs = ("| alibi-L16-seed0 | 500 | aaaaaaa, bbbbbbb | not recorded; cpu: X, 2 cores, 1 threads | 3.0 min | "
             "0.5 / 1.0 / 1.5 min | 2.0 / 5.0 min | bbbbbbb |")
    assert costs in text and "| t5-L16-seed0 | 500 | not recorded | not recorded | ≥ 1.5 min |" in text
    # a later session where the run folders are not (a clone of the committed results): their cost rows are kept
    run_record.write_run_info("exp", log, runs)
    shutil.rmtree(old)
    kept = run_record.write_run_info("exp", log, runs).read_text()
    assert kept == text
    shutil.rmtree(runs)
    assert run_record.write_run_info("exp", log, runs).read_text() == text
    assert costs not in run_record.run_info("exp", log, runs)  # nothing to keep from: computed from the folders
    # a run trained again here: its row is computed anew, the others kept
    run.mkdir(parents=True)
    (run / "status.json").write_text(json.dumps(dict(status="completed", step=800, train_seconds=240.0)))
    again = run_record.write_run_info("exp", log, runs).read_text()
    assert "| alibi-L16-seed0 | 800 |" in again and costs not in again and "| t5-L16-seed0 | 500 |" in again
    # only the cost table's own rows are carried: not a table after it, not one of an older layout
    rows = run_record.earlier_cost_rows(text)
    assert rows == [line for line in text.splitlines() if line.startswith(("| alibi-L16", "| t5-L16"))]
    assert run_record.earlier_cost_rows(text + "\nA note.\n\n| key | value |\n|---|---|\n| a | 1 |\n") == rows
    assert run_record.earlier_cost_rows("# x\n\n| run | steps | train wall time |\n|---|---|---|\n| a | 1 | 2 |\n") == []


def test_a_task_folders_costs_are_its_cells_kept_checkpoints_and_retrieval(tmp_path):
    """A task suite's RUN_INFO.md: each run's evaluation is its tasks.csv cells, its kept checkpoints
    (over_training.csv) and its retrieval rows, not the language model's empty columns. A table written in the
    language model's layout (before) keeps its runs' training part; their evaluation comes from the committed rows."""
    import json

    from alibi_lm.plans import run_record

    results, runs = tmp_path / "results" / "tasks", tmp_path / "runs" / "tasks"
    log = results / run_record.RUN_LOG
    run_record.log_event(log, event="start", hardware="CPU X", head="aaaaaaa", data="synthetic", omp="1",
                         argv="python scripts/tasks.py")
    here, there = runs / "copy-alibi-L64-seed0", "copy-rope-L64-seed0"  # trained here; trained elsewhere
    here.mkdir(parents=True)
    (here / "status.json").write_text(json.dumps(dict(status="completed", step=5000, train_commits=["aaaaaaa"],
                                                      train_segments=[dict(seconds=600.0, device="cpu: X")])))
    results.joinpath("tasks.csv").write_text(
        "run,wall_s,commit\nruns/tasks/copy-alibi-L64-seed0,30,aaaaaaa\nruns/tasks/copy-alibi-L64-seed0,30,aaaaaaa\n"
        "runs/tasks/copy-rope-L64-seed0,120,bbbbbbb\nruns/tasks/copy-alibi-random-L64-seed0,6000,ccccccc\n")
    results.joinpath("over_training.csv").write_text("run,wall_s\nruns/tasks/copy-alibi-L64-seed0,240\n"
                                                    "runs/tasks/copy-rope-L64-seed0,60\n")
    # one measurement at Lv = 64 (its time on each of its distance x layer x head rows), counted once
    results.joinpath("retrieval.csv").write_text("run,eval_len,weights,timestamp,wall_s\n"
                                                 + "runs/tasks/copy-rope-L64-seed0,64,w1,t1,6\n" * 3)
    earlier = "\n".join(["", *run_record.COST_TABLE_HEAD,
                          f"| {there} | 5000 | bbbbbbb | cpu: Y | 9.0 min | - / - / - min | - / - min |  |", ""])
    text = run_record.run_info("tasks", log, runs, previous=earlier)
    assert "\n".join(run_record.TASK_COST_HEAD) in text and run_record.COST_TABLE_HEAD[0] not in text
    assert "| copy-alibi-L64-seed0 | 5000 | aaaaaaa | cpu: X | 10.0 min | 1.0 / 4.0 / - min | aaaaaaa |" in text
    assert f"| {there} | 5000 | bbbbbbb | cpu: Y | 9.0 min | 2.0 / 1.0 / 0.1 min | bbbbbbb |" in text
    # written again from itself (the task layout now), with no run folders here: the same table
    assert run_record.run_info("tasks", log, tmp_path / "none", previous=text).split("| run |")[1] == \
        text.split("| run |")[1]


def test_a_plan_whose_runs_go_to_other_experiments_costs_each_run_from_its_own_folders(tmp_path):
    """The rerun check logs in results/tasks-rerun/ but trains into runs/tasks-rerun-threads{1,2}/ with rows in
    results/tasks-rerun-threads{1,2}/: each rerun has its cost row, labelled by its experiment (the two share a run
    name), its evaluation from its own folder's rows; with the run folders gone, the rows stay."""
    import json

    from alibi_lm.plans import run_record

    log = tmp_path / "results" / "tasks-rerun" / run_record.RUN_LOG
    run_record.log_event(log, event="start", hardware="CPU X", head="aaaaaaa", data="synthetic", omp="1",
                         argv="python scripts/task_rerun.py mqar-alibi-L64-seed0")
    folders = []
    for threads, (minutes, wall) in {1: (10.0, 60), 2: (20.0, 120)}.items():
        name = f"tasks-rerun-threads{threads}"
        run = tmp_path / "runs" / name / "mqar-alibi-L64-seed0"
        run.mkdir(parents=True)
        (run / "status.json").write_text(json.dumps(dict(step=5000, train_commits=["aaaaaaa"],
                                                         train_segments=[dict(seconds=minutes * 60, device="cpu: X")])))
        rows = tmp_path / "results" / name
        rows.mkdir(parents=True)
        rows.joinpath("tasks.csv").write_text(f"run,wall_s,commit\nruns/{name}/mqar-alibi-L64-seed0,{wall},aaaaaaa\n")
        folders.append(tmp_path / "runs" / name)
    text = run_record.run_info("tasks-rerun", log, folders)
    assert "\n".join(run_record.TASK_COST_HEAD) in text
    assert "| tasks-rerun-threads1/mqar-alibi-L64-seed0 | 5000 | aaaaaaa | cpu: X | 10.0 min | 1.0 / - / - min | " \
        "aaaaaaa |" in text
    assert "| tasks-rerun-threads2/mqar-alibi-L64-seed0 | 5000 | aaaaaaa | cpu: X | 20.0 min | 2.0 / - / - min | " \
        "aaaaaaa |" in text
    gone = [tmp_path / "elsewhere" / f.name for f in folders]  # another machine: no run folders, the rows committed
    assert run_record.run_info("tasks-rerun", log, gone, previous=text).split("| run |")[1] == text.split("| run |")[1]


def test_an_earlier_rows_evaluation_is_read_again_from_the_committed_rows(tmp_path):
    """A run trained elsewhere keeps its training part from the earlier RUN_INFO.md; its evaluation and commits come
    from the committed rows, so an earlier table's wrong count (rope's rows once summed fox+rope's too) is mended."""
    from alibi_lm.plans import run_record

    results = tmp_path / "results" / "exp"
    results.mkdir(parents=True)
    results.joinpath("extrapolation.csv").write_text(
        "run,mode,wall_s,commit,rope_scaling\nruns/exp/rope-L16-seed0,nonoverlapping,60,bbbbbbb,\n"
        "runs/exp/fox+rope-L16-seed0,nonoverlapping,600,ccccccc,\n")
    earlier = "\n".join(["", *run_record.COST_TABLE_HEAD, "| rope-L16-seed0 | 500 | aaaaaaa | cpu: Y | 3.0 min | "
                          "11.0 / - / - min | - / - min | bbbbbbb, ccccccc |", ""])
    table = run_record.with_earlier_costs(list(run_record.COST_TABLE_HEAD), earlier, [results])
    assert table[2] == ("| rope-L16-seed0 | 500 | aaaaaaa | cpu: Y | 3.0 min | 1.0 / - / - min | - / - min | "
                        "bbbbbbb |")


def test_a_record_after_a_write_cut_short_is_read(tmp_path):
    """A kill while a record was appended leaves a line without its end: the next record starts a line of its own,
    so it is read (the cut line alone is passed over), and no begin goes missing."""
    from alibi_lm.plans import run_record
    from alibi_lm.training.run_log import run_log_events

    log = tmp_path / "RUN_LOG.jsonl"
    run_record.log_event(log, event="begin", step="train a", command="python a")
    with open(log, "a") as f:
        f.write('{"time": "2026-')
    run_record.log_event(log, event="start", argv="scripts/tasks.py")
    run_record.log_event(log, event="begin", step="train b", command="python b")
    assert [e["event"] for e in run_log_events(log)] == ["begin", "start", "begin"]


def test_budget_probes_share_the_reproductions_runs_only_in_its_folder_and_report_their_costs(tmp_path):
    import json

    from alibi_lm.plans import budget_probes as bp

    assert bp.experiment_name("sinusoidal-L128-8M") == "cpu-wt2" and bp.experiment_name("t5-L128-16M") == "probes/t5-L128-16M"
    assert bp.experiment_name("sinusoidal-L128-8M", "elsewhere") == "probes/sinusoidal-L128-8M"  # never overwrite
    assert "name=probes/alibi-L128-8M" in bp.command("alibi-L128-8M", "elsewhere")
    results, runs = tmp_path / "results" / "probes", tmp_path / "runs"
    csv = tmp_path / "results" / "probes" / "t5-L128-16M" / "extrapolation.csv"
    csv.parent.mkdir(parents=True)
    body = "".join(f"t5,128,{128 * k},nonoverlapping,,0,valid,,{10.0 * k},abc1234,30\n" for k in bp.MULTIPLES)
    csv.write_text("position,train_len,eval_len,mode,stride,seed,split,rope_scaling,ppl,commit,wall_s\n" + body)
    run = runs / "probes" / "t5-L128-16M" / "t5-L128-seed0"
    run.mkdir(parents=True)
    segments = [dict(commit="abc1234", steps=[0, 10], seconds=60.0), dict(commit="def5678", steps=[10, 20], seconds=120.0)]
    (run / "status.json").write_text(json.dumps(dict(train_segments=segments, train_commits=["abc1234", "def5678"])))
    text = bp.summary(results, runs, "runs")
    line = next(x for x in text.splitlines() if x.startswith("| t5-L128-16M |"))
    assert line.endswith("| 2.000 | 8.000 | 16.000 | 3.0 | abc1234, def5678 | 2.5 | abc1234 |  |")  # no device column
    (run / "status.json").write_text(json.dumps(dict(train_seconds=90.0)))  # before segments were recorded
    assert "| ≥ 1.5 |  | 2.5 |" in bp.summary(results, runs, "runs")
    device = "cpu: AMD EPYC, 2 cores, 1 threads"
    csv.write_text("position,train_len,eval_len,mode,stride,seed,split,rope_scaling,ppl,commit,wall_s,device\n"
                   + body.replace("\n", f",\"{device}\"\n"))
    bp.write_readme(results, runs, "runs")
    readme = (results / "README.md").read_text()
    assert f"| abc1234 | {device} |" in readme and readme.endswith("## Command log\n\n")  # no log yet
    (run / "status.json").unlink()  # a fresh clone: no run folders; the README's recorded time is kept
    assert "| ≥ 1.5 |  | 2.5 |" in bp.summary(results, runs, "runs")
    (results / "README.md").unlink()  # nothing recorded either; the shared 8M probes point to the reproduction's costs
    assert "| run folder absent: see the command log |  | 2.5 |" in bp.summary(results, runs, "runs")
    assert bp.training(runs, "runs", "alibi-L128-8M", {}) == ("in results/cpu-wt2/RUN_INFO.md", "")


def _sleeper(name: str, seconds: float, code: int = 0) -> list[str]:
    """A step's command: print OMP_NUM_THREADS, sleep, exit with `code`."""
    script = f"import os, sys, time; print('{name}', os.environ.get('OMP_NUM_THREADS')); time.sleep({seconds}); sys.exit({code})"
    return [sys.executable, "-c", script]


def _run(steps, jobs, tmp_path):
    """run_steps with callbacks that record (event, step, time); returns (failed, events)."""
    import time

    from alibi_lm.plans.steps import run_steps

    events = []
    failed = run_steps(steps, jobs, ROOT, tmp_path / "logs", lambda s, threads: events.append(("begin", s.name, time.time())),
                       lambda s, code, seconds: events.append(("end", s.name, time.time())))
    return failed, events


def _at(events, kind, name):
    return next(t for k, n, t in events if k == kind and n == name)


def test_steps_run_two_at_once_each_after_the_run_it_needs_and_the_report_last(tmp_path, monkeypatch):
    from alibi_lm.plans import steps as st

    monkeypatch.setattr(st, "POLL_S", 0.05)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(st.os, "cpu_count", lambda: 4)
    plan = [st.Step("train a", _sleeper("a", 1.0), makes="a"), st.Step("train b", _sleeper("b", 0.3), makes="b"),
            st.Step("eval a", _sleeper("ea", 0.1), needs=("a",)), st.Step("eval b", _sleeper("eb", 0.1), needs=("b",)),
            st.Step("report", _sleeper("r", 0.0), barrier=True)]
    failed, events = _run(plan, 2, tmp_path)
    assert failed == [] and len(events) == 10
    assert _at(events, "begin", "train b") < _at(events, "end", "train a")  # two at once
    assert _at(events, "begin", "eval a") >= _at(events, "end", "train a")
    assert _at(events, "begin", "eval b") < _at(events, "end", "train a")  # b's evaluation does not wait for a
    assert _at(events, "begin", "report") >= max(t for k, n, t in events if k == "end" and n != "report")
    logs = {p.name: p.read_text() for p in (tmp_path / "logs").iterdir()}  # each step's own output, 4 cores / 2 jobs
    assert logs["train_a.log"] == "a 2\n" and logs["eval_b.log"] == "eb 2\n" and len(logs) == 5


def test_steps_on_the_same_run_take_turns_and_one_job_keeps_the_users_threads(tmp_path, monkeypatch):
    from alibi_lm.plans import steps as st

    monkeypatch.setattr(st, "POLL_S", 0.05)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    plan = [st.Step("sliding a", _sleeper("s", 0.5), needs=("a",)), st.Step("probes a", _sleeper("p", 0.1), needs=("a",))]
    failed, events = _run(plan, 2, tmp_path)  # "a" is made by no step: trained before; but one step at a time on it
    assert failed == [] and _at(events, "begin", "probes a") >= _at(events, "end", "sliding a")
    assert (tmp_path / "logs" / "probes_a.log").read_text() == "p 3\n"
    assert st.threads_per_job(1) == "3"
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert st.threads_per_job(1) is None  # one job, nothing set: torch's own default


def test_after_a_failed_step_nothing_new_starts_and_the_failure_is_returned(tmp_path, monkeypatch):
    from alibi_lm.plans import steps as st

    monkeypatch.setattr(st, "POLL_S", 0.05)
    plan = [st.Step("train a", _sleeper("a", 0.0, code=3), makes="a"), st.Step("train b", _sleeper("b", 0.5), makes="b"),
            st.Step("eval a", _sleeper("ea", 0.0), needs=("a",)), st.Step("train c", _sleeper("c", 0.0), makes="c")]
    failed, events = _run(plan, 2, tmp_path)
    assert failed == ["train a"]
    assert [n for k, n, _ in events if k == "begin"] == ["train a", "train b"]  # b, already running, ends
    assert [n for k, n, _ in events if k == "end"] == ["train a", "train b"]


def test_a_trial_with_other_settings_gets_its_own_experiment_folder(capsys):
    """A cheap trial (fewer tokens) must not replace the committed results/cpu-wt2/ rows it would be taken for."""
    from alibi_lm.plans import reproduce

    committed = reproduce.arguments(["--schemes", "alibi", "--seeds", "0"])
    assert committed.folder == "cpu-wt2"
    trial = reproduce.arguments(["--schemes", "alibi", "--seeds", "0", "--max-tokens", "20480"])
    assert trial.folder.startswith("cpu-wt2-custom-") and trial.experiment == "cpu-wt2"
    assert "--max-tokens=20480 differ from the reproduction's settings" in capsys.readouterr().out
    commands = [" ".join(step.command) for step in reproduce.plan(trial)]
    assert all(trial.folder in c and "cpu-wt2/" not in c for c in commands)  # its runs, its results
    assert any(c.endswith(f"results/{trial.folder}") for c in commands)
    assert trial.folder == reproduce.arguments(["--max-tokens", "20480"]).folder  # the same settings, the same folder


def test_a_stop_signal_reaches_the_running_steps_and_no_new_step_starts(tmp_path):
    """The driver of make reproduce under SIGTERM: its running step gets the signal, the next never starts,
    and the driver exits 75 with one line."""
    import signal
    import time

    marker = tmp_path / "second-started"
    script = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from pathlib import Path\n"
              "from alibi_lm.plans.steps import Step, run_steps\n"
              "first = [sys.executable, '-c', 'import signal, sys, time; print(\"first running\", flush=True); "
              "signal.signal(signal.SIGTERM, lambda *a: sys.exit(75)); time.sleep(60)']\n"
              f"second = ['touch', {str(marker)!r}]\n"
              "run_steps([Step('first', first), Step('second', second)], 1, Path('.'), None, lambda s, t: None, "
              "lambda s, c, t: print('ended', s.name, c, flush=True))\n")
    driver = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    assert driver.stdout.readline().strip() == "first running"
    time.sleep(0.5)
    driver.send_signal(signal.SIGTERM)
    out, err = driver.communicate(timeout=60)
    assert driver.returncode == 75, err
    assert "ended first 75" in out and err.strip().startswith("error: stopped by SIGTERM") and len(err.splitlines()) == 1
    assert not marker.exists()


def test_run_info_of_two_drivers_at_once_on_one_folder(tmp_path):
    """Two invocations overlap (a second driver started while the first runs): each step's end belongs to its own
    begin, whichever invocation started in between; a step begun twice without an end shows as stopped once."""
    import json

    from alibi_lm.plans import run_record

    log = tmp_path / "results" / "exp" / run_record.RUN_LOG
    start = dict(hardware="CPU X", head="aaaaaaa", data="synthetic", omp="1", argv="python")
    run_record.log_event(log, event="start", **start)
    run_record.log_event(log, event="begin", step="train a", command="python a", commit="aaaaaaa")
    run_record.log_event(log, event="begin", step="train c", command="python c", commit="aaaaaaa")
    run_record.log_event(log, event="start", **start)
    run_record.log_event(log, event="begin", step="train b", command="python b", commit="aaaaaaa")
    run_record.log_event(log, event="begin", step="train c", command="python c", commit="aaaaaaa")
    for step, seconds in (("train a", 100.0), ("train b", 200.0), ("train c", 300.0)):
        run_record.log_event(log, event="end", step=step, seconds=seconds, status=0)
    first, second = [e["time"] for e in map(json.loads, log.read_text().splitlines()) if e["event"] == "start"]
    text = run_record.run_info("exp", log, tmp_path / "runs")
    assert f"| {first} | train a | `python a` | aaaaaaa | - | 100 s | done |" in text
    assert f"| {second} | train b | `python b` | aaaaaaa | - | 200 s | done |" in text
    assert f"| {second} | train c | `python c` | aaaaaaa | - | 300 s | done |" in text
    assert text.count("stopped before it ended") == 1 and f"| {first} | train c |" in text
    # a step of the last invocation with no end yet may still be running: not called stopped
    run_record.log_event(log, event="begin", step="train d", command="python d", commit="aaaaaaa")
    text = run_record.run_info("exp", log, tmp_path / "runs")
    assert f"| {second} | train d | `python d` | aaaaaaa | - | - | not ended when this was written |" in text
    assert text.count("stopped before it ended") == 1


def _limited(plan, jobs, tmp_path, seconds, capsys):
    """run_steps with start_until `seconds` from now; the (begin|end, step) events and the stderr line."""
    import time

    from alibi_lm.plans import steps as st

    events = []
    with pytest.raises(SystemExit) as stopped:
        st.run_steps(plan, jobs, ROOT, tmp_path / "logs", lambda s, threads: events.append(("begin", s.name)),
                     lambda s, code, _: events.append(("end", s.name)), start_until=time.time() + seconds)
    assert stopped.value.code == 75
    return events, capsys.readouterr().err


def test_past_the_start_limit_the_running_training_its_evaluation_and_the_report_finish(tmp_path, monkeypatch, capsys):
    """--stop-starting-after: a job with a time limit ends with whole runs (the running training, then its
    evaluation) and their tables (the report); the next training and its evaluation are the same command's."""
    from alibi_lm.plans import steps as st

    monkeypatch.setattr(st, "POLL_S", 0.05)
    plan = [st.Step("train a", _sleeper("a", 0.6), makes="a"), st.Step("train b", _sleeper("b", 0.0), makes="b"),
            st.Step("eval a", _sleeper("ea", 0.0), needs=("a",)), st.Step("eval b", _sleeper("eb", 0.0), needs=("b",)),
            st.Step("report", _sleeper("r", 0.0), barrier=True)]
    events, err = _limited(plan, 1, tmp_path, 0.3, capsys)
    assert [name for kind, name in events if kind == "begin"] == ["train a", "eval a", "report"]
    assert "2 step(s) not started: the time to start trainings (--stop-starting-after) is over" in err
    # two jobs: both trainings under way at the limit finish, with their evaluations
    plan.insert(2, st.Step("train c", _sleeper("c", 0.0), makes="c"))
    plan[0], plan[1] = st.Step("train a", _sleeper("a", 0.8), makes="a"), st.Step("train b", _sleeper("b", 0.5), makes="b")
    events, err = _limited(plan, 2, tmp_path, 0.3, capsys)
    assert [name for kind, name in events if kind == "begin"] == ["train a", "train b", "eval b", "eval a", "report"]
    assert "1 step(s) not started" in err
    # a limit already past: nothing trains, the report still rebuilds the tables
    events, err = _limited(plan, 2, tmp_path, -1, capsys)
    assert events == [("begin", "report"), ("end", "report")] and "5 step(s) not started" in err
    failed, events = _run(plan, 1, tmp_path)  # no limit: all
    assert failed == [] and [e[1] for e in events if e[0] == "begin"] == [s.name for s in plan]


def _task_rows(run: str, cells, weights: str) -> list[dict]:
    task = run.split("-")[0]
    return [dict(task=task, task_options="", position=run.split("-")[1], positions="sequential", train_len=64,
                 eval_len=length, variant=variant, seed=0, run=f"runs/tasks/{run}", weights=weights, token_acc=1.0)
            for variant, length in cells]


def test_keep_committed_trains_only_the_task_runs_without_every_cell_committed(tmp_path, monkeypatch):
    """make tasks on a fresh clone, continuing a suite whose finished runs' rows were committed: a run whose step
    ended well elsewhere (RUN_LOG.jsonl), with every cell from one set of weights and no finished training here (no
    folder, or one stopped part-way while another machine trained the run) is not trained again; one that lacks a
    cell, mixes weights, was stopped elsewhere before its scoring ended or finished training here is (its
    evaluation scores what is missing)."""
    import pandas as pd

    from alibi_lm.plans import task_suite as tasks
    from alibi_lm.results.task_store import COLUMNS
    from alibi_lm.tasks.passkey import DEPTHS

    monkeypatch.setattr(tasks, "ROOT", tmp_path)
    passkey = tasks.expected_cells(["experiment=tasks", "task=passkey", "position=alibi", "seed=0"])
    flipflop = tasks.expected_cells(["experiment=tasks", "task=flipflop", "position=fox", "position.gate_bias_init=5"])
    assert len(passkey) == 5 * (1 + len(DEPTHS)) and ("", 1024) in passkey and ("", 64) in passkey
    assert flipflop == {("", 64 * k) for k in (1, 2, 4, 8, 16)}
    rows = (_task_rows("passkey-alibi-L64-seed0", passkey, "w1")
            + _task_rows("passkey-rope-L64-seed0", sorted(passkey)[1:], "w2")  # a cell lost
            + _task_rows("flipflop-alibi-L64-seed0", sorted(flipflop)[:2], "w3")
            + _task_rows("flipflop-alibi-L64-seed0", sorted(flipflop)[2:], "w4")  # two trainings' rows
            + _task_rows("flipflop-rope-L64-seed0", flipflop, "w5")
            + _task_rows("passkey-t5-L64-seed0", passkey, "w6")  # stopped there while scoring its checkpoints
            + _task_rows("flipflop-t5-L64-seed0", flipflop, "w7"))
    (tmp_path / "results" / "tasks").mkdir(parents=True)
    pd.DataFrame(rows).reindex(columns=COLUMNS).to_csv(tmp_path / "results" / "tasks" / "tasks.csv", index=False)
    ended = {"passkey-alibi": 0, "passkey-rope": 0, "flipflop-alibi": 0, "flipflop-rope": 0, "passkey-t5": 124,
             "flipflop-t5": 0}
    suite = ["--tasks", "passkey,flipflop", "--schemes", "alibi,rope,t5", "--seeds", "0", "--random-schemes", ""]
    planned = {step.name: step.command for step in tasks.plan(tasks.arguments(suite))}
    # as the driver logs them: each step's command when it began (on a GPU in float32: the same model), then its end
    log = [{"event": "begin", "step": f"train {run}-L64-seed0", "status": status,
            "command": " ".join(["python", *planned[f"train {run}-L64-seed0"][1:], "train.precision=fp32"])}
           for run, status in ended.items()]
    log += [{"event": "end", "step": f"train {run}-L64-seed0", "status": status} for run, status in ended.items()]
    (tmp_path / "results" / "tasks" / "RUN_LOG.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log))
    for run, status in (("flipflop-rope-L64-seed0", "completed"), ("passkey-alibi-L64-seed0", "stopped")):
        (tmp_path / "runs" / "tasks" / run).mkdir(parents=True)  # trained here; stopped here while trained elsewhere
        (tmp_path / "runs" / "tasks" / run / "status.json").write_text(json.dumps({"status": status}))
    kept = [s.name for s in tasks.plan(tasks.arguments([*suite, "--keep-committed"]))]
    assert kept == ["train passkey-rope-L64-seed0", "train passkey-t5-L64-seed0", "train flipflop-alibi-L64-seed0",
                    "train flipflop-rope-L64-seed0", "report"]
    assert "train passkey-alibi-L64-seed0" in [s.name for s in tasks.plan(tasks.arguments(suite))]
    # flip-flop T5's rows were trained there with another budget (the suite's was changed since): trained again
    tasks.committed_cells.cache_clear()
    other = [dict(e, command=e["command"].replace("train.max_steps=6000", "train.max_steps=3000"))
             if e.get("step") == "train flipflop-t5-L64-seed0" and e["event"] == "begin" else e for e in log]
    (tmp_path / "results" / "tasks" / "RUN_LOG.jsonl").write_text("".join(json.dumps(e) + "\n" for e in other))
    assert "train flipflop-t5-L64-seed0" in [s.name for s in tasks.plan(tasks.arguments([*suite, "--keep-committed"]))]
    # a command that spells out a default (tasks.yaml's train.lr) trains the same model: not trained again
    tasks.committed_cells.cache_clear()
    spelled = [dict(e, command=e["command"] + " train.lr=0.001")
               if e.get("step") == "train flipflop-t5-L64-seed0" and e["event"] == "begin" else e for e in log]
    (tmp_path / "results" / "tasks" / "RUN_LOG.jsonl").write_text("".join(json.dumps(e) + "\n" for e in spelled))
    assert "train flipflop-t5-L64-seed0" not in [s.name for s in tasks.plan(tasks.arguments([*suite, "--keep-committed"]))]


def test_precision_goes_to_every_training_and_keeps_the_committed_folder():
    """--precision fp32 (a GPU reproducing the CPU's numbers): train.precision on each training step only (its
    evaluations and probes follow the run), and the same results folder: it is no setting of the results."""
    from alibi_lm.plans import reproduce
    from alibi_lm.plans import task_suite as tasks

    args = reproduce.arguments(["--schemes", "alibi", "--seeds", "0", "--precision", "fp32"])
    assert args.folder == "cpu-wt2"
    steps = {step.name: step.command for step in reproduce.plan(args)}
    assert all(("train.precision=fp32" in command) == name.startswith("train ") for name, command in steps.items())
    plain = reproduce.plan(reproduce.arguments(["--schemes", "alibi", "--seeds", "0"]))
    assert not any(arg.startswith("train.precision") for step in plain for arg in step.command)
    suite = tasks.arguments(["--tasks", "passkey", "--schemes", "alibi", "--seeds", "0", "--precision", "bf16"])
    assert suite.name == "tasks"
    trainings = [step.command for step in tasks.plan(suite) if step.name.startswith("train ")]
    assert trainings and all("train.precision=bf16" in command for command in trainings)


@pytest.mark.parametrize("status, outcome", [
    (0, "done"),
    (75, "stopped by a signal (exit status 75; resumed by the same command)"),
    (130, "stopped by a signal (exit status 130; resumed by the same command)"),  # Ctrl-C
    (-15, "stopped by SIGTERM (resumed by the same command)"),   # killed by the signal before its handler was in
    (-10, "stopped by SIGUSR1 (resumed by the same command)"),
    (-9, "failed (exit status -9)"),                            # SIGKILL (the OOM killer): not a stop request
    (1, "failed (exit status 1)"),
])
def test_a_step_ended_by_a_stop_signal_is_reported_as_stopped_not_failed(status, outcome):
    from alibi_lm.plans.run_record import step_outcome

    assert step_outcome(status) == outcome
