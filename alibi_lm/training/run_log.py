"""What a plan's RUN_LOG.jsonl (results/<experiment>/, appended by alibi_lm.plans.run_record) says was finished, and
by which command; and the refusal of a training command that would replace a committed run's rows with another
model's (a trial under the experiment's own name=).

A plan logs each step's begin (with its command) and end; a step begun again is under way until it ends again, so a
plan retraining a run under a changed protocol is never refused by its own earlier record."""

from __future__ import annotations

import dataclasses
import functools
import json
import shlex
from pathlib import Path

from ..checkpoint import flat_config
from ..config import compose, run_folder, to_job
from ..errors import UserError
from ..model import position_label
from .reuse import NOT_MODEL_KEYS, free_keys
from .streams import is_synthetic

RUN_LOG = "RUN_LOG.jsonl"  # in results/<experiment>/: every invocation's start and every step, appended


def row_keys(job) -> tuple[str, ...]:
    """The evaluation settings that change a run's rows (their value, not their key): the tokens an LM row scores,
    the sequences a task cell scores. A command that differs in them is not the experiment's run either."""
    return ("eval.max_tokens", *(["eval.examples"] if is_synthetic(job) else []))


def run_log_events(log: Path) -> list[dict]:
    """Every record of RUN_LOG.jsonl (none when there is no log), read afresh: the log grows while a plan runs. A line
    that is no record (a write cut short by a kill, a merge's conflict markers) is passed over: each record is one
    line of its own, so the others stand."""
    events = []
    for line in log.read_text().splitlines() if log.is_file() else []:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def ended_well(event: dict) -> bool:
    """Whether a RUN_LOG.jsonl record says its step's work is all done: it ended with status 0, or a later invocation
    found nothing left to do for it (skipped: a step whose process did all its work and was then stopped by a signal,
    or failed after its last row, is never ended with status 0)."""
    return (event.get("event") == "end" and event.get("status") == 0) or event.get("event") == "skipped"


def ended_well_steps(log: Path) -> dict[str, int]:
    """Each step of RUN_LOG.jsonl whose latest attempt ended well (ended_well after its latest begin, on any machine)
    -> the index of that record in the log: a step begun again (a run trained again under another budget) is under
    way until it ends again, and its new end is a new record."""
    ended: dict[str, int] = {}
    for index, event in enumerate(run_log_events(log)):
        if event.get("event") == "begin":
            ended.pop(event["step"], None)
        elif ended_well(event) and not (event.get("event") == "skipped" and event["step"] in ended):
            ended[event["step"]] = index  # a later invocation skipping a step that ended well is no new end
    return ended


def steps_ended_well(log: Path) -> frozenset[str]:
    """The steps of RUN_LOG.jsonl whose latest attempt ended well (ended_well_steps)."""
    return frozenset(ended_well_steps(log))


def steps_under_way(log: Path) -> frozenset[str]:
    """The steps of RUN_LOG.jsonl begun and not ended well since: running now, stopped or failed."""
    events = run_log_events(log)
    return frozenset(e["step"] for e in events if e.get("event") == "begin") - steps_ended_well(log)


def whole_attempt_seconds(log: Path) -> dict[str, tuple[str, float]]:
    """Each step of RUN_LOG.jsonl begun once and ended with status 0 -> (the command it began with, its wall
    seconds): what a step takes whole, for a plan's estimate. A step begun more than once is left out: its last
    attempt timed only the rest of a resumed run."""
    begun: dict[str, list[str]] = {}
    whole: dict[str, tuple[str, float]] = {}
    for event in run_log_events(log):
        step = event.get("step")
        if event.get("event") == "begin":
            begun.setdefault(step, []).append(event.get("command", ""))
            whole.pop(step, None)
        elif event.get("event") == "end" and event.get("status") == 0 and len(begun.get(step, ())) == 1:
            whole[step] = (begun[step][0], float(event["seconds"]))
    return whole


def ended_commands(log: Path) -> dict[str, str]:
    """Each step of RUN_LOG.jsonl whose latest attempt ended well (ended_well_steps) -> the command it began with."""
    begun, ended = {}, ended_well_steps(log)
    for event in run_log_events(log):
        if event.get("event") == "begin":
            begun[event["step"]] = event.get("command", "")
    return {step: begun[step] for step in ended if step in begun}


