"""T5 relative position bias (Raffel et al., 2020): a learned per-head scalar for each bucket of
relative distance, shared by all layers. Causal bucketing with the defaults 32 / 128: distances
0..15 get buckets 0..15, 16..112 share the log-spaced buckets 16..30 (bucket 30 holds 99..112),
and every distance >= 113 falls into the last bucket, 31 (T5's rounding down puts the last
boundary at 113, not at max_distance).

The table starts at zero and is left out of weight decay (alibi_lm.optim): a bucket that training
never reaches (at L = 64, buckets 27..31) then adds exactly nothing at longer lengths, instead of
the random values an N(0, s) init would leave there."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import ConfigError
from .base import PositionOptions, PositionScheme
from .registry import register


def t5_relative_bucket(
    relative_position, bidirectional: bool = False, num_buckets: int = 32, max_distance: int = 128
) -> torch.LongTensor:
    """Bucket index of relative_position = key_pos - query_pos, with T5's semantics."""
    relative_position = torch.as_tensor(relative_position, dtype=torch.long)
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)  # keys in the future fall into bucket 0
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    # log-spaced buckets between max_exact and max_distance; distance 0 is never on this branch
    large = max_exact + (
        torch.log(distance.float().clamp(min=1) / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).long()
    large = large.clamp(max=num_buckets - 1)
    return buckets + torch.where(is_small, distance, large)


@dataclass
class T5Options(PositionOptions):
    num_buckets: int = 32
    max_distance: int = 128  # distances from here on share the last bucket

    def __post_init__(self):
        if self.num_buckets < 2 or self.max_distance <= self.num_buckets // 2:
            raise ConfigError(f"t5 needs position.num_buckets >= 2 and position.max_distance > num_buckets/2, "
                              f"got num_buckets={self.num_buckets}, max_distance={self.max_distance}")


@register("t5")
class T5RelativeBias(PositionScheme):
    Options = T5Options
    relative_bias = True
    shift_invariant = True

    def __init__(self, n_head: int, d_model: int, options: T5Options | None = None):
        super().__init__(n_head, d_model, options)
        self.num_buckets, self.max_distance = self.options.num_buckets, self.options.max_distance
        self.bias_table = nn.Embedding(self.num_buckets, n_head)  # (num_buckets, H), learned
        nn.init.zeros_(self.bias_table.weight)  # untrained buckets contribute nothing (module docstring)
        # Every distance >= max_distance lands in the last bucket, so a lookup table over
        # distances 0..max_distance answers any length without growing or syncing.
        lut = t5_relative_bucket(-torch.arange(self.max_distance + 1), False, self.num_buckets, self.max_distance)
        self.register_buffer("bucket_of_distance", lut, persistent=False)  # (max_distance + 1,)

    def bias_of_distance(self) -> torch.Tensor:
        """(H, max_distance + 1) learned bias of each clamped distance 0..max_distance."""
        return self.bias_table(self.bucket_of_distance).t().float()

    def score_bias(self, q_pos, k_pos):
        distance = (q_pos[:, None] - k_pos[None, :]).clamp(0, self.max_distance)  # (Tq, Tk)
        table = self.bias_of_distance()  # (H, D + 1)
        # one gather straight into (H, Tq, Tk): no (Tq, Tk, H) lookup to permute, and its backward
        # is a scatter-add into H x (D + 1) values
        index = distance.reshape(1, -1).expand(table.shape[0], -1)  # (H, Tq * Tk)
        return table.gather(1, index).view(-1, *distance.shape)  # (H, Tq, Tk)

    def distance_bias(self, q_pos, distance):
        # buckets are of whole distances: a fractional d' (leaky ReRoPE) takes the bucket of its floor
        whole = distance.floor().long().clamp(0, self.max_distance)  # (tq, tk)
        table = self.bias_of_distance()  # (H, D + 1)
        index = whole.reshape(1, -1).expand(table.shape[0], -1)  # (H, tq * tk)
        return table.gather(1, index).view(-1, *whole.shape)  # (H, tq, tk)

    def flex_score_mod(self, q_offset, k_offset):
        table = self.bias_of_distance()  # (H, D + 1), differentiable: FlexAttention's backward reaches it
        offset = torch.tensor(int(q_offset) - int(k_offset), device=table.device)
        max_distance = self.max_distance

        def t5_score_mod(score, b, h, q_idx, kv_idx):
            distance = (q_idx - kv_idx + offset).clamp(0, max_distance)
            return score + table[h, distance]

        return t5_score_mod
