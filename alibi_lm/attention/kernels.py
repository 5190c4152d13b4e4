"""One layer's attention (attend): SDPA query block by query block, FlexAttention where the context has its kernel, or
the explicit path (scores, content bias, mask, softmax: the diagnostic that returns the probabilities, a
content-aware scheme without a flex score_mod, a rotary scheme under an extension)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..extension import remapped_scores
from ..positions import ScoreBlock
from . import flex_kernel
from .context import AttentionContext


def scale_logits(x: torch.Tensor, logit_scale: torch.Tensor | None) -> torch.Tensor:
    """x (..., H, tq, tk) scores or a folded bias, times logit_scale (H, tq) per head and query; hidden keys stay
    -inf whatever the sign of the scale (and a scale of 0, at log 1, gives no 0 * inf)."""
    if logit_scale is None:
        return x
    hidden = torch.isneginf(x)
    # zero the hidden entries before the product: -inf * scale would send NaN into the scale's gradient
    scaled = x.masked_fill(hidden, 0.0) * logit_scale[..., None].to(x.dtype)  # (..., H, tq, tk)
    return scaled.masked_fill(hidden, float("-inf"))


def attend(q, k, v, ctx: AttentionContext, dropout: float, probs: list | None, layer: int = 0, state=None,
           logit_scale: torch.Tensor | None = None):
    """One layer's attention of queries q (B, H, Tq, Dh) at ctx.q_pos over keys and values k, v (B, H, Tk, Dh)
    at ctx.k_pos -> (B, H, Tq, Dh). `dropout` is on the probabilities (SDPA); a `probs` list takes them (B, H,
    Tq, Tk) from the explicit path, a diagnostic that holds the whole mask and scores. A content-aware scheme
    gets layer `layer`'s `state` (its prepare()'s) in its content_bias, on the explicit path. logit_scale (H, Tq)
    multiplies every logit of a query, the bias included (Scalable-Softmax: s_h log n); not with FlexAttention."""
    if probs is not None:
        p = explicit_scores(q, k, ctx, 0, len(ctx.q_pos), layer, state, logit_scale).softmax(-1)  # (B, H, Tq, Tk)
        probs.append(p.detach())
        return p.to(v.dtype) @ v  # (B, H, Tq, Dh)
    if ctx.flex is not None:
        if logit_scale is not None:
            raise ValueError("FlexAttention here takes no logit scale (model.ssmax): the model picks SDPA for it")
        # a content-aware scheme's score_mod is built from this layer's state (FoX: its (B, H, Tk) gate sums)
        score_mod = (ctx.scheme.flex_state_score_mod(state, ctx.q_start, ctx.k_start) if ctx.scheme.content_aware
                     else ctx.score_mod)
        if (out := flex_kernel.flex_or_none(q, k, v, ctx, score_mod)) is not None:
            return out
    if ctx.scheme.content_aware or ctx.rotary_remap:
        return attend_explicitly(q, k, v, ctx, dropout, layer, state, logit_scale)
    # One block of queries at a time (a single block unless Tq > model.attn_query_block), each against the
    # keys it can see: no (H, Tq, Tq) tensor of a long input exists, and the keys after a block's last
    # query are never computed.
    # The blocks run last first, as on the explicit path: where a block builds its own mask (a scaled or absolute
    # bias), its temporaries then fit in the memory the larger block before it freed
    blocks = []
    for q0, q1 in reversed(ctx.blocks):
        n_keys = ctx.q_start + q1 - ctx.k_start
        mask, causal = ctx.mask(q0, q1, q.dtype)
        q_block = q[:, :, q0:q1]  # (B, H, tq, Dh)
        if logit_scale is not None:  # q k^T and the bias both times the scale; the causal mask stays -inf
            q_block = q_block * logit_scale[:, q0:q1, None].to(q.dtype)
            mask = None if mask is None else scale_logits(mask, logit_scale[:, q0:q1] if mask.dim() == 4 else None)
        blocks.append(F.scaled_dot_product_attention(
            q_block, k[:, :, :n_keys], v[:, :, :n_keys], attn_mask=mask, is_causal=causal, dropout_p=dropout,
        ))  # fmt: skip
    return blocks[0] if len(blocks) == 1 else torch.cat(blocks[::-1], dim=2)  # (B, H, Tq, Dh)


def attend_explicitly(q, k, v, ctx: AttentionContext, dropout: float, layer: int, state, logit_scale=None):
    """attend() for a content-aware scheme (and a rotary one under an extension), one query block at a time: scores,
    content bias, mask, softmax, dropout, @ v, with no fused kernel. The blocks run last first: each block's
    (B, H, tq, tk) tensors are then no larger than the last one's, so the allocator reuses their memory (first to
    last, every block asks for more than was freed, and glibc's heap kept ~2.5x more at 16L than at 8L on CPU, make bench)."""
    blocks = []
    for q0, q1 in reversed(ctx.blocks):
        n_keys = ctx.q_start + q1 - ctx.k_start
        scale = None if logit_scale is None else logit_scale[:, q0:q1]  # (H, tq)
        p = explicit_scores(q, k, ctx, q0, q1, layer, state, scale).softmax(-1)  # (B, H, tq, tk)
        p = F.dropout(p, dropout) if dropout > 0 else p
        blocks.append(p.to(v.dtype) @ v[:, :, :n_keys])  # (B, H, tq, Dh)
    return blocks[0] if len(blocks) == 1 else torch.cat(blocks[::-1], dim=2)  # (B, H, Tq, Dh)


