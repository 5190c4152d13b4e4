"""A trainable table of max_len absolute position vectors added at the input (GPT-2 style).
Positions past the table raise an error naming the fix; never a silent clamp or wrap."""

from __future__ import annotations

from torch import nn

from .base import PositionScheme
from .registry import register


@register("learned")
class LearnedEmbedding(PositionScheme):
    def __init__(self, n_head: int, d_model: int, max_len: int = 1024):
        super().__init__(n_head, d_model)
        if max_len < 1:
            raise ValueError(f"learned needs position.max_len >= 1, got {max_len}")
        self.max_positions = int(max_len)
        self.table = nn.Embedding(self.max_positions, d_model)  # (max_len, D)
        nn.init.normal_(self.table.weight, 0.0, d_model**-0.5)  # fairseq's LearnedPositionalEmbedding init

    def embedding(self, pos):
        return self.table(pos)  # (T, D)
