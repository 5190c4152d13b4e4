"""Name -> scheme class. Each scheme module registers itself; the model never tests names.

Each scheme's Options dataclass is the schema that configs/position/<name>.yaml extends; alibi_lm.config
stores it in Hydra's ConfigStore (schema/position/<name>) where configs are composed, so that the model
and the schemes import without Hydra."""

from __future__ import annotations

import dataclasses

POSITION_SCHEMES: dict[str, type] = {}  # in registration order: the order of tables and plots


def register(name: str):
    def wrap(cls):
        if name in POSITION_SCHEMES:
            raise ValueError(f"position scheme {name!r} registered twice")
        if "Options" not in vars(cls):  # no options of its own: an empty schema, which names the scheme
            cls.Options = dataclasses.make_dataclass(f"{cls.__name__}Options", [], bases=(cls.Options,))
            # where pickle finds it (<scheme module>.<Scheme>.Options): a config sent to another process, as
            # Hydra's submitit launcher sends each job's, then holds this very class
            cls.Options.__module__, cls.Options.__qualname__ = cls.__module__, f"{cls.__qualname__}.Options"
        POSITION_SCHEMES[name] = cls
        cls.name = name
        return cls

    return wrap


def scheme_of(options) -> str:
    """The registered name of the scheme whose Options class `options` is (or is an instance of)."""
    cls = options if isinstance(options, type) else type(options)
    return next(name for name, scheme in POSITION_SCHEMES.items() if scheme.Options is cls)
