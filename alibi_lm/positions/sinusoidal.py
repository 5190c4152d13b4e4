"""Fixed sinusoidal embeddings (Vaswani et al., 2017) added at the input; defined for any position."""

from __future__ import annotations

import torch

from .base import PositionScheme
from .registry import register


@register("sinusoidal")
class SinusoidalEmbedding(PositionScheme):
    def __init__(self, n_head: int, d_model: int, base: float = 10000.0):
        super().__init__(n_head, d_model)
        half = d_model // 2
        inv_freq = float(base) ** (-torch.arange(half, dtype=torch.float64) / max(half - 1, 1))
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # (D/2,), fairseq's spacing

    def embedding(self, pos):
        angles = pos.to(torch.float64)[:, None] * self.inv_freq  # (T, D/2)
        emb = torch.cat((angles.sin(), angles.cos()), dim=-1)  # (T, 2*(D/2)), fairseq layout
        if emb.shape[-1] < self.d_model:  # odd d_model: pad one zero column, as fairseq does
            emb = torch.nn.functional.pad(emb, (0, 1))
        return emb.float()  # (T, D)
