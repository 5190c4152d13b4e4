"""Name -> task class, as positions/registry.py is for schemes: each task module registers itself, and TASKS is
the one list of tasks (the order of tables). Each task's Options dataclass is the schema that
configs/task/<name>.yaml extends (alibi_lm.config stores it in Hydra's ConfigStore as schema/task/<name>)."""

from __future__ import annotations

from functools import partial

from ..registry import name_of, registrar

TASKS: dict[str, type] = {}
register = registrar(TASKS, "task")
task_of = partial(name_of, TASKS)  # the registered name of the task whose Options `options` is
