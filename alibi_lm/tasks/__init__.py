"""Tasks: what a run is trained on (definitions only: their evaluation is alibi_lm/eval/task_evaluation.py, their tables and
report alibi_lm/results/task_*.py). `lm` (language modelling on data=, the default) and synthetic tasks that
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

# every module of this folder is a task definition or what they share (base, registry, training): importing them all
# registers any task added as a module here
for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")


def task_options(name: str, options: Mapping | TaskOptions | None) -> TaskOptions:
    """The options dataclass of task `name` from a dict (a run's config.yaml) or itself, validated."""
    return options_of(TASKS, "task", "task", name, options)


def build_task(name: str, options: Mapping | TaskOptions | None = None) -> Task:
    return TASKS[name](task_options(name, options))


__all__ = ["TASKS", "Batch", "Task", "TaskOptions", "build_task", "random_positions", "task_of", "task_options"]
