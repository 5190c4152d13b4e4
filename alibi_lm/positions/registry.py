"""Name -> scheme class. Each scheme module registers itself; the model never tests names."""

from __future__ import annotations

POSITION_SCHEMES: dict[str, type] = {}


def register(name: str):
    def wrap(cls):
        if name in POSITION_SCHEMES:
            raise ValueError(f"position scheme {name!r} registered twice")
        POSITION_SCHEMES[name] = cls
        cls.name = name
        return cls

    return wrap
