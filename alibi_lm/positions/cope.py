"""CoPE (Golovneva et al., 2024, arXiv 2405.18719, "Contextual Position Encoding: Learning to Count What's
Important"): positions counted by gates that the content decides, per query and head.

    g_ij = sigmoid(q_i . k_j / sqrt(Dh))                       j <= i (0 for future keys)
    p_ij = min(sum_{t=j..i} g_it, npos_max - 1)                 a fractional position
    z_i[p] = q_i . e[p]                                         p = 0 .. npos_max - 1, integer positions
    bias_ij = ((1 - w) z_i[floor p_ij] + w z_i[ceil p_ij]) / sqrt(Dh),   w = p_ij - floor p_ij

added to the scaled score q_i . k_j / sqrt(Dh). The vectors e (npos_max, Dh) are learned per layer and
shared by the heads, initialised to zero (the model starts as nope).

Followed: the authors' code (facebookresearch/RAM, projects/cope/src/cope/context_position.py,
ContextPosSelfAttn): gates from the same keys as the scores (their default, no --cope-sep-key), divided
by sqrt(Dh) before the sigmoid; gates of masked keys multiplied by 0 before the reverse cumulative sum
(flip, cumsum, flip); positions clamped to npos - 1; logits_int = q @ pos_emb, gathered at floor and ceil
and mixed with w = p - floor (no gradient through the indices, through w only); the position logits
added to q k^T *before* the division by sqrt(Dh) (their default, no --cope-nodiv), which is the bias
divided by sqrt(Dh) here; pos_emb zeros (1, head_dim, npos) per layer (not --cope-shared) and shared by
the heads. Their npos defaults to block size + 1 (every position); here npos_max = 64, so that positions
past it count as npos_max - 1, as the clamp does there.

x-transformers (lucidrains, x_transformers.py, class CoPE, default max_pos 16) differs in two places: its
gates are the sigmoid of the logits after every other bias (ALiBi, ...) and the causal mask (-max) are
applied, and its position logits q @ pos_emb are added to the *scaled* logits without the division by
sqrt(Dh) (the test checks it equals bias * sqrt(Dh) here). Its pos_emb is per Attention (per layer) too.

CoPE gives attention no absolute position at all: shifting every position changes nothing (shift_invariant).
Its bias is computed per query block, over the keys the block sees, in (B, H, tq, tk) tensors. In CPU inference
(autograd off) the steps after the sigmoid run over slices of the block's query rows (row_slices), small enough to
stay in a core's cache. Each of those steps is exact (where, flip, clamp, floor, subtraction, gather), sums along a
row in one order (cumsum), or rounds the same in its vectorized and scalar code (lerp, checked by the tests), so
the bias is the whole block's bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import ConfigError
from .base import PositionOptions, PositionScheme, ScoreBlock
from .registry import register

# Values (B * H * rows * tk) of one row slice's temporaries in CPU inference: 1 MiB per float32 temporary (a slice
# holds a few at a time, its int64 indices 2 MiB), so that they stay in a core's L2 or near it.
# The whole 16L block of the task suite's passkey (16 x 4 x 128 x 1,024 values, 32 MiB per temporary) went
# through memory a dozen times; in slices of this size its forward took about half the time (bit for bit the same).
ROW_SLICE_VALUES = 1 << 18


@dataclass
class CopeOptions(PositionOptions):
    npos_max: int = 64  # learned position vectors e[0 .. npos_max - 1]; larger counts are clamped to npos_max - 1

    def __post_init__(self):
        if not int(self.npos_max) >= 2:
            raise ConfigError(f"cope needs position.npos_max >= 2, got {self.npos_max}; e.g. position.npos_max=64")


def row_slices(scores: torch.Tensor) -> list[tuple[int, int]]:
    """The query rows [r0, r1) over which cope_bias works for scores (B, H, tq, tk): the whole block where autograd
    keeps every temporary anyway or off the CPU (a slice is a kernel launch there), else slices of about
    ROW_SLICE_VALUES values."""
    batch, heads, n_rows, n_keys = scores.shape
    if torch.is_grad_enabled() or scores.device.type != "cpu":
        return [(0, n_rows)]
    rows = max(1, ROW_SLICE_VALUES // (batch * heads * n_keys))
    return [(r0, min(r0 + rows, n_rows)) for r0 in range(0, n_rows, rows)]


def cope_bias(q: torch.Tensor, scores: torch.Tensor, future: torch.Tensor, pos_emb: torch.Tensor) -> torch.Tensor:
    """CoPE's bias (B, H, tq, tk) for queries q (B, H, tq, Dh) with scaled scores q k^T / sqrt(Dh) (B, H, tq, tk),
    `future` (tq, tk) True on masked keys, and one layer's position vectors pos_emb (npos, Dh)."""
    npos, head_dim = pos_emb.shape
    # The sigmoid and q @ e run over the whole block, sliced or not: a vectorized sigmoid's last bit differs from its
    # scalar tail's, and where a tail falls depends on the tensor's shape; a matmul over fewer rows may block differently.
    # q_i . e[p] / sqrt(Dh) at the integer positions: interpolating after the division is the same, on fewer values
    logits_int = (q @ pos_emb.t().to(q.dtype)).float() / math.sqrt(head_dim)  # (B, H, tq, npos)
    slices = row_slices(scores)
    if len(slices) == 1:  # no name here holds the sigmoids: they are freed once interpolated_bias has its gates
        return interpolated_bias(scores.float().sigmoid(), future, logits_int)
    sigmoids = scores.float().sigmoid()  # (B, H, tq, tk)
    for r0, r1 in slices:  # inference: each slice's bias overwrites the sigmoids it was computed from
        sigmoids[:, :, r0:r1] = interpolated_bias(sigmoids[:, :, r0:r1], future[r0:r1], logits_int[:, :, r0:r1])
    return sigmoids  # (B, H, tq, tk), the bias now


