"""A position scheme that lives in the tests, to prove that adding one takes one module and one YAML
(configs/position/example.yaml, here on the test config search path): conftest.py imports this module,
so the generic tests (causality, KV cache, shifts, long inputs, blocking, config composition) run it,
and tests/app.py does too, so the command line trains and evaluates it.

The bias is -scale * softplus(w_h) * log(1 + i - j): relative, learned per head, and not ALiBi's."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from alibi_lm.errors import ConfigError
from alibi_lm.positions.base import PositionOptions, PositionScheme
from alibi_lm.positions.registry import register


@dataclass
class ExampleOptions(PositionOptions):
    scale: float = 1.0

    def __post_init__(self):
        if not self.scale > 0:
            raise ConfigError(f"position.scale must be > 0, got {self.scale}")


@register("example")
class LogDistanceBias(PositionScheme):
    Options = ExampleOptions
    relative_bias = True
    shift_invariant = True

    def __init__(self, n_head: int, d_model: int, options: ExampleOptions | None = None):
        super().__init__(n_head, d_model, options)
        self.weight = torch.nn.Parameter(torch.linspace(-1.0, 1.0, n_head))  # (H,)

    def score_bias(self, q_pos, k_pos):
        distance = (q_pos[:, None] - k_pos[None, :]).clamp(min=0).float()  # (Tq, Tk); future keys are masked
        slopes = self.options.scale * F.softplus(self.weight)  # (H,)
        return -slopes[:, None, None] * torch.log1p(distance)[None]  # (H, Tq, Tk)

    def flex_score_mod(self, q_offset, k_offset):
        slopes = self.options.scale * F.softplus(self.weight)  # (H,), differentiable through FlexAttention
        offset = int(q_offset) - int(k_offset)

        def log_distance(score, b, h, q_idx, kv_idx):
            distance = (q_idx - kv_idx + offset).clamp(min=0).to(torch.float32)
            return score - slopes[h] * torch.log1p(distance)

        return log_distance


@register("example_sdpa")
class HalvedLogDistanceBias(PositionScheme):
    """The README's minimal score-bias scheme: no options, no flex_score_mod (so the model runs it through
    SDPA everywhere), a fixed bias -log(1 + i - j) / 2 for every head."""

    relative_bias = True
    shift_invariant = True
    static_bias = True

    def score_bias(self, q_pos, k_pos):
        distance = (q_pos[:, None] - k_pos[None, :]).clamp(min=0).float()  # (Tq, Tk); future keys are masked
        return (-0.5 * torch.log1p(distance))[None].expand(self.n_head, -1, -1)  # (H, Tq, Tk)
