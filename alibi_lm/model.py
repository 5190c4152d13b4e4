"""A pre-LayerNorm GPT-style decoder whose position scheme is a plug-in (alibi_lm.positions).

The model and its attention never look at a scheme's name: they call the scheme's embedding(),
rotate() and score_bias() with explicit absolute positions, and fold the causal mask into the one
bias tensor that scaled_dot_product_attention receives.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .positions import PositionScheme, build_position_scheme
from .vocab import AdaptiveVocabulary, TiedVocabulary


@dataclass
class LMConfig:
    vocab_size: int = 50304
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 256
    d_ff: int | None = None  # None: 4 * d_model
    dropout: float = 0.0
    bias: bool = True  # biases in Linear layers and LayerNorms
    position: str = "alibi"
    position_options: dict = field(default_factory=dict)  # passed to the scheme's constructor
    embed_scale: float | None = None  # None: sqrt(d_model), as fairseq does for every scheme
    adaptive_cutoffs: list[int] | None = None  # e.g. [20000, 60000]: adaptive input + tied softmax
    adaptive_factor: int = 4
    attn_query_block: int = 1024  # longer inputs attend in blocks of this many queries

    def __post_init__(self):
        for name in ("vocab_size", "n_layer", "n_head", "d_model", "attn_query_block"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"model.{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_head:
            raise ValueError(
                f"model.d_model={self.d_model} is not divisible by model.n_head={self.n_head}; "
                f"pick d_model a multiple of n_head"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.dropout must be in [0, 1), got {self.dropout}")


class KVCache:
    """Keys and values of every layer for absolute positions [start, end)."""

    def __init__(self, n_layer: int):
        self.keys: list[torch.Tensor | None] = [None] * n_layer  # each (B, H, Tk, Dh)
        self.values: list[torch.Tensor | None] = [None] * n_layer
        self.start: int | None = None
        self.end: int | None = None


class AttentionContext:
    """What attention needs to know about positions, built once per forward and shared by layers.

    Queries sit at absolute positions [q_start, q_start + Tq) and keys at [k_start, q_start + Tq).
    """

    def __init__(self, model: TransformerLM, q_start: int, k_start: int, end: int, device):
        self.scheme, self.model = model.position, model
        self.has_bias = type(self.scheme).score_bias is not PositionScheme.score_bias
        self.q_start, self.k_start, self.end = q_start, k_start, end
        self.q_pos = torch.arange(q_start, end, device=device)  # (Tq,)
        self.k_pos = torch.arange(k_start, end, device=device)  # (Tk,)
        self._memo: dict = {}

    def mask(self, q0: int, q1: int, n_keys: int, dtype, memo: bool):
        """(attn_mask, is_causal) for queries q_pos[q0:q1] against keys k_pos[:n_keys]."""
        qs, ks = self.q_start + q0, self.k_start
        square = qs == ks and q1 - q0 == n_keys
        if square and not self.has_bias:
            return None, True  # no bias and aligned causal square: SDPA's own causal kernel
        key = (qs, q1 - q0, ks, n_keys, self.q_pos.device, dtype)
        if key in self._memo:
            return self._memo[key], False
        static_cache = self.model._static_mask_cache if self.scheme.static_bias else None
        if static_cache is not None and key in static_cache:
            static_cache.move_to_end(key)
            return static_cache[key], False
        q_pos, k_pos = self.q_pos[q0:q1], self.k_pos[:n_keys]
        future = k_pos[None, :] > q_pos[:, None]  # (tq, tk)
        bias = self.scheme.score_bias(q_pos, k_pos)  # (H, tq, tk) or None
        if bias is None:
            folded = torch.zeros(future.shape, device=future.device, dtype=dtype)
            folded = folded.masked_fill(future, float("-inf"))  # (tq, tk)
        else:
            folded = bias.masked_fill(future[None], float("-inf")).to(dtype)  # (H, tq, tk)
        if memo:
            self._memo[key] = folded
        if static_cache is not None:
            static_cache[key] = folded
            while len(static_cache) > 4:  # a few lengths; bounded so long evals stay linear
                static_cache.popitem(last=False)
        return folded, False


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.d_model // cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.dropout = cfg.dropout
        self.query_block = cfg.attn_query_block

    def forward(self, x, ctx: AttentionContext, cache: KVCache | None, layer: int, probs: list | None):
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)  # (B, H, T, Dh)
        q = ctx.scheme.rotate(q, ctx.q_pos)  # new queries and keys share positions q_pos
        k = ctx.scheme.rotate(k, ctx.q_pos)
        if cache is not None:
            if cache.keys[layer] is not None:
                k = torch.cat([cache.keys[layer], k], dim=2)  # (B, H, Tk, Dh)
                v = torch.cat([cache.values[layer], v], dim=2)
            cache.keys[layer], cache.values[layer] = k, v
        dropout = self.dropout if self.training else 0.0
        if probs is not None:
            y = self._attend_with_probs(q, k, v, ctx, probs)
        elif T <= self.query_block:
            mask, causal = ctx.mask(0, T, k.shape[2], q.dtype, memo=True)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, dropout_p=dropout)
        else:
            # Long inputs: one block of queries at a time, each against the keys it can see, so no
            # (H, T, T) tensor of the full length exists and memory grows linearly with T.
            blocks = []
            for q0 in range(0, T, self.query_block):
                q1 = min(q0 + self.query_block, T)
                n_keys = ctx.q_start + q1 - ctx.k_start  # keys up to the block's last query
                # the first block of an uncached bias-free input is an aligned square: mask None, causal
                mask, causal = ctx.mask(q0, q1, n_keys, q.dtype, memo=False)
                blocks.append(
                    F.scaled_dot_product_attention(
                        q[:, :, q0:q1],
                        k[:, :, :n_keys],
                        v[:, :, :n_keys],
                        attn_mask=mask,
                        is_causal=causal,
                        dropout_p=dropout,
                    )
                )
            y = torch.cat(blocks, dim=2)  # (B, H, T, Dh)
        return self.out(y.transpose(1, 2).reshape(B, T, D))

    def _attend_with_probs(self, q, k, v, ctx, probs):
        mask, _ = ctx.mask(0, q.shape[2], k.shape[2], q.dtype, memo=True)
        if mask is None:  # the causal fast path: build the same mask explicitly
            mask = torch.zeros(q.shape[2], k.shape[2], dtype=q.dtype, device=q.device)
            mask = mask.masked_fill(ctx.k_pos[None, :] > ctx.q_pos[:, None], float("-inf"))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim) + mask  # (B, H, Tq, Tk)
        p = scores.softmax(-1)
        probs.append(p.detach())
        return p @ v  # (B, H, Tq, Dh)


class Block(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        d_ff = cfg.d_ff or 4 * cfg.d_model
        self.ln_attn = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_mlp = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, d_ff, bias=cfg.bias),
            nn.GELU(),
            nn.Linear(d_ff, cfg.d_model, bias=cfg.bias),
            nn.Dropout(cfg.dropout),
        )
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, ctx, cache, layer, probs):
        x = x + self.drop(self.attn(self.ln_attn(x), ctx, cache, layer, probs))  # (B, T, D)
        return x + self.mlp(self.ln_mlp(x))


class TransformerLM(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.cfg = cfg
        self.position = build_position_scheme(cfg.position, cfg.n_head, cfg.d_model, **dict(cfg.position_options))
        if cfg.adaptive_cutoffs:
            self.vocab = AdaptiveVocabulary(cfg.vocab_size, cfg.d_model, list(cfg.adaptive_cutoffs), cfg.adaptive_factor)
        else:
            self.vocab = TiedVocabulary(cfg.vocab_size, cfg.d_model)
        self.embed_scale = cfg.embed_scale if cfg.embed_scale is not None else math.sqrt(cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self._static_mask_cache: OrderedDict = OrderedDict()
        self._init_weights()

    def _init_weights(self):
        # nanoGPT/GPT-2: N(0, 0.02) for Linear layers, residual projections scaled by 1/sqrt(2L).
        # Embedding tables keep their own N(0, 1/sqrt(dim)) init (fairseq), which embed_scale
        # = sqrt(d) brings to unit scale, the same for every scheme.
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                std = 0.02 / math.sqrt(2 * self.cfg.n_layer) if name.endswith(("attn.out", "mlp.2")) else 0.02
                nn.init.normal_(module.weight, 0.0, std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, 0.0, module.embedding_dim**-0.5)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def hidden(self, idx, start_pos: int = 0, cache: KVCache | None = None, probs: list | None = None):
        """idx (B, T) at absolute positions [start_pos, start_pos + T) -> final hidden (B, T, D)."""
        B, T = idx.shape
        end = start_pos + T
        k_start = start_pos
        if cache is not None:
            if cache.end is not None and start_pos != cache.end:
                raise ValueError(
                    f"start_pos={start_pos} does not continue the KV cache, which ends at position {cache.end}"
                )
            k_start = start_pos if cache.start is None else cache.start
        self.position.check_positions(end)
        ctx = AttentionContext(self, start_pos, k_start, end, idx.device)
        x = self.vocab.embed(idx) * self.embed_scale  # (B, T, D)
        pos_emb = self.position.embedding(ctx.q_pos)  # (T, D) or None
        if pos_emb is not None:
            x = x + pos_emb.to(x.dtype)
        x = self.drop(x)
        for layer, block in enumerate(self.blocks):
            x = block(x, ctx, cache, layer, probs)
        if cache is not None:
            cache.start, cache.end = k_start, end
        return self.ln_f(x)

    def forward(self, idx, start_pos: int = 0, cache: KVCache | None = None, return_attention: bool = False,
                targets=None):
        """idx (B, T) -> logits (B, T, V); with return_attention also per-layer (B, H, T, Tk) probs.
        With targets (B, T): the per-token loss (B, T) instead (what DDP training calls)."""
        if targets is not None:
            return self.vocab.nll(self.hidden(idx, start_pos), targets)
        probs = [] if return_attention else None
        logits = self.vocab.logits(self.hidden(idx, start_pos, cache, probs))  # (B, T, V)
        return (logits, probs) if return_attention else logits

    def loss(self, idx, targets, start_pos: int = 0):
        """Per-token negative log-likelihood (B, T), without materialising full logits when adaptive."""
        return self.vocab.nll(self.hidden(idx, start_pos), targets)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None, generator=None):
        """Continue idx (B, T) by max_new_tokens tokens with a KV cache; temperature 0 is greedy."""
        cache = KVCache(self.cfg.n_layer)
        logits = self(idx, start_pos=0, cache=cache)[:, -1]  # (B, V)
        out = [idx]
        for step in range(max_new_tokens):
            if temperature == 0:
                nxt = logits.argmax(-1, keepdim=True)  # (B, 1)
            else:
                scaled = logits.float() / temperature
                if top_k is not None:
                    kth = scaled.topk(min(top_k, scaled.shape[-1]), dim=-1).values[:, -1:]
                    scaled = scaled.masked_fill(scaled < kth, float("-inf"))
                nxt = torch.multinomial(scaled.softmax(-1), 1, generator=generator)
            out.append(nxt)
            if step + 1 < max_new_tokens:
                logits = self(nxt, start_pos=cache.end, cache=cache)[:, -1]
        return torch.cat(out, dim=1)  # (B, T + max_new_tokens)

    def config_dict(self) -> dict:
        return asdict(self.cfg)