def explicit_scores(q, k, ctx: AttentionContext, q0: int, q1: int, layer: int, state, logit_scale=None):
    """(B, H, tq, tk) scores of queries q[:, :, q0:q1] against the keys they see: q k^T / sqrt(Dh), plus a
    content-aware scheme's content_bias, plus the scheme's score bias folded with the causal mask; all of it
    times logit_scale (H, tq) if given (Scalable-Softmax)."""
    return scale_logits(unscaled_scores(q, k, ctx, q0, q1, layer, state), logit_scale)


def unscaled_scores(q, k, ctx: AttentionContext, q0: int, q1: int, layer: int, state):
    n_keys = ctx.q_start + q1 - ctx.k_start
    q_block, keys = q[:, :, q0:q1], k[:, :, :n_keys]  # (B, H, tq, Dh), (B, H, tk, Dh)
    q_pos, k_pos = ctx.q_pos[q0:q1], ctx.k_pos[:n_keys]  # (tq,), (tk,)
    q_index, k_index = ctx.q_index[q0:q1], ctx.k_index[:n_keys]  # (tq,), (tk,)
    if ctx.rotary_remap:  # each pair at its piece's rotation (alibi_lm.extension.rotary)
        scores = remapped_scores(ctx.scheme, q_block, keys, ctx.remap(q_pos, k_pos))  # (B, H, tq, tk)
    else:
        scores = (q_block @ keys.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, H, tq, tk)
    if not ctx.scheme.content_aware:
        return scores + ctx.fold(q_pos, k_pos, scores.dtype, q_index, k_index)  # the bias, -inf on hidden keys
    future = k_pos[None, :] > q_pos[:, None]  # (tq, tk)
    if ctx.window is not None:
        future |= ctx.window.outside(q_index, k_index)
    block = ScoreBlock(q=q_block, k=keys, scores=scores, future=future, q_pos=q_pos, k_pos=k_pos,
                       query_index=slice(n_keys - (q1 - q0), n_keys), layer=layer, state=state)
    scores = scores + ctx.scheme.content_bias(block)  # float32 where the content bias is
    if ctx.has_bias:  # a positions bias besides the content's (DAPE's kind): folded with the causal mask
        return scores + ctx.fold(q_pos, k_pos, scores.dtype, q_index, k_index)
    return torch.where(future, float("-inf"), scores)
