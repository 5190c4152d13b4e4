"""Position schemes. Adding one = a module in this folder that registers a PositionScheme subclass
(with its options dataclass), plus configs/position/<name>.yaml. Modules here are imported
automatically; POSITION_SCHEMES is the one list of schemes, in the order of every table and plot."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping

from ..registry import options_of
from .base import PositionOptions, PositionRangeError, PositionScheme, ScoreBlock, rescaling_refusal
from .registry import POSITION_SCHEMES

# isort: off
from . import sinusoidal, learned, t5, rope, alibi, nope  # noqa: F401 - the paper's order: registered first
# then the later schemes in the order they joined (a scheme's place is its colour in every plot); new ones after
from . import fire, kerple, sandwich, xpos, cope, fox  # noqa: F401
# isort: on
from .alibi import alibi_bias, alibi_bias_matrix, alibi_slopes
from .t5 import t5_relative_bucket

for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")


def scheme_options(name: str, options: Mapping | PositionOptions) -> PositionOptions:
    """The options dataclass of scheme `name` from a dict (a checkpoint's, a test's) or itself, validated."""
    return options_of(POSITION_SCHEMES, "position scheme", "position", name, options)


def build_position_scheme(name: str, n_head: int, d_model: int, n_layer: int = 1, **options) -> PositionScheme:
    """Scheme `name` for a model of n_layer layers: a per_layer scheme (cope, fox) holds parameters for each, the
    others are shared by all layers and never see n_layer."""
    options = scheme_options(name, options)  # raises for an unknown name
    scheme = POSITION_SCHEMES[name]
    return scheme(n_head, d_model, options, n_layer=n_layer) if scheme.per_layer else scheme(n_head, d_model, options)


__all__ = [
    "POSITION_SCHEMES",
    "PositionOptions",
    "PositionRangeError",
    "PositionScheme",
    "ScoreBlock",
    "alibi_bias",
    "alibi_bias_matrix",
    "alibi_slopes",
    "build_position_scheme",
    "rescaling_refusal",
    "scheme_options",
    "t5_relative_bucket",
]
