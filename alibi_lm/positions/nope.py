"""No position information at all: the causal mask alone (a control; Haviv et al., 2022)."""

from .base import PositionScheme
from .registry import register


@register("nope")
class NoPosition(PositionScheme):
    shift_invariant = True
