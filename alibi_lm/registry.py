"""Name -> class tables for the parts a user picks by name in a config: position schemes (positions/registry.py)
and tasks (tasks/registry.py). Each table is the one list of its kind, in registration order (the order of tables
and plots); each class carries an Options dataclass, the schema its configs/<group>/<name>.yaml extends."""

from __future__ import annotations

import dataclasses


def registrar(table: dict[str, type], kind: str):
    """The `@register(name)` decorator of `table`: records the class under `name` (twice is an error), sets its
    `name`, and gives a class without options of its own an empty Options subclass, whose type names it in a
    composed config (found again by name_of)."""

    def register(name: str):
        def wrap(cls):
            if name in table:
                raise ValueError(f"{kind} {name!r} registered twice")
            if "Options" not in vars(cls):
                cls.Options = dataclasses.make_dataclass(f"{cls.__name__}Options", [], bases=(cls.Options,))
                # where pickle finds it (<module>.<Class>.Options): a config sent to another process, as Hydra's
                # submitit launcher sends each job's, then holds this very class
                cls.Options.__module__, cls.Options.__qualname__ = cls.__module__, f"{cls.__qualname__}.Options"
            table[name] = cls
            cls.name = name
            return cls

        return wrap

    return register


def name_of(table: dict[str, type], options) -> str:
    """The registered name of the class whose Options `options` is (or is an instance of)."""
    cls = options if isinstance(options, type) else type(options)
    return next(name for name, registered in table.items() if registered.Options is cls)
