"""FoX, the Forgetting Transformer (Lin et al., ICLR 2025, arXiv 2503.02130, "Forgetting Transformer: Softmax
Attention with a Forget Gate"): a data-dependent decay of attention, per head, from the layer's input.

    f_t = sigmoid(w_h . x_t + b_h)                    x_t: the layer's normalised input (what feeds q, k, v)
    c_t = sum_{s <= t} log f_s                        (B, H, T), a running sum
    bias_ij = sum_{t=j+1..i} log f_t = c_i - c_j      <= 0, added to q_i . k_j / sqrt(Dh)

w (n_layer, H, D) and b (n_layer, H) are learned per layer. On the explicit path the bias is built per query block
from c (never a (T, T) tensor held beyond the block); where FlexAttention runs (CUDA, no attention dropout), its
score_mod reads c_i and c_j from the (B, H, T) sums themselves (flex_state_score_mod): the bias costs a cumsum, no
(B, H, T, T) tensor at all. A KV cache keeps c of every cached key (KVCache.state), so a decode step continues the
running sum from the last one.

The authors' code (zhixuan-lin/forgetting-transformer, src/forgetting_transformer/model/forgetting_transformer/
modeling_forgetting_transformer.py, ForgettingAttentionLayer with fgate_type="full") computes the gate logit
with fgate_proj = nn.Linear(hidden_size, num_heads, bias=True) from the block's normalised hidden states,
casts it to float32 and takes logsigmoid; the decay bias is cumsum(log_fgate)[i] - cumsum(log_fgate)[j]
(the reference in ops/forgetting_attention.py), added after the sm_scale 1/sqrt(Dh). Their initialisation
(ForgettingTransformerPreTrainedModel._init_weights and the layer's own _initialize_weights, both on every
nn.Linear): weight N(0, initializer_range = 0.02), bias zero, so every gate starts near 1/2 (log f ~ -0.69
per token: strong forgetting at first). Followed by default; fgate_bias_init (decay-time initialisation) is only
for their data-independent gates. x-transformers' DataDependentAlibi (the same bias) initialises its bias to 5
instead (f ~ 0.993): position.gate_bias_init=5, a variant with rows of its own (fox+gate_bias_init5). With the
authors' start, a key 20 tokens back is down by ~e^-14 before training, and so is its gradient, which a small
model trained on retrieval may never climb out of.
Their cache keeps log_fgate of every token and sums it again; this keeps the sums.
Differences: the project never applies weight decay to a scheme's parameters (theirs decay the gate's weight).

Positions: none besides the gate (their main "FoX (LLaMA)" model and "FoX (Pro)" both set use_rope: false;
Pro adds QK-norm, output gate and norm and key/value shifts, none of which is a position scheme). Option
rope=true also rotates q and k with this project's RoPE (base 10000; their use_rope defaults to base 500000).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from .base import PositionOptions, PositionScheme, ScoreBlock
from .registry import register
from .rope import RotaryEmbedding

GATE_INIT_STD = 0.02  # the authors' initializer_range


@dataclass
class FoxOptions(PositionOptions):
    labeled = ("rope", "gate_bias_init")  # variants with rows of their own: PositionOptions.label
    rope: bool = False  # also rotate q and k with RoPE (positions.rope, its default base)
    gate_bias_init: float = 0.0  # b_h at the start: 0 as the authors (f ~ 1/2), 5 as x-transformers (f ~ 0.993)

    def check(self, n_head: int, d_model: int, seq_len: int | None = None) -> None:
        if self.rope and (d_model // n_head) % 2:
            raise ConfigError(f"fox with position.rope=true needs an even head dimension, got d_model/n_head = "
                              f"{d_model // n_head}; change model.d_model or model.n_head, or set position.rope=false")


def cumulative_log_forget(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, earlier: torch.Tensor | None):
    """c (B, H, Tk) float32: the running sum of log f over the earlier tokens' c (B, H, Tc) or None, then the new
    tokens of x (B, T, D), with one layer's gate weight (H, D) and bias (H,)."""
    log_forget = F.logsigmoid(F.linear(x, weight, bias).float()).transpose(1, 2)  # (B, H, T); no log(0)
    cumulative = log_forget.cumsum(-1)  # (B, H, T)
    if earlier is None:
        return cumulative
    return torch.cat([earlier, earlier[..., -1:] + cumulative], dim=-1)  # (B, H, Tc + T)


@register("fox")
class ForgetGate(PositionScheme):
    Options = FoxOptions
    content_aware = True
    per_layer = True
    shift_invariant = True  # the gate sees no position; RoPE, when on, is relative

    def __init__(self, n_head: int, d_model: int, options: FoxOptions | None = None, n_layer: int = 1):
        super().__init__(n_head, d_model, options, n_layer)
        self.gate_weight = nn.Parameter(torch.randn(n_layer, n_head, d_model) * GATE_INIT_STD)  # (n_layer, H, D)
        self.gate_bias = nn.Parameter(torch.full((n_layer, n_head), float(self.options.gate_bias_init)))  # (n_layer, H)
        self.rope = RotaryEmbedding(n_head, d_model) if self.options.rope else None

    def check_positions(self, end: int) -> None:
        if self.rope is not None:
            self.rope.check_positions(end)  # grows the rotation tables

    def rotate(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return x if self.rope is None else self.rope.rotate(x, pos)  # (2, B, H, T, Dh)

    def prepare(self, x: torch.Tensor, layer: int, earlier: torch.Tensor | None) -> torch.Tensor:
        return cumulative_log_forget(x, self.gate_weight[layer], self.gate_bias[layer], earlier)  # (B, H, Tk)

    def content_bias(self, block: ScoreBlock) -> torch.Tensor:
        c = block.state  # (B, H, Tk) over every key of the forward; the block sees the first tk
        n_keys = block.k.shape[2]
        return c[:, :, block.query_index, None] - c[:, :, None, :n_keys]  # (B, H, tq, tk): c_i - c_j

    def flex_state_score_mod(self, state, q_offset, k_offset):
        c_key = state  # (B, H, Tk): c_j of every key of the forward
        # c_i of the queries as a tensor of its own: FlexAttention's CUDA backward refuses two indexings of one tensor
        # that requires gradients (FIRE's score_mod met it); the copy is (B, H, Tq)
        c_query = state[..., int(q_offset) - int(k_offset) :].clone()  # (B, H, Tq)

        def fox_score_mod(score, b, h, q_idx, kv_idx):
            return score + (c_query[b, h, q_idx] - c_key[b, h, kv_idx])  # c_i - c_j, as content_bias adds it

        return fox_score_mod
