"""A trainable table of max_len absolute position vectors added at the input (GPT-2 style).
Positions past the table raise an error naming the fix; never a silent clamp or wrap."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ..errors import ConfigError
from .base import PositionOptions, PositionScheme
from .registry import register


@dataclass
class LearnedOptions(PositionOptions):
    max_len: int = 1024  # rows of the table (configs/position/learned.yaml: train.seq_len)

    def __post_init__(self):
        if self.max_len < 1:
            raise ConfigError(f"learned needs position.max_len >= 1, got {self.max_len}")

    def check(self, n_head: int, d_model: int, seq_len: int | None = None) -> None:
        if seq_len is not None and self.max_len < seq_len:
            raise ConfigError(f"position.max_len={self.max_len} rows are fewer than the {seq_len} positions training "
                              f"gives; set position.max_len>={seq_len}")


@register("learned")
class LearnedEmbedding(PositionScheme):
    Options = LearnedOptions

    def __init__(self, n_head: int, d_model: int, options: LearnedOptions | None = None):
        super().__init__(n_head, d_model, options)
        self.max_positions = int(self.options.max_len)
        self.table = nn.Embedding(self.max_positions, d_model)  # (max_len, D)
        nn.init.normal_(self.table.weight, 0.0, d_model**-0.5)  # fairseq's LearnedPositionalEmbedding init

    def embedding(self, pos):
        return self.table(pos)  # (T, D)
