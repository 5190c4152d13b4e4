"""Sandwich (Chi et al., ACL 2023, "Dissecting Transformer Length Extrapolation via the Lens of
Receptive Field Analysis"): the inner product of two sinusoidal position embeddings as a fixed
score bias, which decays with the distance d = i - j, rescaled per head like ALiBi's slopes:

    bias_h(d) = (sum_{k=1..Dh/2} cos(d / 10000^(2k/Dh)) - Dh/2) / (8h / H),   h = 1..H

with Dh the head dimension, as NVIDIA NeMo's sandwich_relative_position_embedding.py computes it
(its hidden_size is the per-head size). 0 at d = 0, negative beyond. No parameters: the folded bias
is cached by the model. The values come from a (H, N) table of distances 0..N-1 (float64 sums),
grown geometrically, so a long evaluation never sums (Tq, Tk, Dh/2) cosines.
"""

from __future__ import annotations

import torch

from .base import PositionOptions, PositionScheme
from .registry import register


@register("sandwich")
class Sandwich(PositionScheme):
    static_bias = True
    relative_bias = True
    shift_invariant = True

    def __init__(self, n_head: int, d_model: int, options: PositionOptions | None = None):
        super().__init__(n_head, d_model, options)
        if self.head_dim % 2:
            raise ValueError(f"sandwich needs an even head dimension, got d_model/n_head = {self.head_dim}; "
                             f"change model.d_model or model.n_head")
        k = torch.arange(1, self.head_dim // 2 + 1, dtype=torch.float64)  # k = 1..Dh/2, as in NeMo
        self.register_buffer("inv_freq", 10000.0 ** (-2 * k / self.head_dim), persistent=False)  # (Dh/2,)
        head_scale = 8 * torch.arange(1, n_head + 1, dtype=torch.float64) / n_head  # (H,) 8h/H
        self.register_buffer("head_scale", head_scale, persistent=False)
        self.table = None  # (H, N) float32 bias of distances 0..N-1, built on use

    def _ensure(self, n: int) -> torch.Tensor:
        device = self.inv_freq.device
        if self.table is None or self.table.shape[1] < n or self.table.device != device:
            size = 256 if self.table is None else self.table.shape[1]
            while size < n:
                size *= 2
            d = torch.arange(size, dtype=torch.float64, device=device)[:, None]  # (N, 1)
            summed = (d * self.inv_freq).cos().sum(-1) - self.head_dim / 2  # (N,)
            self.table = (summed[None, :] / self.head_scale[:, None]).float()  # (H, N)
        return self.table

    def check_positions(self, end: int) -> None:
        self._ensure(end)  # every distance of this forward is < end (flex_score_mod indexes the table)

    def score_bias(self, q_pos, k_pos):
        distance = (q_pos[:, None] - k_pos[None, :]).clamp(min=0)  # (Tq, Tk); future keys are masked anyway
        table = self._ensure(int(distance.max()) + 1)  # a host sync, but the model caches this bias
        index = distance.reshape(1, -1).expand(table.shape[0], -1)  # (H, Tq * Tk)
        return table.gather(1, index).view(-1, *distance.shape)  # (H, Tq, Tk)

    def distance_bias(self, q_pos, distance):
        # the same float64 sum as the table's, over the distinct distances only (fractional ones included)
        values, inverse = torch.unique(distance.clamp(min=0).double(), return_inverse=True)  # (U,), (tq, tk)
        summed = (values[:, None] * self.inv_freq.to(values.device)).cos().sum(-1) - self.head_dim / 2  # (U,)
        table = (summed[None, :] / self.head_scale[:, None].to(values.device)).float()  # (H, U)
        return table[:, inverse]  # (H, tq, tk)

    def flex_score_mod(self, q_offset, k_offset):
        table = self.table  # (H, N), covering every distance since check_positions(end)
        offset = torch.tensor(int(q_offset) - int(k_offset), device=table.device)
        last = table.shape[1] - 1  # the clamp only guards the padding past the last query and key

        def sandwich_score_mod(score, b, h, q_idx, kv_idx):
            return score + table[h, (q_idx - kv_idx + offset).clamp(0, last)]

        return sandwich_score_mod
