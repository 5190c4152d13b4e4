"""ReRoPE and Leaky ReRoPE (Su, 2023; bojone/rerope): distances past a window w capped, or compressed by k:

    rerope        d' = min(d, w)
    leaky_rerope  d' = d for d < w, else w + (d - w) / k

Two rotary passes merged by d < w, as the reference's rerope_patch.py / leaky_rerope_patch.py (whose second pass
rotates the query at i / k + w - w / k and the key at j / k: fractional positions, which a bias scheme takes as
fractional distances; T5 takes the bucket of its floor). Defaults from the reference scaled to L: window 512 at
training_length 4096, so w = L / 8; leaky's scaling_factor k = 16. The reference's optional log-n query scaling is
not applied.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import ExtensionMethod, ExtensionOptions, affine, positive


@dataclass
class ReRoPEOptions(ExtensionOptions):
    window: int | None = None  # w; null: L / 8

    def __post_init__(self):
        positive("window", self.window)

    def resolve(self, train_len):
        return ReRoPEOptions(self.window or max(1, train_len // 8))


@dataclass
class LeakyReRoPEOptions(ExtensionOptions):
    window: int | None = None  # w; null: L / 8
    factor: float = 16.0  # k: distances past w grow 1/k as fast

    def __post_init__(self):
        positive("window", self.window)
        positive("factor", self.factor)

    def resolve(self, train_len):
        return LeakyReRoPEOptions(self.window or max(1, train_len // 8), self.factor)


class ReRoPE(ExtensionMethod):
    name = "rerope"
    Options = ReRoPEOptions

    def remap(self, q_pos, k_pos):
        w = self.options.window
        d = q_pos[:, None] - k_pos[None, :]  # (tq, tk)
        return affine([q_pos, torch.full_like(q_pos, w)], [k_pos, torch.zeros_like(k_pos)], (d >= w).long(), None)


class LeakyReRoPE(ExtensionMethod):
    name = "leaky_rerope"
    Options = LeakyReRoPEOptions

    def remap(self, q_pos, k_pos):
        w, k = self.options.window, float(self.options.factor)
        d = q_pos[:, None] - k_pos[None, :]  # (tq, tk)
        q_far = q_pos.to(torch.float64) / k + w - w / k  # (tq,)
        return affine([q_pos, q_far], [k_pos, k_pos.to(torch.float64) / k], (d >= w).long(), None)
