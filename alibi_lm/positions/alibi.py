"""ALiBi (Press et al., 2022): a fixed per-head linear penalty -m_h * (i - j) on attention scores.

No position embedding anywhere; the bias is not scaled by 1/sqrt(d) (it is added after scaling).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .base import PositionOptions, PositionScheme
from .registry import register


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """(H,) head slopes exactly as the official code computes them, for any head count.

    For H a power of 2 the slopes are geometric with start and ratio 2^(-8/H). Otherwise take the
    slopes of the closest smaller power of 2, c, then every other slope of the 2c-head sequence
    until there are H (so 12 heads: 2^-1..2^-8, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5).
    """
    num_heads = int(num_heads)
    if num_heads < 1:
        raise ValueError(f"alibi_slopes needs num_heads >= 1, got {num_heads}")

    def power_of_2(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    closest = 2 ** math.floor(math.log2(num_heads))
    slopes = power_of_2(closest)
    if closest < num_heads:
        slopes += power_of_2(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(num_heads: int, q_pos, k_pos, causal: bool = True) -> torch.Tensor:
    """(H, len(q_pos), len(k_pos)) ALiBi bias for explicit absolute query and key positions.

    causal=True: -m_h * (i - j) where j <= i and -inf where j > i (decoder).
    causal=False: -m_h * |i - j| (bidirectional, for encoders).
    """
    q_pos = torch.as_tensor(q_pos)
    k_pos = torch.as_tensor(k_pos)
    slopes = alibi_slopes(num_heads).to(q_pos.device)
    distance = (q_pos[:, None] - k_pos[None, :]).to(torch.float32)  # (Tq, Tk), i - j
    if not causal:
        return -slopes[:, None, None] * distance.abs()[None]
    bias = -slopes[:, None, None] * distance[None]  # (H, Tq, Tk)
    return bias.masked_fill((distance < 0)[None], float("-inf"))


def alibi_bias_matrix(seed, num_heads, T) -> np.ndarray:
    """Flattened (H, T, T) causal ALiBi bias as a 1-D float64 array, -1e9 where j > i.

    It keeps the fixed contract it was specified with, which the model does not follow: slopes
    2^(-8(h+1)/H) for h in [0, H) for every H, and a `seed` argument that is accepted and unused. For H a
    power of 2 these are alibi_slopes(H); for any other H they differ from alibi_slopes (the official
    code's, which the model uses), e.g. 12 heads: 2^(-2/3), 2^(-4/3), ... here against 2^-1, 2^-2, ... there.
    """
    del seed
    num_heads, T = int(num_heads), int(T)
    slopes = 2.0 ** (-8.0 * (np.arange(num_heads) + 1) / num_heads)  # (H,)
    pos = np.arange(T)
    distance = (pos[:, None] - pos[None, :]).astype(np.float64)  # (T, T), i - j
    bias = -slopes[:, None, None] * distance[None]  # (H, T, T)
    bias = np.where(distance[None] < 0, -1e9, bias)
    return bias.reshape(-1)


@dataclass
class AlibiOptions(PositionOptions):
    labeled = ("learn_slopes",)  # a variant with rows of its own: PositionOptions.label
    # learn the slopes (from the official ones; kept positive as exp of a learned log-slope, one per head);
    # the paper's ALiBi keeps them fixed. Their learned values are logged and recorded with the run.
    learn_slopes: bool = False


@register("alibi")
class ALiBi(PositionScheme):
    Options = AlibiOptions
    static_bias = True
    relative_bias = True
    shift_invariant = True

    def __init__(self, n_head: int, d_model: int, options: AlibiOptions | None = None):
        super().__init__(n_head, d_model, options)
        if self.options.learn_slopes:
            self.log_slopes = nn.Parameter(alibi_slopes(n_head).log())  # (H,)
            self.static_bias = False  # the bias changes with every step: not cached across forwards
        else:
            self.register_buffer("fixed_slopes", alibi_slopes(n_head), persistent=False)  # (H,)

    @property
    def slopes(self) -> torch.Tensor:
        """(H,) m_h: the official slopes, or their learned values."""
        return self.log_slopes.exp() if self.options.learn_slopes else self.fixed_slopes

    def learned_values(self) -> dict[str, float]:
        if not self.options.learn_slopes:
            return {}
        return {f"alibi_slope_{h}": m for h, m in enumerate(self.slopes.tolist())}

    def score_bias(self, q_pos, k_pos):
        distance = (q_pos[:, None] - k_pos[None, :]).to(torch.float32)  # (Tq, Tk), i - j
        # Future keys (i - j < 0) get masked by the model; their value here does not matter.
        return -self.slopes[:, None, None] * distance  # (H, Tq, Tk)

    def distance_bias(self, q_pos, distance):
        return -self.slopes[:, None, None] * distance.to(torch.float32)[None]  # (H, tq, tk)

    def flex_score_mod(self, q_offset, k_offset):
        slopes = self.slopes  # (H,) float32
        # a tensor, not a Python int, so that a new offset does not recompile the kernel
        offset = torch.tensor(int(q_offset) - int(k_offset), device=slopes.device)

        def alibi_score_mod(score, b, h, q_idx, kv_idx):
            return score - slopes[h] * (q_idx - kv_idx + offset).to(torch.float32)

        return alibi_score_mod
