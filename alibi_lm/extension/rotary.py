"""A rotary scheme under a remap: one pass per piece, each rotating the queries and keys at that piece's positions,
each pair's score taken from its own piece's pass (what Self-Extend and ReRoPE do with torch.where, and DCA with a
log-sum-exp merge of its passes' outputs: the same softmax). Exact, since a rotary score depends on a - b only."""

from __future__ import annotations

import math

import torch

from ..positions import PositionScheme
from .base import Remap


def rotate_with(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (..., T, Dh) rotated by tables (T, Dh) as the rope scheme's rotate() applies them."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat((x2, x1), dim=-1) * sin.to(x.dtype)


def remapped_scores(scheme: PositionScheme, q: torch.Tensor, k: torch.Tensor, remap: Remap) -> torch.Tensor:
    """(B, H, tq, tk) q k^T / sqrt(Dh) of unrotated queries q (B, H, tq, Dh) and keys k (B, H, tk, Dh), each pair
    rotated at its piece's positions: the query at remap.q_at[p], the key at remap.k_at[p]."""
    scores = None
    for p in range(remap.q_at.shape[0]):
        q_p = rotate_with(q, *scheme.rotation_at(remap.q_at[p], 0))  # (B, H, tq, Dh)
        k_p = rotate_with(k, *scheme.rotation_at(remap.k_at[p], 1))  # (B, H, tk, Dh)
        s = (q_p @ k_p.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, H, tq, tk)
        scores = s if scores is None else torch.where(remap.piece == p, s, scores)
    return scores
