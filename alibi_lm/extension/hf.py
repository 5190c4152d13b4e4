"""The extension layer on Hugging Face models: the Llama family (RoPE, through transformers' attention interface)
and BLOOM (ALiBi, through its blocks' alibi argument). Each gets the same ExtensionMethod as a native run.

Llama: an attention function registered with transformers (install_llama) receives queries and keys already
rotated at their positions; it turns them back (a rotation is orthogonal: R(-p) R(p) = I) and scores each pair at
its piece's rotation, as extension.rotary does for a native RoPE run. BLOOM: a hook on every block replaces the
alibi tensor (slopes times key index, shared by all queries) with -slope * d' per query and key, and the causal mask
with one that also hides the keys the method hides. Both serve whole windows without a KV cache (the evaluation's
and the probes' calls); a forward with a cache is refused in one line.
"""

from __future__ import annotations

import math

import torch

from ..errors import ConfigError
from ..positions import PositionScheme
from .base import ExtensionMethod, check_scheme
from .rotary import remapped_scores

ATTENTION_NAME = "alibi_lm_extension"


class HFRotary:
    """A Llama rotary embedding seen as extension.rotary needs a rotary scheme: rotation_at(pos, role)."""

    def __init__(self, rotary_emb):
        self.inv_freq = rotary_emb.inv_freq.detach().float()  # (Dh/2,)
        self.scaling = float(getattr(rotary_emb, "attention_scaling", 1.0))

    def tables(self, pos: torch.Tensor):
        """(cos, sin) (T, Dh) as transformers' Llama computes them (float32 angles: the same rotation at integer
        positions as the model's own), laid out as extension.rotary takes them ([cos, cos], [-sin, sin])."""
        angles = pos.float()[:, None] * self.inv_freq.to(pos.device)  # (T, Dh/2)
        return torch.cat((angles.cos(),) * 2, -1), torch.cat((-angles.sin(), angles.sin()), -1)  # (T, Dh) each

    def rotation_at(self, pos, role):
        cos, sin = self.tables(pos)
        return cos * self.scaling, sin * self.scaling

    def unrotate(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """x (B, H, T, Dh) as the model rotated it at pos (T,) -> as it was before (the attention factor undone)."""
        cos, sin = (t.double() for t in self.tables(pos))
        x1, x2 = x.double().chunk(2, dim=-1)
        back = x.double() * cos - torch.cat((x2, x1), dim=-1) * sin  # R(-p): the sine's sign flipped
        return (back / self.scaling).to(x.dtype)


def no_cache(n_queries: int, n_keys: int) -> None:
    if n_queries != n_keys:
        raise ConfigError("an extension on a Hugging Face model scores whole windows; a forward with a KV cache "
                          "(generation) is not supported: drop extension")


def extended_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """transformers' attention-interface signature: query (B, H, T, Dh), key and value (B, H_kv, T, Dh), rotated."""
    method, rotary = module.alibi_lm_extension
    T = query.shape[2]
    no_cache(T, key.shape[2])
    pos = torch.arange(T, device=query.device)
    groups = query.shape[1] // key.shape[1]
    q = rotary.unrotate(query, pos)
    k = rotary.unrotate(key, pos).repeat_interleave(groups, dim=1)  # (B, H, T, Dh), as transformers' repeat_kv
    v = value.repeat_interleave(groups, dim=1)
    remap = method.remap(pos, pos)
    scores = remapped_scores(rotary, q, k, remap) * (scaling * math.sqrt(q.shape[-1]))  # (B, H, T, T)
    hidden = pos[None, :] > pos[:, None]
    if remap.visible is not None:
        hidden = hidden | ~remap.visible
    probs = scores.float().masked_fill(hidden, float("-inf")).softmax(-1).to(value.dtype)
    return (probs @ v).transpose(1, 2).contiguous(), probs  # (B, T, H, Dh)


def install_llama(model, method: ExtensionMethod | None) -> None:
    """Route every attention layer of a Llama-family model (RoPE) through extended_attention with `method`; None
    restores the model's own attention (sdpa)."""
    from transformers import AttentionInterface  # import cost: transformers only for Hugging Face models

    if method is None:
        model.set_attn_implementation("sdpa")
        return
    check_scheme(method, ROTARY_KIND, "rope (a Hugging Face Llama-family model)")
    AttentionInterface.register(ATTENTION_NAME, extended_attention)
    rotary = HFRotary(model.model.rotary_emb)
    for module in model.modules():
        if hasattr(module, "num_key_value_groups"):  # the attention layers
            module.alibi_lm_extension = (method, rotary)
    model.set_attn_implementation(ATTENTION_NAME)


def install_bloom(model, method: ExtensionMethod | None) -> None:
    """Give every block of a BLOOM model (ALiBi) the remapped bias and mask of `method`; None removes them."""
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes  # import cost, as above

    for handle in getattr(model, "alibi_lm_hooks", []):
        handle.remove()
    model.alibi_lm_hooks = []
    if method is None:
        return
    check_scheme(method, BIAS_KIND, "alibi (a Hugging Face BLOOM model)")
    slopes = _get_alibi_slopes(model.config.n_head, torch.device("cpu"))  # (H,) the official slopes, as ours

    def replace_bias(block, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        B, T = hidden.shape[:2]
        no_cache(T, kwargs["alibi"].shape[-1])
        pos = torch.arange(T, device=hidden.device)
        remap = method.remap(pos, pos)
        bias = -slopes.to(hidden.device)[:, None, None] * remap.distance().float()[None]  # (H, T, T)
        kwargs["alibi"] = bias.repeat(B, 1, 1).to(hidden.dtype)  # (B * H, T, T), as baddbmm takes it
        hide = pos[None, :] > pos[:, None]
        if remap.visible is not None:
            hide = hide | ~remap.visible
        mask = torch.zeros(T, T, device=hidden.device).masked_fill(hide, torch.finfo(hidden.dtype).min)
        kwargs["attention_mask"] = mask[None, None].to(hidden.dtype)  # (1, 1, T, T) additive
        return args, kwargs

    model.alibi_lm_hooks = [block.register_forward_pre_hook(replace_bias, with_kwargs=True)
                            for block in model.transformer.h]


class RotaryKind(PositionScheme):
    """What check_scheme sees of a Llama-family model's positions: rotary."""

    def rotation_at(self, pos, role):
        return None


class BiasKind(PositionScheme):
    """What check_scheme sees of a BLOOM model's positions: a bias of the distance (ALiBi)."""

    def distance_bias(self, q_pos, distance):
        return None


ROTARY_KIND, BIAS_KIND = RotaryKind, BiasKind
