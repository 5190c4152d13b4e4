"""Rotary position embedding (Su et al., 2021) on queries and keys: theta_i = base^(-2i/Dh).
Defined for any position: the cos/sin table grows geometrically as longer inputs arrive."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ConfigError
from .base import PositionOptions, PositionScheme
from .registry import register


@dataclass
class RopeOptions(PositionOptions):
    base: float = 10000.0  # theta_i = base^(-2i/Dh)

    def check(self, n_head: int, d_model: int, seq_len: int | None = None) -> None:
        if (d_model // n_head) % 2:  # dimensions are rotated in pairs
            raise ConfigError(f"rope needs an even head dimension, got d_model/n_head = {d_model // n_head}; "
                              f"change model.d_model or model.n_head")


@register("rope")
class RotaryEmbedding(PositionScheme):
    Options = RopeOptions

    def __init__(self, n_head: int, d_model: int, options: RopeOptions | None = None):
        super().__init__(n_head, d_model, options)
        self.base = float(self.options.base)
        inv_freq = self.base ** (-torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # (Dh/2,) float64
        self.cos_table = self.sin_table = None  # built on the first check_positions(), on inv_freq's device

    def _grow(self, n: int, device) -> None:
        angles = torch.arange(n, dtype=torch.float64, device=device)[:, None] * self.inv_freq.to(device)
        self.cos_table = angles.cos().float()  # (N, Dh/2); float64 angles keep long positions exact
        self.sin_table = angles.sin().float()  # (N, Dh/2)
        # the same values laid out for rotate(): [cos, cos] and [-sin, sin], (N, Dh) each
        self._cos_full = torch.cat((self.cos_table, self.cos_table), dim=-1)
        self._sin_signed = torch.cat((-self.sin_table, self.sin_table), dim=-1)

    def check_positions(self, end: int) -> None:
        size = 256 if self.cos_table is None else self.cos_table.shape[0]
        if self.cos_table is None or end > size or self.cos_table.device != self.inv_freq.device:
            while size < end:
                size *= 2
            self._grow(size, self.inv_freq.device)

    def rotate(self, x, pos):
        # x (..., T, Dh); rotate each pair (x_i, x_{i+Dh/2}) by pos * theta_i:
        # (x1 cos - x2 sin, x2 cos + x1 sin) = x * [cos, cos] + [x2, x1] * [-sin, sin], bit for bit
        # (a + (-b) is a - b exactly), in 4 kernels instead of 7
        cos = self._cos_full[pos].to(x.dtype)  # (T, Dh)
        sin = self._sin_signed[pos].to(x.dtype)  # (T, Dh)
        x1, x2 = x.chunk(2, dim=-1)  # (..., T, Dh/2) each
        return x * cos + torch.cat((x2, x1), dim=-1) * sin  # (..., T, Dh)
