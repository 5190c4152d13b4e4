"""Which experiment folder a training command writes to: committed results are never changed by accident.

`python -m alibi_lm.train experiment=X ...` names its runs and results X (runs/X/, results/X/) only when it
trains what configs/experiment/X.yaml alone trains: every setting that changes the trained model or its
scores (all but the train app's NOT_MODEL_KEYS, plus training.run_log.row_keys) equal, the scheme, the task, randomized positions
and the seed aside (they are in the run folder's name and the results rows' key), and the same L. Otherwise the name becomes
X-custom-<digest of the differing settings> (L left out of the digest, so that a sweep over L keeps one
folder), and one line says where the runs go and why. An explicit name= always wins. Variants that the run
folder and the rows name (alibi+learn_slopes, rope+qk_norm, nope+ssmax, rope+nope4-w64: model.position_label)
count as schemes: they are the experiment's own runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

from .checkpoint import flat_config
from .cli import cell_named, command_overrides, sweep_cells
from .config import compose, to_job
from .errors import UserError
from .labels import CUSTOM_MARK
from .model import LABELED_FIELDS, LMConfig, position_label
from .positions import scheme_options
from .positions.base import override_value
from .tasks.budgets import SUITE_EXPERIMENT, suite_overrides
from .training.reuse import free_keys
from .training.run_log import row_keys

BESIDE = "${paths.runs}/${name}/results"  # configs/train.yaml's paths.results
COMMITTED_RESULTS = "results"  # the committed experiments' paths.results (configs/experiment/cpu-wt2.yaml, tasks.yaml)


def flat(job) -> dict:
    """{"train.lr": 0.002, ...}: a job's entries by dotted key."""
    return flat_config(dataclasses.asdict(job))


def differences(cell: list[str], experiment: str, free: tuple[str, ...], cache: dict) -> tuple[dict, bool, object]:
    """(the entries of the cell's config that differ from experiment X.yaml's at the cell's scheme, seed and L,
    with their values in the cell; whether L differs from X.yaml's; the cell's job)."""
    cfg = compose("train", cell)
    job = to_job(cfg)
    scheme, task = (str(cfg.hydra.runtime.choices.get(group)) for group in ("position", "task"))
    # the scheme, the task and randomized positions, like the seed, are in the run folder's name and the rows' key
    positions = [f"train.positions={job.train.positions}", f"train.max_position={job.train.max_position}"]
    # the user's config folders (hydra.searchpath): where an experiment, scheme or task of theirs is found
    sources = tuple(o for o in cell if o.split("=", 1)[0].lstrip("+") == "hydra.searchpath")
    # the task suite's runs are experiment=tasks with their task's budget (tasks/budgets.py): a run by hand without it
    # is a trial, not one of the suite's
    suite = suite_overrides(task, position_label(job.model), job.train.positions) if experiment == SUITE_EXPERIMENT else []
    at = (f"experiment={experiment}", f"position={scheme}", f"task={task}", f"seed={job.seed}",
          f"train.seq_len={job.train.seq_len}", *(positions if job.train.positions == "random" else []), *suite,
          *labeled_overrides(job.model), *sources)
    if at not in cache:
        cache[at] = flat(to_job(compose("train", list(at))))
    if (experiment, sources) not in cache:
        cache[experiment, sources] = to_job(compose("train", [f"experiment={experiment}", *sources])).train.seq_len
    free, scored = free_keys(job, free), row_keys(job)
    now, reference = flat(job), cache[at]
    changed = {k: v for k, v in now.items()
               if (not k.startswith(free) or k in scored) and k in reference and reference[k] != v}
    return changed, job.train.seq_len != cache[experiment, sources], job


def labeled_overrides(model: LMConfig) -> list[str]:
    """The overrides that set a model's labeled settings (model.LABELED_FIELDS, its scheme's labeled options) to
    its values: a variant such as alibi+learn_slopes or rope+nope4 is named in its run folder and rows, so it is
    the experiment's own run, as another scheme is."""
    options = scheme_options(model.position, model.position_options)
    return [f"model.{name}={override_value(getattr(model, name))}" for name in LABELED_FIELDS] + options.labeled_overrides()


