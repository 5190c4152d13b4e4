"""KERPLE (Chi et al., NeurIPS 2022): learned, conditionally positive definite kernels of the distance
d = i - j as score biases, one pair of parameters per head, shared by all layers.

    kerple_log     -r1_h * log(1 + r2_h * d)      r1 ~ U(0, 2), r2 ~ U(0, 1) at init
    kerple_power   -a_h * d^p_h                   a ~ U(0, 1), p ~ U(0, 2) at init, 0 < p <= 2

As in the reference (chijames/KERPLE ParallelKerpleLog / ParallelKerplePower), the stored parameters
are projected back into their domain (>= 0.01, and p <= 2) at every forward, before they are used:
projected gradient descent, so a parameter that the optimizer pushed to the bound is used at the
bound and can leave it again. Future keys (d < 0) are masked by the model; here they count as d = 0.
"""

from __future__ import annotations

import torch
from torch import nn

from .base import PositionOptions, PositionScheme
from .registry import register

EPS = 1e-2  # the reference's lower bound of every parameter


class KerpleBias(PositionScheme):
    relative_bias = True
    shift_invariant = True
    bounds: dict[str, tuple[float, float | None]] = {}  # parameter name -> (min, max) of its domain

    def parameters_in_domain(self) -> list[torch.Tensor]:
        """The kernel's (H,) parameters, each projected onto its domain in place first (module docstring).

        Only values outside the domain change, which only an optimizer step between two forwards can
        cause, so no autograd graph still holds the old values (.data keeps the version counter)."""
        out = []
        for name, (low, high) in self.bounds.items():
            p = getattr(self, name)
            p.data.clamp_(min=low, max=high)
            out.append(p)
        return out

    def kernel(self, distance: torch.Tensor, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        """The bias at float distances >= 0 (any shape) for parameters broadcast against them."""
        raise NotImplementedError

    def score_bias(self, q_pos, k_pos):
        distance = (q_pos[:, None] - k_pos[None, :]).clamp(min=0).to(torch.float32)  # (Tq, Tk), i - j
        first, second = (p[:, None, None] for p in self.parameters_in_domain())  # (H, 1, 1) each
        return self.kernel(distance, first, second)  # (H, Tq, Tk)

    def distance_bias(self, q_pos, distance):
        first, second = (p[:, None, None] for p in self.parameters_in_domain())  # (H, 1, 1) each
        return self.kernel(distance.clamp(min=0).to(torch.float32), first, second)  # (H, tq, tk)

    def flex_score_mod(self, q_offset, k_offset):
        first, second = self.parameters_in_domain()  # (H,) each, differentiable
        offset = torch.tensor(int(q_offset) - int(k_offset), device=first.device)  # a tensor: no recompile
        kernel = self.kernel

        def kerple_score_mod(score, b, h, q_idx, kv_idx):
            distance = (q_idx - kv_idx + offset).clamp(min=0).to(torch.float32)
            return score + kernel(distance, first[h], second[h])

        return kerple_score_mod


@register("kerple_log")
class KerpleLog(KerpleBias):
    bounds = {"r1": (EPS, None), "r2": (EPS, None)}

    def __init__(self, n_head: int, d_model: int, options: PositionOptions | None = None):
        super().__init__(n_head, d_model, options)
        self.r1 = nn.Parameter(2 * torch.rand(n_head))  # (H,) the reference's bias_p
        self.r2 = nn.Parameter(torch.rand(n_head))  # (H,) the reference's bias_a

    def kernel(self, distance, r1, r2):
        return -r1 * torch.log1p(r2 * distance)


@register("kerple_power")
class KerplePower(KerpleBias):
    bounds = {"a": (EPS, None), "p": (EPS, 2.0)}

    def __init__(self, n_head: int, d_model: int, options: PositionOptions | None = None):
        super().__init__(n_head, d_model, options)
        self.a = nn.Parameter(torch.rand(n_head))  # (H,) the reference's bias_a
        self.p = nn.Parameter(2 * torch.rand(n_head))  # (H,) the reference's bias_p

    def kernel(self, distance, a, p):
        # d^p with d = 0 sent through 1^p: the same value 0, but a finite gradient for p there
        # (d^p log d would be 0 * -inf); needed by FlexAttention's backward too
        positive = distance > 0
        return -a * torch.where(positive, torch.where(positive, distance, 1.0) ** p, 0.0)