def job_settings(job) -> dict:
    """A job's config, flat, less the entries that do not decide the trained model (free_keys of NOT_MODEL_KEYS: where
    it runs, its precision, threads, logging, evaluation) but with those that change its rows (row_keys)."""
    free, scored = free_keys(job, NOT_MODEL_KEYS), row_keys(job)
    flat = flat_config(dataclasses.asdict(job))
    return {key: value for key, value in flat.items() if not key.startswith(free) or key in scored}


@functools.cache
def model_settings(training: tuple[str, ...]) -> dict:
    """job_settings of the job a training command's overrides compose: so a run trained on a GPU in float32 is the
    CPU plan's run and another budget, fewer examples a cell or a changed default of configs/experiment/tasks.yaml
    is not."""
    return job_settings(to_job(compose("train", list(training))))


def logged_settings(made_by: str) -> dict | None:
    """model_settings of a logged command (python -m alibi_lm.train ...); None where the configs no longer take it
    (a key since removed): it is not this plan's run."""
    try:
        return model_settings(tuple(shlex.split(made_by)[3:]))
    except Exception:  # noqa: BLE001 - an old command that no longer composes
        return None


def same_model(made_by: str, training: list[str]) -> bool:
    """Whether the logged command `made_by` trains the model `training` would, scored into the same rows. The
    plan's own command must compose: an error there is the plan's, and is raised."""
    return logged_settings(made_by) == model_settings(tuple(training))


def changes(theirs: dict | None, ours: dict) -> str:
    """"train.max_steps=8000 there, 200 here, ...": how two settings differ, for a one-line refusal."""
    if theirs is None:
        return "its command no longer composes"
    return ", ".join(f"{k}={theirs.get(k)} there, {ours.get(k)} here" for k in sorted(set(ours) | set(theirs))
                     if theirs.get(k) != ours.get(k))


def run_name(job) -> str:
    """The run's folder name as the train app names it (configs/train.yaml's hydra.run.dir), from the job alone: the
    step a plan logs for it is "train <name>", whatever folder a command points hydra.run.dir at."""
    return run_folder(job.task_name, position_label(job.model), job.train.positions, job.train.seq_len, job.seed)


def plan_command(log: Path) -> str:
    """The command line of the plan that wrote the log (its latest invocation's), for the advice to run it again."""
    starts = [e for e in run_log_events(log) if e.get("event") == "start" and e.get("argv")]
    return f"`{starts[-1]['argv']}`" if starts else "its plan"


def check_committed_run(job) -> None:
    """Before a training command trains: results/<name>/ (paths.results) holds this run trained to the end by its
    plan (RUN_LOG.jsonl) with other settings (another budget, learning rate, depth, fewer examples a cell), as a trial
    given the experiment's own name= would be: its rows would replace the committed run's. A seed the plan has not
    trained is held to the settings of the plan's runs of the same task, scheme and L (any seed): its rows would join
    theirs as the same experiment's. Refused in one line. A plan training a run logs its begin first: a run under way
    is never refused by the plan's earlier record."""
    results, run = Path(job.paths.results) / job.name, run_name(job)
    log, step = results / RUN_LOG, f"train {run}"
    if step in steps_under_way(log):
        return
    ended, ours = ended_commands(log), job_settings(job)
    if step in ended:
        theirs = logged_settings(ended[step])
        if theirs != ours:
            raise UserError(f"{results}/ holds the committed run {run}, trained by its plan with other settings "
                            f"({changes(theirs, ours)}); this command would replace its rows: train it as a trial "
                            f"under name=<another folder>, or run its plan again ({plan_command(log)}), which trains "
                            f"it under the plan's own settings")
        return
    stem = f"train {run[: run.rindex('-seed')]}-seed"
    siblings = {s.removeprefix(stem): made_by for s, made_by in ended.items()
                if s.startswith(stem) and s.removeprefix(stem).isdigit()}
    if not siblings:
        return
    # each sibling's settings at this run's seed: equal to ours when only the seed differs
    logged = {seed: None if (theirs := logged_settings(made_by)) is None else dict(theirs, seed=ours.get("seed"))
              for seed, made_by in sorted(siblings.items(), key=lambda item: int(item[0]))}
    if ours in logged.values():
        return
    seed, theirs = next(iter(logged.items()))
    raise UserError(f"{results}/ holds committed runs of this task, scheme and L (seed {', '.join(logged)}), trained by "
                    f"its plan with other settings (seed {seed}: {changes(theirs, ours)}); this run's rows would join "
                    f"theirs as the same experiment's: train it as a trial under name=<another folder>, or with the "
                    f"plan's settings")
