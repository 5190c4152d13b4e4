"""Tasks: what a run is trained on. `lm` (language modelling on data=, the default) and synthetic tasks that
test whether a scheme lets a model use positions beyond L. Adding one = a module in this folder registering a
Task subclass (with its Options dataclass), plus configs/task/<name>.yaml; TASKS is the one list of tasks."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping

from ..registry import options_of
from .base import Batch, Task, TaskOptions, random_positions
from .registry import TASKS, task_of

# isort: off
from . import lm, passkey, mqar, copy, flipflop  # noqa: F401 - the order of tables
# isort: on

# the machinery beside the tasks (imported where it is used: it needs alibi_lm.config, which needs the tasks)
MACHINERY = {"base", "registry", "training", "evaluation", "results", "report", "retrieval"}
for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_") and _module.name not in MACHINERY:
        importlib.import_module(f"{__name__}.{_module.name}")


def task_options(name: str, options: Mapping | TaskOptions | None) -> TaskOptions:
    """The options dataclass of task `name` from a dict (a run's config.yaml) or itself, validated."""
    return options_of(TASKS, "task", "task", name, options)


def build_task(name: str, options: Mapping | TaskOptions | None = None) -> Task:
    return TASKS[name](task_options(name, options))


__all__ = ["TASKS", "Batch", "Task", "TaskOptions", "build_task", "random_positions", "task_of", "task_options"]