def interpolated_bias(sigmoids: torch.Tensor, future: torch.Tensor, logits_int: torch.Tensor) -> torch.Tensor:
    """(B, H, rows, tk) bias of some query rows from their sigmoid(q k^T / sqrt(Dh)) (B, H, rows, tk), `future`
    (rows, tk) and logits q . e / sqrt(Dh) (B, H, rows, npos): positions p summed from the gates, z interpolated at p."""
    npos = logits_int.shape[-1]
    gates = torch.where(future, 0.0, sigmoids)  # (B, H, rows, tk)
    del sigmoids  # a whole block's, which no other name holds (training, a GPU): one (B, H, tq, tk) tensor fewer
    # p_ij = sum of g_it over t >= j; future gates are 0, so over j <= t <= i
    positions = gates.flip(-1).cumsum(-1).flip(-1).clamp(max=npos - 1)  # (B, H, rows, tk)
    del gates  # each block's (B, H, rows, tk) tensors are the evaluation's memory at 16L: hold few at a time
    floor = positions.floor()
    weight = positions - floor  # the gradient reaches the gates through w only
    index = floor.long()  # (B, H, rows, tk)
    del floor, positions
    lower = logits_int.gather(-1, index)  # (B, H, rows, tk)
    # ceil p is floor p + 1, or floor p itself where p is an integer (w = 0: then the upper value counts for nothing)
    upper = logits_int.gather(-1, (index + 1).clamp_(max=npos - 1))  # a new index: gather keeps the first for backward
    return torch.lerp(lower, upper, weight)  # (1 - w) z[floor p] + w z[ceil p]


@register("cope")
class ContextualPosition(PositionScheme):
    Options = CopeOptions
    content_aware = True
    per_layer = True
    shift_invariant = True  # no absolute position anywhere

    def __init__(self, n_head: int, d_model: int, options: CopeOptions | None = None, n_layer: int = 1):
        super().__init__(n_head, d_model, options, n_layer)
        self.pos_emb = nn.Parameter(torch.zeros(n_layer, int(self.options.npos_max), self.head_dim))  # (n_layer, npos, Dh)

    def content_bias(self, block: ScoreBlock) -> torch.Tensor:
        return cope_bias(block.q, block.scores, block.future, self.pos_emb[block.layer])  # (B, H, tq, tk)
