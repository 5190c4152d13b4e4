"""Fixed sinusoidal embeddings (Vaswani et al., 2017) added at the input; defined for any position."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import check_range
from .base import PositionOptions, PositionScheme
from .registry import register


@dataclass
class SinusoidalOptions(PositionOptions):
    base: float = 10000.0  # wavelengths from 2*pi to base*2*pi

    def __post_init__(self):
        check_range("position.base", self.base, low=1, low_open=True)  # growing wavelengths


@register("sinusoidal")
class SinusoidalEmbedding(PositionScheme):
    Options = SinusoidalOptions

    def __init__(self, n_head: int, d_model: int, options: SinusoidalOptions | None = None):
        super().__init__(n_head, d_model, options)
        half = d_model // 2
        inv_freq = float(self.options.base) ** (-torch.arange(half, dtype=torch.float64) / max(half - 1, 1))
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # (D/2,), fairseq's spacing

    def embedding(self, pos):
        angles = pos.to(torch.float64)[:, None] * self.inv_freq  # (T, D/2)
        emb = torch.cat((angles.sin(), angles.cos()), dim=-1)  # (T, 2*(D/2)), fairseq layout
        if emb.shape[-1] < self.d_model:  # odd d_model: pad one zero column, as fairseq does
            emb = torch.nn.functional.pad(emb, (0, 1))
        return emb.float()  # (T, D)
