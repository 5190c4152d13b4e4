"""Name -> class tables for the parts a user picks by name in a config: position schemes (positions/registry.py)
and tasks (tasks/registry.py). Each table is the one list of its kind, in registration order (the order of tables
and plots); each class carries an Options dataclass, the schema its configs/<group>/<name>.yaml extends."""

from __future__ import annotations

import dataclasses
import difflib

from .errors import ConfigError


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


def options_of(table: dict[str, type], kind: str, folder: str, name: str, options):
    """The Options of `name` in `table` from a dict (a checkpoint's, a run's config.yaml, a test's), None (the
    defaults) or an Options itself, validated; an unknown name or option is a one-line ConfigError. `folder`
    names where a new one goes (positions: alibi_lm/positions/<name>.py and configs/position/<name>.yaml)."""
    if name not in table:
        raise ConfigError(f"unknown {kind} {name!r}; choose one of {', '.join(table)} (or add "
                          f"alibi_lm/{folder}s/{name}.py and configs/{folder}/{name}.yaml)")
    cls = table[name].Options
    if isinstance(options, cls):
        return options
    given, fields = dict(options or {}), [f.name for f in dataclasses.fields(cls)]
    if unknown := [key for key in given if key not in fields]:
        close = difflib.get_close_matches(unknown[0], fields, n=1)
        hint = f"did you mean {folder}.{close[0]}? " if close else ""
        raise ConfigError(f"{kind} {name!r} has no option {unknown[0]!r}; {hint}its options: "
                          f"{', '.join(fields) or 'none'}")
    try:
        return cls(**given)
    except TypeError as e:  # e.g. a required field left out
        raise ConfigError(f"{kind} {name!r} got a bad option: {e}") from None
