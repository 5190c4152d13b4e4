"""Self-Extend (Jin et al., ICML 2024, arXiv 2401.01325; datamllab/LongLM): neighbour attention within a window W,
grouped attention beyond it:

    d' = d                                             for d < W
    d' = floor(i / G) - floor(j / G) + W - floor(W / G)  for d >= W

(the reference's prefill uses W / G as a float, its decode step the integer W // G; this is the integer form.) Two
rotary passes, merged by d < W, as the reference's torch.where. Defaults: W = L / 4 (the README's 1024 at 4096)
and, when `group` is null, the smallest G that keeps every d' of the evaluation length Lv below L (the paper's
rule (L - W) G + W >= Lv, made exact), so that each length gets the grouping it needs; G = 1 is the identity.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ConfigError
from .base import ExtensionMethod, ExtensionOptions, affine, positive


@dataclass
class SelfExtendOptions(ExtensionOptions):
    group: int | None = None  # G; null: the smallest that keeps every distance of Lv below L
    window: int | None = None  # W, the neighbour window; null: L / 4

    def __post_init__(self):
        positive("group", self.group)
        positive("window", self.window)

    def resolve(self, train_len):
        return SelfExtendOptions(self.group, self.window or max(1, train_len // 4))


def largest_distance(eval_len: int, group: int, window: int) -> int:
    """The largest d' at evaluation length eval_len (query eval_len - 1, key 0)."""
    i = eval_len - 1
    return i if i < window else i // group + window - window // group


def fitting_group(eval_len: int, train_len: int, window: int) -> int:
    """The smallest G whose largest d' at eval_len is below train_len (G grows until it is)."""
    if window >= train_len:
        return 1  # no grouping can help: the neighbour window alone reaches L
    group = 1
    while largest_distance(eval_len, group, window) >= train_len:
        group += 1
    return group


class SelfExtend(ExtensionMethod):
    name = "self_extend"
    Options = SelfExtendOptions

    def __init__(self, options, train_len):
        super().__init__(options, train_len)
        self.group = self.options.group or 1
        if self.options.group is None and self.options.window >= self.train_len:  # fitting_group: 1, the identity
            raise ConfigError(f"extension.window={self.options.window} is not below L={self.train_len}: with "
                              f"extension.group=null Self-Extend then groups no distance, and its rows would be the "
                              f"plain model's; choose extension.window < {self.train_len}, or set extension.group")

    def at_length(self, eval_len):
        if self.options.group is None:
            self.group = fitting_group(eval_len, self.train_len, self.options.window)

    def remap(self, q_pos, k_pos):
        G, W = self.group, self.options.window
        d = q_pos[:, None] - k_pos[None, :]  # (tq, tk)
        grouped_q = torch.div(q_pos, G, rounding_mode="floor") + W - W // G  # (tq,)
        return affine([q_pos, grouped_q], [k_pos, torch.div(k_pos, G, rounding_mode="floor")], (d >= W).long(), None)
