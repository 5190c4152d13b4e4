"""No position information at all: the causal mask alone (a control; Haviv et al., 2022)."""

from dataclasses import dataclass

from .base import PositionOptions, PositionScheme
from .registry import register


@dataclass
class NopeOptions(PositionOptions):
    """None."""


@register("nope")
class NoPosition(PositionScheme):
    Options = NopeOptions
