"""Position schemes. Adding one = a module in this folder that registers a PositionScheme
subclass, plus configs/position/<name>.yaml. Modules here are imported automatically."""

from __future__ import annotations

import importlib
import pkgutil

from .alibi import alibi_bias, alibi_bias_matrix, alibi_slopes
from .base import PositionRangeError, PositionScheme
from .registry import POSITION_SCHEMES
from .t5 import t5_relative_bucket

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")


def build_position_scheme(name: str, n_head: int, d_model: int, **options) -> PositionScheme:
    if name not in POSITION_SCHEMES:
        raise ValueError(
            f"unknown position scheme {name!r}; choose one of {sorted(POSITION_SCHEMES)} "
            f"(or add alibi_lm/positions/{name}.py and configs/position/{name}.yaml)"
        )
    try:
        return POSITION_SCHEMES[name](n_head=n_head, d_model=d_model, **options)
    except TypeError as e:  # an option the scheme does not take
        raise ValueError(f"position scheme {name!r} got a bad option: {e}") from None


__all__ = [
    "POSITION_SCHEMES",
    "PositionRangeError",
    "PositionScheme",
    "alibi_bias",
    "alibi_bias_matrix",
    "alibi_slopes",
    "build_position_scheme",
    "t5_relative_bucket",
]
