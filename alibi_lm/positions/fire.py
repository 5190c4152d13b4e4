"""FIRE (Li et al., ICLR 2024, arXiv 2310.04418, "Functional Interpolation for Relative Positions
Improves Long Context Transformers"): a learned function of the normalised distance as score bias,

    bias_h(i, j) = f_h( psi(i - j) / psi(max(i, L_thr)) ),   psi(x) = log(c x + 1)

f an MLP 1 -> mlp_width -> H with a ReLU, shared by all layers; c (init 0.1), L_thr = |m * init_threshold|
(a learned multiplier m, init 1, of init_threshold) and the MLP are learned; 1e-6 is added to the
denominator, as in the reference (mcleish7/arithmetic, cramming/architectures/embeddings.py), whose
init_threshold is 512 for the paper's training length of 2048. The config (configs/position/fire.yaml) starts it
at the same quarter of L, so that training reaches the threshold and the MLP sees the normalised distances of
the progressive interpolation before evaluation needs them; the learned L_thr and c are logged.

Not relative: the normaliser depends on the query position i once i > L_thr (the "progressive
interpolation" that maps any length into [0, 1]). Below L_thr it is a relative bias, and FIRE says so per
forward (relative_below): while every query is at or below L_thr (training at L <= 512) the model builds
one bias for all layers and query blocks, and FIRE evaluates the MLP once per distance. Past L_thr the
bias is built per query block, and the MLP is evaluated exactly as the piecewise-linear function it is
(a one-input ReLU MLP is linear between its units' breakpoints -b_in/w_in): a search over at most
mlp_width breakpoints and one multiply-add per (head, i, j) instead of a mlp_width-wide hidden layer.
The MLP keeps torch's default Linear init; the model's init does not touch it and weight decay never
applies to it.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import ConfigError
from .base import PositionOptions, PositionScheme
from .registry import register

EPS = 1e-6
# The normalised distance lies in [0, 1]; breakpoints outside this range (or of a unit with w_in = 0) are
# clamped into it so every unit's activity is constant on the segments the data can reach.
X_RANGE = (-1.0, 2.0)


@dataclass
class FireOptions(PositionOptions):
    mlp_width: int = 32  # the MLP 1 -> mlp_width -> heads
    init_c: float = 0.1  # psi(x) = log(c x + 1), c learned from here
    # L_thr = |m * init_threshold|, m learned from 1. The paper trained at 2048 with 512, a quarter of L:
    # configs/position/fire.yaml keeps that ratio (train.seq_len / 4); 512 is the reference code's constant
    init_threshold: float = 512.0

    def __post_init__(self):
        for key, paper in (("mlp_width", 32), ("init_c", 0.1), ("init_threshold", 512)):
            if not getattr(self, key) > 0:
                raise ConfigError(f"fire needs position.{key} > 0, got {getattr(self, key)}; the paper's value is "
                                  f"position.{key}={paper}")


@register("fire")
class FIRE(PositionScheme):
    Options = FireOptions
    # On an H200 (torch 2.11) the backward of fire_score_mod did not compile: "multiple indexing operations on the
    # same tensor that requires gradients" (w_out[h, w] for every unit w). It needs none: a training forward reads a
    # learnable bias from score_bias's (H, T, T) tensor (attention.learnable_score_bias); evaluation runs the score_mod.

    def __init__(self, n_head: int, d_model: int, options: FireOptions | None = None):
        super().__init__(n_head, d_model, options)
        mlp_width, init_c, init_threshold = self.options.mlp_width, self.options.init_c, self.options.init_threshold
        self.mlp = nn.Sequential(OrderedDict(
            fc_in=nn.Linear(1, int(mlp_width)),
            act=nn.ReLU(),
            fc_out=nn.Linear(int(mlp_width), n_head),
        ))  # fmt: skip
        self.c = nn.Parameter(torch.tensor(float(init_c)))
        self.threshold_multiplier = nn.Parameter(torch.tensor(1.0))
        self.register_buffer("init_threshold", torch.tensor(float(init_threshold)))

    def threshold(self) -> torch.Tensor:
        return (self.threshold_multiplier * self.init_threshold).abs()  # L_thr

    def normalised_distance(self, q_pos, k_pos) -> torch.Tensor:
        """(Tq, Tk) psi(i - j) / psi(max(i, L_thr)), in [0, 1] for j <= i (future keys count as j = i)."""
        distance = (q_pos[:, None] - k_pos[None, :]).clamp(min=0).to(torch.float32)  # (Tq, Tk)
        c = self.c.abs()  # the reference's log(|c x| + 1), x >= 0
        normaliser = torch.log1p(c * torch.maximum(q_pos.to(torch.float32), self.threshold())) + EPS  # (Tq,)
        return torch.log1p(c * distance) / normaliser[:, None]

    def learned_values(self) -> dict[str, float]:
        return {"fire_threshold": self.threshold().item(), "fire_c": self.c.abs().item()}

    def relative_below(self) -> float:
        return math.floor(self.threshold().item()) + 1  # integer queries i <= L_thr share psi(L_thr)

    def score_bias(self, q_pos, k_pos):
        if q_pos.numel() and q_pos.max().item() <= self.threshold().item():
            return self._bias_below_threshold(q_pos, k_pos)
        return self.bias_of_normalised(self.normalised_distance(q_pos, k_pos))

    def distance_bias(self, q_pos, distance):
        # the normaliser keeps the query's true position i: only the distance is remapped
        c = self.c.abs()
        normaliser = torch.log1p(c * torch.maximum(q_pos.to(torch.float32), self.threshold())) + EPS  # (tq,)
        return self.bias_of_normalised(torch.log1p(c * distance.clamp(min=0).to(torch.float32)) / normaliser[:, None])

    def bias_of_normalised(self, x: torch.Tensor) -> torch.Tensor:
        """(H, Tq, Tk) f_h(x) of normalised distances x (Tq, Tk), as the piecewise-linear function the MLP is."""
        slope, intercept, breakpoints = self.linear_pieces()  # (H, W + 1), (H, W + 1), (W,)
        piece = torch.searchsorted(breakpoints, x.reshape(-1))[None].expand(slope.shape[0], -1)  # (H, Tq * Tk)
        bias = slope.gather(1, piece) * x.reshape(1, -1) + intercept.gather(1, piece)  # (H, Tq * Tk)
        return bias.view(-1, *x.shape)  # (H, Tq, Tk)

    def linear_pieces(self):
        """The MLP as a piecewise-linear function of x: sorted breakpoints (W,) and, on each of the W + 1
        pieces between them, f_h(x) = slope[h, p] * x + intercept[h, p]. Which units are active on a piece
        is read at a point inside it; slopes and intercepts stay differentiable in the MLP's weights."""
        w_in, b_in = self.mlp.fc_in.weight[:, 0], self.mlp.fc_in.bias  # (W,), (W,)
        w_out, b_out = self.mlp.fc_out.weight, self.mlp.fc_out.bias  # (H, W), (H,)
        lo, hi = X_RANGE
        with torch.no_grad():
            breakpoints = torch.nan_to_num(-b_in / w_in, nan=hi, posinf=hi, neginf=lo).clamp(lo, hi).sort().values
            edges = torch.cat([breakpoints.new_tensor([lo - 1]), breakpoints, breakpoints.new_tensor([hi + 1])])
            inside = (edges[:-1] + edges[1:]) / 2  # (W + 1,) a point inside each piece
            active = (inside[:, None] * w_in + b_in > 0).to(w_out.dtype)  # (W + 1, W) unit w active on piece p
        slope = (w_out * w_in) @ active.t()  # (H, W + 1)
        intercept = (w_out * b_in) @ active.t() + b_out[:, None]  # (H, W + 1)
        return slope, intercept, breakpoints

    def _bias_below_threshold(self, q_pos, k_pos):
        """Every query at or below L_thr: the normaliser is psi(L_thr) for all of them, so the bias is a
        function of i - j alone. The MLP then runs once per distance instead of once per (i, j) pair
        (at L = 512 that is 512 inputs, not 262k pairs: FIRE's training cost drops to a relative bias's)."""
        distance = (q_pos[:, None] - k_pos[None, :]).clamp(min=0)  # (Tq, Tk), future keys as distance 0
        d = torch.arange(int(distance.max().item()) + 1, device=q_pos.device, dtype=torch.float32)  # (n_d,)
        c = self.c.abs()
        x = torch.log1p(c * d) / (torch.log1p(c * self.threshold()) + EPS)  # (n_d,)
        table = self.mlp(x[:, None]).t()  # (H, n_d)
        # one gather straight into (H, Tq, Tk); its backward is a scatter-add into H x n_d values
        index = distance.reshape(1, -1).expand(table.shape[0], -1)  # (H, Tq * Tk)
        return table.gather(1, index).view(-1, *distance.shape)  # (H, Tq, Tk)

    def flex_score_mod(self, q_offset, k_offset):
        fc_in, fc_out = self.mlp.fc_in, self.mlp.fc_out
        w_in, b_in = fc_in.weight[:, 0], fc_in.bias  # (W,), (W,)
        w_out, b_out = fc_out.weight, fc_out.bias  # (H, W), (H,)
        c = self.c.abs()
        threshold = self.threshold()
        q_start = torch.tensor(int(q_offset), device=c.device)  # tensors: a new offset does not recompile
        offset = torch.tensor(int(q_offset) - int(k_offset), device=c.device)
        width = w_in.shape[0]

        def fire_score_mod(score, b, h, q_idx, kv_idx):
            distance = (q_idx - kv_idx + offset).clamp(min=0).to(torch.float32)
            i = (q_idx + q_start).to(torch.float32)
            x = torch.log1p(c * distance) / (torch.log1p(c * torch.maximum(i, threshold)) + EPS)
            bias = b_out[h]
            for w in range(width):  # the MLP, unrolled over its width when the kernel is traced
                bias = bias + w_out[h, w] * torch.relu(x * w_in[w] + b_in[w])
            return score + bias

        return fire_score_mod
