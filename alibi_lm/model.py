"""A pre-LayerNorm GPT-style decoder whose position scheme is a plug-in (alibi_lm.positions).

The model and its attention never look at a scheme's name: they call the scheme's embedding(),
rotate() and score_bias() with explicit absolute positions, and fold the causal mask into the one
bias tensor that scaled_dot_product_attention receives.
"""

from __future__ import annotations

import functools
import math
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .errors import ConfigError, check_choice
from .positions import PositionScheme, build_position_scheme, scheme_options
from .vocab import AdaptiveVocabulary, TiedVocabulary, fit_cutoffs

ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU}
ATTENTION = ("auto", "sdpa", "flex")


@dataclass
class LMConfig:
    """The model; also the schema of the config's `model.*` keys (configs/model/*.yaml set what differs)."""

    vocab_size: int | None = None  # None in configs: the trainer sets the tokenizer's
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 256
    d_ff: int | None = None  # None: 4 * d_model
    dropout: float = 0.0  # on the embeddings and on each residual branch's output
    attn_dropout: float = 0.0  # on the attention probabilities (fairseq's attention_dropout)
    activation_dropout: float = 0.0  # after the FFN's activation (fairseq's activation_dropout)
    activation: str = "gelu"  # gelu | relu (the paper's fairseq model)
    final_norm: bool = True  # a LayerNorm after the last block (fairseq's wiki103 model has none)
    init: str = "gpt2"  # gpt2: N(0, 0.02), residual outputs / sqrt(2 n_layer) | fairseq: its attention init
    bias: bool = True  # biases in Linear layers and LayerNorms
    position: str = "alibi"  # a registered scheme; in configs, the one chosen with position=...
    position_options: Any = field(default_factory=dict)  # the scheme's options (position.*): its Options or a dict
    embed_scale: float | None = None  # None: sqrt(d_model), as fairseq does for every scheme
    adaptive_cutoffs: list[int] | None = None  # e.g. [20000, 60000]: adaptive input + tied softmax
    adaptive_factor: int = 4
    adaptive_softmax_dropout: float = 0.0  # on the softmax input and inside its tails (fairseq: 0.2)
    # Queries per attention call: longer inputs attend in blocks. On CPU, blocks of 128 keep each score
    # tensor cache-resident and skip the keys after each block; GPUs want large blocks.
    attn_query_block: int = 1024
    attention: str = "auto"  # auto (FlexAttention on CUDA when it applies, else SDPA) | sdpa | flex

    def __post_init__(self):
        for name in ("vocab_size", "n_layer", "n_head", "d_model", "attn_query_block"):
            if getattr(self, name) is not None and int(getattr(self, name)) < 1:
                raise ConfigError(f"model.{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_head:
            raise ConfigError(f"model.d_model={self.d_model} is not divisible by model.n_head={self.n_head}; "
                              f"pick d_model a multiple of n_head")
        for name in ("dropout", "attn_dropout", "activation_dropout", "adaptive_softmax_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"model.{name} must be in [0, 1), got {getattr(self, name)}")
        for name, allowed in (("activation", ACTIVATIONS), ("init", ("gpt2", "fairseq")), ("attention", ATTENTION)):
            check_choice(f"model.{name}", getattr(self, name), allowed)
        cutoffs = list(self.adaptive_cutoffs or [])
        if cutoffs != sorted(set(cutoffs)) or (cutoffs and cutoffs[0] < 1):
            raise ConfigError(f"model.adaptive_cutoffs must be increasing and > 0, got {cutoffs}; "
                              f"e.g. model.adaptive_cutoffs=[20000,60000] or null")
        options = scheme_options(self.position, self.position_options)
        options.check(self.n_head, self.d_model)
        self.position_options = asdict(options)  # plain values, as checkpoints hold them


# Values of an absolute score bias (FIRE past L_thr) kept across layers within one forward: 2^25 float32
# values, 128 MiB (16L of L = 128 with 4 heads and query blocks of 128 needs 8.9 M).
ABSOLUTE_BIAS_KEPT = 1 << 25

# Fields that change how the model computes, not what: a checkpoint resumes under other values.
EXECUTION_FIELDS = ("attn_query_block", "attention")


class KVCache:
    """Keys and values of every layer for absolute positions [start, end)."""

    def __init__(self, n_layer: int):
        self.keys: list[torch.Tensor | None] = [None] * n_layer  # each (B, H, Tk, Dh)
        self.values: list[torch.Tensor | None] = [None] * n_layer
        self.start: int | None = None
        self.end: int | None = None


class MaskCache(OrderedDict):
    """The masks a model reuses across forwards (see AttentionContext): (block rows, device, dtype) -> (fold,
    offset D), the template of a static relative bias or of the causal mask alone; least recently used first."""

    LIMIT = 4  # a few block sizes (train, eval, decode); each template grows with the length

    def get(self, key, default=None):
        if key in self:
            self.move_to_end(key)
        return super().get(key, default)

    def put(self, key, value) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.LIMIT:
            self.popitem(last=False)


class AttentionContext:
    """What attention needs to know about positions, built once per forward and shared by layers.

    Queries sit at absolute positions [q_start, q_start + Tq) and keys at [k_start, q_start + Tq).
    Attention runs over query blocks of `block` rows (one block when Tq <= query_block);
    block b holds queries [q0, q1) and sees keys [k_start, q_start + q1).

    The scheme's score bias and the causal mask are folded into one tensor. For a relative bias
    (or none) that tensor is built once per forward, for every layer, batch element and query block:
    with D = q_start + q0_last - k_start, the offset of the last block, the template
    fold[i, c] = bias(D + i - c), -inf where c > D + i, for i < block, c < D + block, holds block b's
    mask at columns [D - (q_start + q0 - k_start), D + q1 - q0). Its size grows linearly with the
    length, never as (Tq, Tk). A static bias (ALiBi) keeps its template in the model's MaskCache,
    grown geometrically in D, so later forwards take a view of it without computing anything.
    `flex` and `score_mod` are set when FlexAttention runs instead.
    """

    def __init__(self, scheme: PositionScheme, masks: MaskCache, q_start: int, k_start: int, end: int, device,
                 query_block: int, flex=None, score_mod=None):
        self.scheme, self.masks, self.flex, self.score_mod = scheme, masks, flex, score_mod
        self.has_bias = type(scheme).score_bias is not PositionScheme.score_bias
        self.q_start, self.k_start = q_start, k_start
        self.q_pos = torch.arange(q_start, end, device=device)  # (Tq,)
        self.k_pos = torch.arange(k_start, end, device=device)  # (Tk,)
        self.device = self.q_pos.device
        n_queries = end - q_start
        self.block = min(n_queries, query_block)
        self.blocks = [(q0, min(q0 + self.block, n_queries)) for q0 in range(0, n_queries, self.block)]
        # the relative template holds rows for a whole last block, which may run past `end`
        template_end = q_start + self.blocks[-1][0] + self.block
        self.relative = not self.has_bias or template_end <= scheme.relative_below()
        # a bias of absolute positions is built per query block, kept for the forward's other layers while
        # all blocks fit in ABSOLUTE_BIAS_KEPT (else each layer rebuilds them: their total grows as length^2)
        kept = scheme.n_head * sum((q1 - q0) * (q_start + q1 - k_start) for q0, q1 in self.blocks)
        self.keep_absolute = len(self.blocks) == 1 or kept <= ABSOLUTE_BIAS_KEPT
        self._template = None  # (fold, offset D) once built
        self._absolute: dict = {}  # (q0, q1, dtype) -> a block's absolute mask
        self._block_mask = None  # FlexAttention's, once built

    def mask(self, q0: int, q1: int, dtype):
        """(attn_mask, is_causal) for queries q_pos[q0:q1] against keys k_pos[:q_start + q1 - k_start].

        attn_mask is (1, H, q1 - q0, n_keys) with a bias, (q1 - q0, n_keys) without: 2-D or 4-D, the
        shapes for which CPU SDPA has a fused kernel (it falls back to the unfused math one for 3-D)."""
        offset = self.q_start + q0 - self.k_start  # block's first query minus first key
        if not self.has_bias and offset == 0:
            return None, True  # aligned causal square: SDPA's own causal kernel
        if self.relative:
            fold, top = self._relative_template(dtype)
            return fold[..., : q1 - q0, top - offset : top + q1 - q0], False  # (1, H, rows, n_keys) or (rows, n_keys)
        mask = self._absolute.get((q0, q1, dtype))
        if mask is None:
            mask = self.fold(self.q_pos[q0:q1], self.k_pos[: offset + q1 - q0], dtype)
            if self.keep_absolute:
                self._absolute[q0, q1, dtype] = mask
        return mask, False

    def _relative_template(self, dtype):
        if self._template is not None and self._template[0].dtype == dtype:
            return self._template
        top = self.q_start + self.blocks[-1][0] - self.k_start  # D, the last block's offset
        shared = self.scheme.static_bias or not self.has_bias  # a learned bias changes every step
        key = (self.block, self.device, dtype)
        cached = self.masks.get(key) if shared else None
        if cached is not None and cached[1] >= top:
            self._template = cached
            return cached
        if cached is not None:  # grow geometrically: few rebuilds over a long decode
            top = max(top, 2 * cached[1])
        # a relative bias depends on i - j only, so any positions with these differences will do;
        # these are the true ones of the last block when nothing is rounded up
        q_pos = torch.arange(self.k_start + top, self.k_start + top + self.block, device=self.device)
        k_pos = torch.arange(self.k_start, self.k_start + top + self.block, device=self.device)
        self._template = (self.fold(q_pos, k_pos, dtype), top)
        if shared:
            self.masks.put(key, self._template)
        return self._template

    def fold(self, q_pos, k_pos, dtype):
        """The scheme's bias with -inf on future keys: (1, H, tq, tk), or (tq, tk) without a bias."""
        future = k_pos[None, :] > q_pos[:, None]  # (tq, tk)
        bias = self.scheme.score_bias(q_pos, k_pos) if self.has_bias else None  # (H, tq, tk)
        if bias is None:
            return torch.zeros_like(future, dtype=dtype).masked_fill(future, float("-inf"))  # (tq, tk)
        return bias.masked_fill(future[None], float("-inf")).to(dtype)[None]  # (1, H, tq, tk)

    def flex_block_mask(self, n_queries: int, n_keys: int):
        if self._block_mask is None:  # once per forward, for every layer (dynamo traces through lru_cache)
            self._block_mask = causal_block_mask(n_queries, n_keys, self.q_start - self.k_start, self.device)
        return self._block_mask


def flush_denormals() -> None:
    """Flush denormal floats to zero in this process (CPU); the apps (alibi_lm.cli) and make bench call it first.

    ALiBi's distant scores (-m (i - j) in the hundreds at 16L) leave the softmax's exp() with denormal floats,
    which x86 computes with slowly: without this, ALiBi's evaluation at 16L ran ~1.7x slower than nope's (make bench). Values
    below 1.2e-38 become 0, against softmax sums >= 1: results change in the last bits at most (not bit-identical
    to a process without it). A process-wide setting, so it is the entry point's choice, not the model's."""
    torch.set_flush_denormal(True)


# ---- FlexAttention (CUDA; on CPU only on request, for tests) ----------------------------------------

def flex_available() -> bool:
    """FlexAttention as this model uses it: BlockMask.from_kv_blocks(seq_lengths=), dynamo's recompile_limit
    and gradients into a learned bias's score_mod (pytorch#137452) are all there from torch 2.7 on; older
    torch (the project supports 2.5) uses SDPA."""
    return torch.__version__ >= (2, 7)


def causal_block_mask(n_queries: int, n_keys: int, offset: int, device, block: int = 128):
    """BlockMask for query q_idx seeing keys kv_idx <= q_idx + offset, built from block indices
    (create_block_mask would evaluate the mask at all n_queries x n_keys points first)."""
    from torch.nn.attention.flex_attention import BlockMask

    n_qb, n_kb = -(-n_queries // block), -(-n_keys // block)
    q_first = torch.arange(n_qb, device=device) * block  # first query of each query block
    q_last = torch.clamp(q_first + block - 1, max=n_queries - 1)
    kv_first = torch.arange(n_kb, device=device) * block  # (n_kb,)
    kv_last = torch.clamp(kv_first + block - 1, max=n_keys - 1)
    # full: every key of the block is visible to every query of the query block, and neither block
    # runs past the end (as create_block_mask has it: edge blocks go through mask_mod)
    full = kv_last[None, :] <= (q_first[:, None] + offset)  # (n_qb, n_kb)
    full &= (kv_first + block <= n_keys)[None, :] & (q_first + block <= n_queries)[:, None]
    # partial: some key of the block is visible to some query, but not all
    partial = (kv_first[None, :] <= (q_last[:, None] + offset)) & ~full

    def as_blocks(sel):
        num = sel.sum(-1, dtype=torch.int32)  # (n_qb,)
        # indices of the selected kv blocks first, in order, then the rest (ignored)
        order = torch.argsort((~sel).to(torch.int8), dim=-1, stable=True).to(torch.int32)  # (n_qb, n_kb)
        return num[None, None], order[None, None]

    return BlockMask.from_kv_blocks(*as_blocks(partial), *as_blocks(full), BLOCK_SIZE=block,
                                    mask_mod=lambda b, h, q_idx, kv_idx: q_idx + offset >= kv_idx,
                                    seq_lengths=(n_queries, n_keys))


@functools.cache
def flex_attention_fn():
    """flex_attention under torch.compile: fused kernels (eager flex would materialise the scores)."""
    import torch._dynamo
    from torch.nn.attention.flex_attention import flex_attention

    # every scheme's score_mod and each grad mode is its own graph: more than the default 8
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    return torch.compile(flex_attention, dynamic=False)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.d_model // cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.dropout = cfg.attn_dropout

    def forward(self, x, ctx: AttentionContext, cache: KVCache | None, layer: int, probs: list | None):
        B, T, D = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)  # (3, B, H, T, Dh)
        q, k = ctx.scheme.rotate(qkv[:2], ctx.q_pos)  # queries and keys in one call; they share q_pos
        v = qkv[2]
        if cache is not None:
            if cache.keys[layer] is not None:
                k = torch.cat([cache.keys[layer], k], dim=2)  # (B, H, Tk, Dh)
                v = torch.cat([cache.values[layer], v], dim=2)
            cache.keys[layer], cache.values[layer] = k, v
        if probs is not None:  # the whole (.., Tq, Tk) mask and scores: a diagnostic path
            mask = ctx.fold(ctx.q_pos, ctx.k_pos, q.dtype)  # (1, H, Tq, Tk) or (Tq, Tk)
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim) + mask
            p = scores.softmax(-1)  # (B, H, Tq, Tk)
            probs.append(p.detach())
            y = p @ v  # (B, H, Tq, Dh)
        elif ctx.flex is not None:
            y = ctx.flex(q, k, v, score_mod=ctx.score_mod, block_mask=ctx.flex_block_mask(T, k.shape[2]))
        else:
            # One block of queries at a time (a single block unless T > model.attn_query_block), each
            # against the keys it can see: no (H, T, T) tensor of a long input exists, and the keys
            # after a block's last query are never computed.
            blocks = []
            for q0, q1 in ctx.blocks:
                n_keys = ctx.q_start + q1 - ctx.k_start
                mask, causal = ctx.mask(q0, q1, q.dtype)
                blocks.append(F.scaled_dot_product_attention(
                    q[:, :, q0:q1], k[:, :, :n_keys], v[:, :, :n_keys], attn_mask=mask, is_causal=causal,
                    dropout_p=self.dropout if self.training else 0.0,
                ))  # fmt: skip
            y = blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=2)  # (B, H, T, Dh)
        return self.out(y.transpose(1, 2).reshape(B, T, D))


