"""What every training-free extension method is: a key mask plus a distance remap d -> d' (d = i - j).

A method sees a block of queries at absolute positions i (tq,) and their keys at j (tk,) and answers with a Remap:
which keys each query keeps (`visible`, the causal mask comes on top) and, for every kept pair, the distance the
position scheme is given instead of i - j. Every rule here is piecewise affine, d' = a_p(i) - b_p(j) on piece p,
so a Remap holds the pieces' positions and, per pair, its piece:

    a bias scheme (ALiBi, T5, KERPLE, Sandwich, FIRE) takes d' = a_p(i) - b_p(j) in PositionScheme.distance_bias;
    a rotary scheme (RoPE, xPos) rotates the queries at a_p(i) and the keys at b_p(j), one pass per piece, and
    each pair's score is taken from its piece's pass (extension.rotary): exact, since the rotated product of q at
    a and k at b depends on a - b only.

Absolute schemes (sinusoidal, learned: added to the tokens at the input) and content-aware ones (FoX, CoPE: the
bias depends on what lies between i and j) are refused in one line; NoPE, which has no distance, takes only a
method that hides keys (streaming, lm_infinite). check_scheme() says which.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..errors import ConfigError
from ..labels import label_number
from ..positions import PositionScheme


@dataclass
class Remap:
    """One block's mask and remapped distances: d'(i, j) = q_at[piece[i, j], i] - k_at[piece[i, j], j]."""

    q_at: torch.Tensor  # (P, tq) float64: the position each query takes in piece p
    k_at: torch.Tensor  # (P, tk) float64: the position each key takes in piece p
    piece: torch.Tensor | None  # (tq, tk) long, which piece a pair uses; None when P == 1
    visible: torch.Tensor | None  # (tq, tk) bool: the keys the method keeps (None: all of them)

    def distance(self) -> torch.Tensor:
        """(tq, tk) float64 d' of every pair (negative for future keys, which the causal mask hides)."""
        d = self.q_at[:, :, None] - self.k_at[:, None, :]  # (P, tq, tk)
        return d[0] if self.piece is None else d.gather(0, self.piece[None]).squeeze(0)


@dataclass
class ExtensionOptions:
    """A method's extension.* keys: fields default to None where the default follows L (resolve() fills them).
    label() names the values set explicitly, as the rows' rope_scaling column and reports carry them."""

    def resolve(self, train_len: int) -> ExtensionOptions:
        """A copy with every None filled from the training length L (the reference code's defaults, scaled)."""
        return dataclasses.replace(self)

    def label(self) -> str:
        return "".join(f"-{f.name}{label_number(getattr(self, f.name))}" for f in dataclasses.fields(self)
                       if getattr(self, f.name) is not None and getattr(self, f.name) != f.default)


def positive(key: str, value, minimum: float = 1) -> None:
    """A one-line ConfigError unless `value` (when set) is at least `minimum`."""
    if value is not None and not value >= minimum:
        raise ConfigError(f"extension.{key} must be >= {minimum:g}, got {value!r}")


class ExtensionMethod:
    """A mask plus a distance remap for a model trained at length L; remap() for one block of queries."""

    name: ClassVar[str]
    Options: ClassVar[type[ExtensionOptions]] = ExtensionOptions
    # True when the method hides keys: it then has a meaning even for a scheme without distances (NoPE)
    hides_keys: ClassVar[bool] = False

    def __init__(self, options: ExtensionOptions | None, train_len: int):
        self.given = self.Options() if options is None else options  # as set: label() names these
        self.train_len = int(train_len)
        self.options = self.given.resolve(self.train_len)

    def at_length(self, eval_len: int) -> None:
        """Settings that follow the evaluation length Lv (Self-Extend's group size) are set here, per length."""

    def remap(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> Remap:
        """(tq,), (tk,) absolute positions -> the block's Remap."""
        raise NotImplementedError

    def label(self) -> str:
        return self.name + self.given.label()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.options}, L={self.train_len})"


def affine(q_at: list[torch.Tensor], k_at: list[torch.Tensor], piece, visible) -> Remap:
    """A Remap from per-piece position vectors (float64)."""
    return Remap(torch.stack([a.to(torch.float64) for a in q_at]), torch.stack([b.to(torch.float64) for b in k_at]),
                 piece, visible)


def scheme_kind(scheme: type[PositionScheme] | PositionScheme) -> str:
    """How a scheme takes positions: absolute, content (content-aware), rotary, bias (a bias of the distance,
    distance_bias), score (a score_bias alone, as a new scheme may have) or none (NoPE)."""
    kind = scheme if isinstance(scheme, type) else type(scheme)
    if kind.embedding is not PositionScheme.embedding:
        return "absolute"
    if kind.content_aware:
        return "content"
    if kind.rotation_at is not PositionScheme.rotation_at:
        return "rotary"
    if kind.distance_bias is not PositionScheme.distance_bias:
        return "bias"
    if kind.score_bias is not PositionScheme.score_bias:  # a bias of positions, with no distance to remap given
        return "score"
    return "none"


def check_scheme(method: type[ExtensionMethod] | ExtensionMethod, scheme, name: str) -> None:
    """A one-line ConfigError where `method` has no meaning for position scheme `scheme` (called `name`)."""
    method_name = method.name
    kind = scheme_kind(scheme)
    if kind == "absolute":
        raise ConfigError(f"extension={method_name} cannot extend position={name}: its absolute positions are added to "
                          f"the tokens at the input, so attention has no distance to remap; drop extension")
    if kind == "content":
        raise ConfigError(f"extension={method_name} cannot extend position={name}: its bias depends on the content "
                          f"between query and key, not on a distance that can be remapped; drop extension")
    if kind == "score":
        raise ConfigError(f"extension={method_name} cannot extend position={name}: it gives score_bias(q_pos, k_pos) "
                          f"but no distance_bias(q_pos, distance), the bias an extension feeds remapped distances; "
                          f"implement distance_bias (docs/position-schemes.md) or drop extension")
    if kind == "none" and not method.hides_keys:
        raise ConfigError(f"extension={method_name} changes only distances, and position={name} has none: it would "
                          f"change nothing; use extension=streaming or extension=lm_infinite, or drop extension")
