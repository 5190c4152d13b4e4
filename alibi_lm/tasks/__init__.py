"""Tasks: what a run is trained on. `lm` (language modelling on data=, the default) and synthetic tasks that
test whether a scheme lets a model use positions beyond L. Adding one = a module in this folder registering a
Task subclass (with its Options dataclass), plus configs/task/<name>.yaml; TASKS is the one list of tasks."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping

from ..errors import ConfigError
from .base import Batch, Task, TaskOptions, random_positions
from .registry import TASKS, task_of

# isort: off
from . import lm, passkey, mqar, copy, flipflop  # noqa: F401 - the order of tables
# isort: on

# the machinery beside the tasks (imported where it is used: it needs alibi_lm.config, which needs the tasks)
MACHINERY = {"base", "registry", "training", "evaluation", "results", "report"}
for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_") and _module.name not in MACHINERY:
        importlib.import_module(f"{__name__}.{_module.name}")


def task_options(name: str, options: Mapping | TaskOptions | None) -> TaskOptions:
    """The options dataclass of task `name` from a dict (a run's config.yaml) or itself, validated."""
    if name not in TASKS:
        raise ConfigError(f"unknown task {name!r}; choose one of {', '.join(TASKS)} "
                          f"(or add alibi_lm/tasks/{name}.py and configs/task/{name}.yaml)")
    cls = TASKS[name].Options
    if isinstance(options, cls):
        return options
    try:
        return cls(**dict(options or {}))
    except TypeError as e:  # an option the task does not take
        raise ConfigError(f"task {name!r} got a bad option: {e}") from None


def build_task(name: str, options: Mapping | TaskOptions | None = None) -> Task:
    return TASKS[name](task_options(name, options))


__all__ = ["TASKS", "Batch", "Task", "TaskOptions", "build_task", "random_positions", "task_of", "task_options"]
