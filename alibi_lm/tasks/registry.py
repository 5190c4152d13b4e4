"""Name -> task class, as positions/registry.py is for schemes: each task module registers itself, and
TASKS is the one list of tasks (the order of tables). Each task's Options dataclass is the schema that
configs/task/<name>.yaml extends (alibi_lm.config stores it in Hydra's ConfigStore as schema/task/<name>)."""

from __future__ import annotations

import dataclasses

TASKS: dict[str, type] = {}


def register(name: str):
    def wrap(cls):
        if name in TASKS:
            raise ValueError(f"task {name!r} registered twice")
        if "Options" not in vars(cls):  # no options of its own: an empty schema, which names the task
            cls.Options = dataclasses.make_dataclass(f"{cls.__name__}Options", [], bases=(cls.Options,))
            cls.Options.__module__, cls.Options.__qualname__ = cls.__module__, f"{cls.__qualname__}.Options"
        TASKS[name] = cls
        cls.name = name
        return cls

    return wrap


def task_of(options) -> str:
    """The registered name of the task whose Options class `options` is (or is an instance of)."""
    cls = options if isinstance(options, type) else type(options)
    return next(name for name, task in TASKS.items() if task.Options is cls)