def custom_name(args: list[str], free: tuple[str, ...]) -> list[str]:
    """args, with name=<X>-custom-<digest> added when the command's config differs from experiment X's
    (module docstring); unchanged without experiment= or with name=. Every cell of a -m sweep shares the name:
    cells that differ from X in different settings are refused."""
    overrides = command_overrides(args)
    keys = {a.split("=", 1)[0].lstrip("+~"): a.split("=", 1)[-1] for a in overrides}
    experiment = keys.get("experiment")
    if experiment in (None, "", "null"):
        return args
    if "name" in keys:
        return own_folder_beside_runs(args, overrides, keys, experiment)
    multirun = any(a in ("-m", "--multirun") for a in args)
    cache: dict = {}
    cells, found = sweep_cells(overrides) if multirun else [overrides], []
    for cell in cells:
        with cell_named("train", overrides, cell, len(cells)):
            found.append(differences(cell, experiment, free, cache))
    if not any(changed or other_L for changed, other_L, _ in found):
        return args
    digests = {hashlib.sha256(json.dumps(changed, sort_keys=True, default=str).encode()).hexdigest()[:8]
               for changed, _, _ in found}
    if len(digests) > 1:
        raise UserError(f"the cells of this sweep differ from configs/experiment/{experiment}.yaml in different "
                        f"settings, so their runs need different folders: a run folder is named by scheme, L and seed "
                        f"only, so cells of one scheme under one name= would meet in one; run one command per setting "
                        f"(each gets a name of its own), or give each its own name= "
                        f"(-m train.lr=1e-3,2e-3 -> one command each, e.g. name=lr1e-3)")
    name = f"{experiment}{CUSTOM_MARK}{digests.pop()}"
    shown = {f"{k}={v}" for changed, _, _ in found for k, v in changed.items()}
    shown |= {"train.seq_len (L)" for _, other_L, _ in found if other_L}
    paths = found[0][2].paths
    # its results go beside its runs (train.yaml's default, BESIDE), not where X's go (a committed experiment's
    # results/), unless the command names paths.results itself
    results = paths.results if "paths.results" in keys else f"{paths.runs}/{name}/results"
    if os.environ.get("RANK", "0") == "0":  # once under torchrun
        verb = "differs" if len(shown) == 1 else "differ"
        source = f"configs/experiment/{experiment}.yaml"
        if experiment == SUITE_EXPERIMENT:  # the suite's run: the experiment with its task's budget
            source += " with the task's budget (alibi_lm/tasks/budgets.py, as scripts/tasks.py trains it)"
        print(f"note: {', '.join(sorted(shown))} {verb} from {source}, so this is not that experiment's run: "
              f"name={name} (runs in {paths.runs}/{name}/, results in {results}/{name}/); set name= to choose the "
              f"folder")
    beside = [] if "paths.results" in keys else [f"paths.results={BESIDE}"]
    return with_overrides(args, overrides, [f"name={name}", *beside])


def with_overrides(args: list[str], overrides: list[str], more: list[str]) -> list[str]:
    """args with `more` right after the last override: argparse takes the overrides as one run of arguments."""
    last = max(i for i, arg in enumerate(args) if arg in overrides)
    return [*args[: last + 1], *more, *args[last + 1 :]]


def own_folder_beside_runs(args: list[str], overrides: list[str], keys: dict, experiment: str) -> list[str]:
    """args, with paths.results beside the runs where name= names a folder other than experiment X's own and X writes
    its rows under the committed results/ (cpu-wt2, tasks): a folder of the user's is a trial's, and results/ holds
    committed experiments only. A plan that makes a committed folder of another name says paths.results=results."""
    if keys["name"] == experiment or "paths.results" in keys:
        return args
    sources = [o for o in overrides if o.split("=", 1)[0].lstrip("+") == "hydra.searchpath"]
    if str(compose("train", [f"experiment={experiment}", *sources]).paths.results) != COMMITTED_RESULTS:
        return args
    name = keys["name"]
    if os.environ.get("RANK", "0") == "0":  # once under torchrun
        print(f"note: name={name} is not experiment {experiment}'s own folder, so its rows go beside its runs "
              f"(<paths.runs>/{name}/results/{name}/), not under {COMMITTED_RESULTS}/; set "
              f"paths.results={COMMITTED_RESULTS} to make it a committed experiment's")
    return with_overrides(args, overrides, [f"paths.results={BESIDE}"])