class Block(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        d_ff = cfg.d_ff or 4 * cfg.d_model
        self.ln_attn = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_mlp = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.mlp = nn.Sequential(OrderedDict(
            fc_in=nn.Linear(cfg.d_model, d_ff, bias=cfg.bias),
            act=ACTIVATIONS[cfg.activation](),
            act_drop=nn.Dropout(cfg.activation_dropout),
            fc_out=nn.Linear(d_ff, cfg.d_model, bias=cfg.bias),
        ))  # fmt: skip
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, ctx, cache, layer, probs):
        x = x + self.drop(self.attn(self.ln_attn(x), ctx, cache, layer, probs))  # (B, T, D)
        return x + self.drop(self.mlp(self.ln_mlp(x)))


class TransformerLM(nn.Module):
    nll_chunk_logits = 2**25  # inference: the output layer works on slices of this many logits

    def __init__(self, cfg: LMConfig):
        super().__init__()
        if cfg.vocab_size is None:
            raise ConfigError("model.vocab_size is not set; it is the tokenizer's (the trainer sets it)")
        self.cfg = cfg
        self.position = build_position_scheme(cfg.position, cfg.n_head, cfg.d_model, **dict(cfg.position_options))
        cutoffs = fit_cutoffs(cfg.adaptive_cutoffs, cfg.vocab_size)  # a preset's cutoffs on any vocabulary
        self.vocab = (AdaptiveVocabulary(cfg.vocab_size, cfg.d_model, cutoffs, cfg.adaptive_factor, cfg.adaptive_softmax_dropout)
                      if cutoffs else TiedVocabulary(cfg.vocab_size, cfg.d_model))
        self.embed_scale = cfg.embed_scale if cfg.embed_scale is not None else math.sqrt(cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=cfg.bias) if cfg.final_norm else nn.Identity()
        self.masks = MaskCache()  # see AttentionContext
        self._init_weights()

    def _init_weights(self):
        # The blocks' Linear layers only: the vocabulary and the position scheme initialise their own
        # parameters (fairseq's adaptive input init; T5's zero table), the same under either init.
        for name, module in self.blocks.named_modules():
            if not isinstance(module, nn.Linear):
                continue
            if self.cfg.init == "fairseq":
                # fairseq's MultiheadAttention: q, k, v xavier_uniform with gain 1/sqrt(2) (each on its own
                # (D, D), not on the fused (3D, D)), out_proj xavier_uniform with a zero bias; the FFN and
                # the q/k/v biases keep torch's default Linear init, as fairseq's TransformerDecoderLayer does
                if name.endswith("attn.qkv"):
                    for w in module.weight.chunk(3):
                        nn.init.xavier_uniform_(w, gain=2**-0.5)
                elif name.endswith("attn.out"):
                    nn.init.xavier_uniform_(module.weight)
                    if module.bias is not None:
                        nn.init.zeros_(module.bias)
                continue
            # nanoGPT/GPT-2: N(0, 0.02), residual projections scaled by 1/sqrt(2 n_layer), zero biases
            residual = name.endswith(("attn.out", "mlp.fc_out"))
            nn.init.normal_(module.weight, 0.0, 0.02 / math.sqrt(2 * self.cfg.n_layer) if residual else 0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def hidden(self, idx, start_pos: int = 0, cache: KVCache | None = None, probs: list | None = None):
        """idx (B, T) at absolute positions [start_pos, start_pos + T) -> final hidden (B, T, D)."""
        end = start_pos + idx.shape[1]
        if cache is not None and cache.end is not None and start_pos != cache.end:
            raise ValueError(f"start_pos={start_pos} does not continue the KV cache, which ends at position {cache.end}")
        k_start = start_pos if cache is None or cache.start is None else cache.start
        self.position.check_positions(end)
        flex = score_mod = None
        if self.attention_backend(idx.device, cache is not None or probs is not None) == "flex":
            flex = flex_attention_fn()
            score_mod = self.position.flex_score_mod(start_pos, k_start)  # None for a scheme without a bias
        ctx = AttentionContext(self.position, self.masks, start_pos, k_start, end, idx.device,
                               self.cfg.attn_query_block, flex, score_mod)
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

    def attention_backend(self, device, incremental: bool = False) -> str:
        """"flex" or "sdpa" for a forward on `device` in the current mode (train/eval). auto picks FlexAttention
        on CUDA when torch has it, the scheme's bias (if any) has a flex_score_mod, and there is no attention
        dropout (FlexAttention has none): evaluation, and training with model.attn_dropout=0. KV-cache steps and
        return_attention (incremental) use SDPA / the explicit path."""
        mode, scheme = self.cfg.attention, type(self.position)
        if mode == "sdpa" or incremental:
            return "sdpa"
        fits = flex_available() and (scheme.score_bias is PositionScheme.score_bias
                                     or scheme.flex_score_mod is not PositionScheme.flex_score_mod)
        dropout = self.cfg.attn_dropout if self.training else 0.0
        on_cuda = torch.device(device).type == "cuda"
        if mode == "flex":
            if not fits:
                raise ValueError(f"model.attention=flex needs torch >= 2.7 (FlexAttention) and a flex_score_mod for "
                                 f"position={self.cfg.position}; use model.attention=auto")
            if dropout > 0:
                raise ValueError("model.attention=flex cannot train with attention dropout (FlexAttention has "
                                 "none); set model.attn_dropout=0 or model.attention=auto")
            if not on_cuda and torch.is_grad_enabled():
                raise ValueError("model.attention=flex on CPU is inference only (torch has no CPU backward for "
                                 "FlexAttention): run under torch.no_grad() or use model.attention=auto")
            return "flex"
        return "flex" if on_cuda and fits and dropout == 0 else "sdpa"

    def forward(self, idx, start_pos: int = 0, cache: KVCache | None = None, return_attention: bool = False,
                targets=None):
        """idx (B, T) -> logits (B, T, V); with return_attention also per-layer (B, H, T, Tk) probs.
        With targets (B, T): the per-token loss (B, T) instead (what DDP training calls)."""
        if targets is not None:  # without materialising the full logits when adaptive
            return self.token_nll(self.hidden(idx, start_pos), targets)
        probs = [] if return_attention else None
        logits = self.vocab.logits(self.hidden(idx, start_pos, cache, probs))  # (B, T, V)
        return (logits, probs) if return_attention else logits

    def token_nll(self, h, targets):
        """Per-token NLL of final hidden states h (B, T, D): the vocabulary's nll, which in inference
        runs over slices of about nll_chunk_logits logits, so that evaluation memory does not grow
        with the (tokens, vocabulary) logits of a long window. Training (with grad) takes it whole."""
        rows = max(1, self.nll_chunk_logits // self.cfg.vocab_size)
        if (torch.is_grad_enabled() and h.requires_grad) or targets.numel() <= rows:
            return self.vocab.nll(h, targets)
        flat_h, flat_t = h.reshape(-1, h.shape[-1]), targets.reshape(-1)  # (N, D), (N,)
        parts = [self.vocab.nll(flat_h[i : i + rows], flat_t[i : i + rows]) for i in range(0, len(flat_t), rows)]
        return torch.cat(parts).view_as(targets)  # (B, T)

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
