"""xPos (Sun et al., 2023, "A Length-Extrapolatable Transformer"): RoPE whose pair k is also scaled,
by zeta_k^(i/gamma) on the query at i and zeta_k^(-j/gamma) on the key at j, so that the score carries
zeta_k^((i - j)/gamma) with zeta_k = (2k + 0.4 Dh) / (1.4 Dh) < 1: far keys fade, like a learned-free
exponential decay per frequency. gamma = 512 (torchscale's scale_base). Relative, no parameters.

The scales are folded into the (2, N, Dh) cos/sin tables, one set for queries and one for keys, so
rotate() costs what RoPE's does; keys are cached already scaled, which keeps KV-cache decoding exact.
Positions are not re-centred per forward (torchscale centres them), since a cache must keep its
keys' scale: the key scale zeta_0^(-j/gamma) = 3.5^(j/gamma) then bounds the usable positions to
gamma * ln(1e30) / ln(3.5), about 28k at gamma = 512, past which float32 / bfloat16 would overflow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import ConfigError
from .base import PositionRangeError, PositionScheme
from .registry import register
from .rope import RopeOptions, RotaryEmbedding

MAX_KEY_SCALE = 1e30  # keys times this stay far from float32's 3.4e38


@dataclass
class XPosOptions(RopeOptions):
    gamma: float = 512.0  # the scale's length unit: q gets zeta^(i/gamma), k zeta^(-j/gamma)

    def __post_init__(self):
        super().__post_init__()
        if not self.gamma > 0:
            raise ConfigError(f"xpos needs position.gamma > 0, got {self.gamma}; the paper's value is position.gamma=512")


@register("xpos")
class XPos(RotaryEmbedding):
    Options = XPosOptions

    def __init__(self, n_head: int, d_model: int, options: XPosOptions | None = None):
        super().__init__(n_head, d_model, options)
        self.gamma = float(self.options.gamma)
        k = torch.arange(0, self.head_dim, 2, dtype=torch.float64)  # 2k, pair by pair as inv_freq
        zeta = (k + 0.4 * self.head_dim) / (1.4 * self.head_dim)  # (Dh/2,)
        self.register_buffer("zeta", zeta, persistent=False)
        zeta_0 = 0.4 * self.head_dim / (1.4 * self.head_dim)  # zeta[0] in Python: no tensor read (a meta-device build)
        self.max_positions = int(self.gamma * math.log(MAX_KEY_SCALE) / -math.log(zeta_0))

    # rope's evaluation-time extensions are defined for plain RoPE only
    set_scaling = PositionScheme.set_scaling

    def check_positions(self, end: int) -> None:
        if end > self.max_positions:
            raise PositionRangeError(
                f"position {end - 1} is beyond xpos's range at position.gamma={self.gamma:g}: the key scale "
                f"zeta^(-j/gamma) would leave float32's range past position {self.max_positions - 1}; "
                f"evaluate shorter, or train with a larger position.gamma"
            )
        super().check_positions(end)

    def _set_tables(self, cos_full, sin_signed) -> None:
        # (N, Dh) float64 each -> (2, N, Dh) float32: row 0 for queries (times zeta^(i/gamma)), row 1 for
        # keys (times zeta^(-j/gamma)); pair k sits at columns k and k + Dh/2, as in rope
        power = torch.arange(cos_full.shape[0], dtype=torch.float64, device=cos_full.device)[:, None] / self.gamma
        scale = self.zeta.to(cos_full.device).repeat(2) ** power  # (N, Dh)
        self._cos_full = torch.stack((cos_full * scale, cos_full / scale)).float()
        self._sin_signed = torch.stack((sin_signed * scale, sin_signed / scale)).float()

    def rotation64(self, pos, role):
        cos, sin = super().rotation64(pos, role)  # (T, Dh) float64 each
        power = pos.to(torch.float64)[:, None] / self.gamma  # as _set_tables: q times zeta^(i/gamma), k divided
        scale = self.zeta.to(pos.device).repeat(2) ** power  # (T, Dh)
        return (cos * scale, sin * scale) if role == 0 else (cos / scale, sin / scale)

    def rotate(self, x, pos):
        # x (2, ..., T, Dh): queries at x[0], keys at x[1] (the model passes them stacked)
        shape = (2,) + (1,) * (x.dim() - 3) + (len(pos), x.shape[-1])
        cos = self._cos_full[:, pos].to(x.dtype).view(shape)  # (2, 1.., T, Dh)
        sin = self._sin_signed[:, pos].to(x.dtype).view(shape)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((x2, x1), dim=-1) * sin  # (2, ..., T, Dh)
