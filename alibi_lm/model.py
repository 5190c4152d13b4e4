"""A pre-LayerNorm GPT-style decoder whose position scheme is a plug-in (alibi_lm.positions).

The model never looks at a scheme's name: it calls the scheme's embedding() and rotate() with explicit
absolute positions, a content-aware scheme's prepare() with each layer's input, and its attention
(alibi_lm.attention) the scheme's score bias and content bias.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from .attention import (
    ATTENTION,
    AttentionContext,
    AttentionWindow,
    MaskCache,
    TemperatureTuning,
    attend,
    choose_backend,
    explain_backend,
)
from .errors import ConfigError, check_choice, check_range
from .extension import ExtensionMethod, check_scheme
from .positions import POSITION_SCHEMES, PositionScheme, build_position_scheme, scheme_options
from .vocab import AdaptiveVocabulary, TiedVocabulary, fit_cutoffs

ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU}


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
    # tensor cache-resident and skip the keys after each block; GPUs want large blocks. CPU inference takes
    # fewer where a block would pass attention.context.BLOCK_VALUES (its memory at long lengths).
    attn_query_block: int = 1024
    attention: str = "auto"  # auto (FlexAttention on CUDA when it applies, else SDPA) | sdpa | flex
    # QK-norm: RMS-normalise each head's queries and keys (over Dh, learned scale per dimension) before the scheme
    # sees them, as Llama 4 and OLMo 2 do; Cohere (Yang et al. 2025) report that it flattens long-range attention
    qk_norm: bool = False
    # Scalable-Softmax (Nakanishi 2025): every logit of a query (scores and bias) times s_h log n, n the number of
    # keys it attends, s_h learned per layer and head from ssmax_init (the value the paper's code starts from)
    ssmax: bool = False
    ssmax_init: float = 0.43
    # Layers with another scheme (Llama 4's iRoPE, SmolLM3): every nope_every-th layer (1-based, as HF's
    # no_rope_layer_interval: layers k-1, 2k-1, ...) attends with scheme nope_position (its default options)
    nope_every: int | None = None
    nope_position: str = "nope"  # a registered scheme without an input embedding
    # A window on the main scheme's layers (not the nope_every ones), at most one of: sliding, query i sees keys
    # i-w+1..i (Cohere's SWA layers); chunked, a query sees the keys of its own chunk of `chunk` tokens (Llama 4)
    local_window: int | None = None
    chunk: int | None = None

    def __post_init__(self):
        for name in ("vocab_size", "n_layer", "n_head", "d_model", "attn_query_block", "local_window", "chunk"):
            if getattr(self, name) is not None and int(getattr(self, name)) < 1:
                raise ConfigError(f"model.{name} must be >= 1, got {getattr(self, name)}")
        check_range("model.d_ff", self.d_ff, 1)
        check_range("model.adaptive_factor", self.adaptive_factor, 1)
        check_range("model.embed_scale", self.embed_scale, 0, low_open=True)
        check_range("model.ssmax_init", self.ssmax_init, 0, low_open=True)
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
        if self.ssmax and self.attention == "flex":
            raise ConfigError("model.ssmax scales every logit per query, which this project's FlexAttention path does "
                              "not do; use model.attention=auto (SDPA)")
        options = scheme_options(self.position, self.position_options)
        options.check(self.n_head, self.d_model)
        self.position_options = asdict(options)  # plain values, as checkpoints hold them
        self._check_layer_schemes()

    def _check_layer_schemes(self):
        if self.local_window is not None and self.chunk is not None:
            raise ConfigError("model.local_window and model.chunk are both set; keep one of them (the other null)")
        scheme_options(self.nope_position, {})  # raises for an unknown scheme
        if self.nope_every is None:
            return
        if int(self.nope_every) < 2:
            raise ConfigError(f"model.nope_every must be >= 2 (every k-th layer), got {self.nope_every}; for NoPE "
                              f"in every layer use position={self.nope_position}")
        for name in (self.position, self.nope_position):
            if POSITION_SCHEMES[name].embedding is not PositionScheme.embedding:
                raise ConfigError(f"model.nope_every cannot mix position={name}: its embedding is added at the input, "
                                  f"not per layer; use a scheme that acts in attention (rope, alibi, ...)")


def layer_schemes(cfg: LMConfig) -> list[str]:
    """The scheme of each layer: cfg.position, or cfg.nope_position on every nope_every-th layer (1-based)."""
    k = cfg.nope_every
    return [cfg.nope_position if k and (layer + 1) % k == 0 else cfg.position for layer in range(cfg.n_layer)]


# Model fields that make a variant with rows of its own, named in position_label (and free in naming's test of
# "the experiment's own run", alibi_lm/naming.py), besides the scheme's labeled options
LABELED_SWITCHES = ("qk_norm", "ssmax")  # named +qk_norm, +ssmax when on
LABELED_FIELDS = (*LABELED_SWITCHES, "nope_every", "nope_position", "local_window", "chunk")


def position_label(cfg: LMConfig | Mapping) -> str:
    """What runs and rows call a model's positions: its scheme, e.g. rope, with its labeled options, QK-norm,
    Scalable-Softmax, the mix and window if any: alibi+learn_slopes, fox+rope, rope+qk_norm, nope+ssmax,
    rope+nope4 (NoPE every 4th layer), rope+nope4-w64 (sliding window 64), rope-c64 (chunks of 64).
    cfg: an LMConfig or a mapping of its fields (a checkpoint's model_config; older ones lack the new keys)."""
    get = cfg.get if isinstance(cfg, Mapping) else lambda key, default=None: getattr(cfg, key, default)
    label = str(get("position")) + scheme_options(str(get("position")), get("position_options") or {}).label()
    label += "".join(f"+{name}" for name in LABELED_SWITCHES if get(name))
    if get("nope_every"):
        label += f"+{get('nope_position') or 'nope'}{get('nope_every')}"
    if get("local_window"):
        label += f"-w{get('local_window')}"
    if get("chunk"):
        label += f"-c{get('chunk')}"
    return label


# Fields that change how the model computes, not what: a checkpoint resumes under other values.
EXECUTION_FIELDS = ("attn_query_block", "attention")


class KVCache:
    """Keys and values of every layer for absolute positions [start, end), and a content-aware scheme's state
    for them (its prepare()'s result per layer: FoX's cumulative log forget gates, (B, H, Tk))."""

    def __init__(self, n_layer: int):
        self.keys: list[torch.Tensor | None] = [None] * n_layer  # each (B, H, Tk, Dh)
        self.values: list[torch.Tensor | None] = [None] * n_layer
        self.state: list = [None] * n_layer  # the scheme's, opaque to the model
        self.start: int | None = None
        self.end: int | None = None


def flush_denormals() -> None:
    """Flush denormal floats to zero in this process (CPU); the apps (alibi_lm.cli) and make bench call it first.

    ALiBi's distant scores (-m (i - j) in the hundreds at 16L) leave the softmax's exp() with denormal floats,
    which x86 computes with slowly: without this, ALiBi's evaluation at 16L ran ~1.7x slower than nope's (make bench). Values
    below 1.2e-38 become 0, against softmax sums >= 1: results change in the last bits at most (not bit-identical
    to a process without it). A process-wide setting, so it is the entry point's choice, not the model's."""
    torch.set_flush_denormal(True)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.d_model // cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.dropout = cfg.attn_dropout
        self.qk_norm = nn.ModuleList([nn.RMSNorm(self.head_dim), nn.RMSNorm(self.head_dim)]) if cfg.qk_norm else None
        self.ssmax = nn.Parameter(torch.full((cfg.n_head,), float(cfg.ssmax_init))) if cfg.ssmax else None  # (H,) s_h

    def forward(self, x, ctx: AttentionContext, cache: KVCache | None, layer: int, probs: list | None):
        B, T, D = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)  # (3, B, H, T, Dh)
        qk = qkv[:2]
        if self.qk_norm is not None:  # before the scheme: a rotation then acts on unit-RMS vectors
            qk = torch.stack([norm(part) for norm, part in zip(self.qk_norm, qk)])  # (2, B, H, T, Dh)
        # queries and keys in one call (they share q_pos); under an extension a rotary scheme rotates in attention
        q, k = (qk[0], qk[1]) if ctx.rotary_remap else ctx.scheme.rotate(qk, ctx.q_pos)
        if ctx.query_scale is not None:  # evaluation's temperature tuning: (Tq,) per query
            q = q * ctx.query_scale[:, None].to(q.dtype)
        v = qkv[2]
        if cache is not None:
            if cache.keys[layer] is not None:
                k = torch.cat([cache.keys[layer], k], dim=2)  # (B, H, Tk, Dh)
                v = torch.cat([cache.values[layer], v], dim=2)
            cache.keys[layer], cache.values[layer] = k, v
        state = None
        if ctx.scheme.content_aware:  # e.g. forget gates from x: the state of every key, the cached ones first
            state = ctx.scheme.prepare(x, layer, cache.state[layer] if cache is not None else None)
            if cache is not None:
                cache.state[layer] = state
        logit_scale = None if self.ssmax is None else self.ssmax[:, None] * ctx.log_keys_seen  # (H, T): s_h log n
        y = attend(q, k, v, ctx, self.dropout if self.training else 0.0, probs, layer, state, logit_scale)  # (B, H, T, Dh)
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
        self.position = build_position_scheme(cfg.position, cfg.n_head, cfg.d_model, cfg.n_layer,
                                              **dict(cfg.position_options))
        # the scheme of each layer (model.nope_every); each scheme other than the main one built once
        self.layer_scheme = layer_schemes(cfg)
        self.other_positions = nn.ModuleDict({
            name: build_position_scheme(name, cfg.n_head, cfg.d_model, cfg.n_layer)
            for name in dict.fromkeys(self.layer_scheme) if name != cfg.position
        })  # fmt: skip
        sizes = (("sliding", cfg.local_window), ("chunk", cfg.chunk))
        # the main scheme's layers' own window (model.local_window, model.chunk), trained with: None or an AttentionWindow
        self.layer_window = next((AttentionWindow(kind, int(size)) for kind, size in sizes if size), None)
        cutoffs = fit_cutoffs(cfg.adaptive_cutoffs, cfg.vocab_size)  # a preset's cutoffs on any vocabulary
        self.vocab = (AdaptiveVocabulary(cfg.vocab_size, cfg.d_model, cutoffs, cfg.adaptive_factor, cfg.adaptive_softmax_dropout)
                      if cutoffs else TiedVocabulary(cfg.vocab_size, cfg.d_model))
        self.embed_scale = cfg.embed_scale if cfg.embed_scale is not None else math.sqrt(cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=cfg.bias) if cfg.final_norm else nn.Identity()
        self.masks = MaskCache()  # see AttentionContext; the main scheme's, and one for each other scheme's layers
        self.other_masks = {name: MaskCache() for name in self.other_positions}
        # keys hidden besides future ones, in every layer (evaluation's eval.attention=bca): None, or an AttentionWindow
        self.attention_window: AttentionWindow | None = None
        # evaluation's Llama 4 temperature tuning (eval.temperature_tuning): None, or the layers' TemperatureTuning
        self.temperature_tuning: TemperatureTuning | None = None
        # a training-free extension past L (alibi_lm.extension), applied in every layer: None, or set_extension's
        self.extension: ExtensionMethod | None = None
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

    def set_extension(self, method: ExtensionMethod | None) -> None:
        """Apply a training-free extension's mask and distance remap in every layer (None removes it); a one-line
        ConfigError where the model's scheme gives it no meaning (extension.check_scheme) or it meets the model's
        own attention window."""
        if method is not None:
            check_scheme(method, self.position, self.cfg.position)
            if self.layer_window is not None:
                raise ConfigError(f"extension={method.name} cannot extend a model trained with model.local_window or "
                                  f"model.chunk: its window already bounds every distance; drop extension")
        self.extension = method

    def learned_values(self) -> dict[str, float]:
        """Learned scalars worth following: the scheme's (ALiBi's learned slopes, FIRE's threshold) and each layer's
        Scalable-Softmax s_h (ssmax_s_<layer>_<head>); the trainer logs them and records them with the run."""
        values = dict(self.position.learned_values())
        for layer, block in enumerate(self.blocks):
            if block.attn.ssmax is not None:
                values.update({f"ssmax_s_{layer}_{h}": s for h, s in enumerate(block.attn.ssmax.tolist())})
        return values

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def hidden(self, idx, start_pos: int = 0, cache: KVCache | None = None, probs: list | None = None,
               positions: torch.Tensor | None = None):
        """idx (B, T), tokens [start_pos, start_pos + T) of a sequence -> final hidden (B, T, D). Token i sits at
        position i, or at positions[i] with `positions` (N >= start_pos + T,): an increasing map, shared by the
        batch, that randomized positions draw (alibi_lm.tasks.positions); a KV cache's tokens keep theirs."""
        end = start_pos + idx.shape[1]
        if cache is not None and cache.end is not None and start_pos != cache.end:
            raise ValueError(f"start_pos={start_pos} does not continue the KV cache, which ends at position {cache.end}")
        k_start = start_pos if cache is None or cache.start is None else cache.start
        contexts = self._contexts(idx.device, start_pos, k_start, end, cache is not None or probs is not None,
                                  positions)  # scheme name -> its AttentionContext
        ctx = contexts[self.cfg.position]
        x = self.vocab.embed(idx) * self.embed_scale  # (B, T, D)
        pos_emb = self.position.embedding(ctx.q_pos)  # (T, D) or None
        if pos_emb is not None:
            x = x + pos_emb.to(x.dtype)
        x = self.drop(x)
        for layer, block in enumerate(self.blocks):
            x = block(x, contexts[self.layer_scheme[layer]], cache, layer, probs)
        if cache is not None:
            cache.start, cache.end = k_start, end
        return self.ln_f(x)

    def schemes(self) -> dict[str, PositionScheme]:
        """Each distinct scheme of the layers by name, the main one (model.position) first."""
        return {self.cfg.position: self.position, **self.other_positions}

    def _contexts(self, device, start_pos: int, k_start: int, end: int, incremental: bool, positions) -> dict:
        """One AttentionContext per distinct scheme for this forward. The main scheme's layers attend within
        model.local_window / model.chunk if set, else within evaluation's attention_window; the others within
        evaluation's window only. Temperature tuning scales the queries of every layer, or, in a model with NoPE
        layers mixed in (model.nope_every), of those layers only, as Llama 4 does."""
        if self.layer_window is not None and self.attention_window is not None:
            raise ValueError("a model trained with model.local_window or model.chunk takes no evaluation attention "
                             "window (eval.attention=bca); drop eval.attention")
        if self.extension is not None and (self.attention_window is not None or positions is not None):
            raise ValueError("an extension (alibi_lm.extension) takes sequential positions and full attention: drop "
                             "eval.attention=bca or the position map")
        contexts = {}
        for name, scheme in self.schemes().items():
            scheme.check_positions(end if positions is None else int(positions[end - 1]) + 1)
            tuned = self.temperature_tuning is not None and (not self.other_positions or name != self.cfg.position)
            masks = self.masks if name == self.cfg.position else self.other_masks[name]
            flex = self._backend(name, device, incremental, positions) == "flex"
            contexts[name] = AttentionContext(scheme, masks, start_pos, k_start, end, device,
                                              self.cfg.attn_query_block, flex, positions, self._window(name),
                                              self.temperature_tuning if tuned else None, self.extension)
        return contexts

    def _window(self, name: str) -> AttentionWindow | None:
        """The attention window of scheme `name`'s layers: model.local_window / model.chunk for the main scheme's,
        else evaluation's attention_window (None: full causal attention)."""
        return self.layer_window if name == self.cfg.position and self.layer_window is not None else self.attention_window

    def _backend(self, name: str, device, incremental: bool, positions) -> str:
        """choose_backend for scheme `name`'s layers in this forward. The flex score_mod takes offsets, not a
        position map: a map goes to SDPA, as a KV-cache step, a window and a logit scale (Scalable-Softmax) do."""
        slow = (incremental or positions is not None or self._window(name) is not None or self.cfg.ssmax
                or self.extension is not None)  # an extension's masks are built per query block
        dropout = self.cfg.attn_dropout if self.training else 0.0
        return choose_backend(self.cfg.attention, self.schemes()[name], device, dropout, slow,
                              head_dim=self.cfg.d_model // self.cfg.n_head)

    def attention_backend(self, device, incremental: bool = False) -> str:
        """"flex" or "sdpa": what the main scheme's layers use in a forward on `device` in the current mode
        (train/eval), with sequential positions. KV-cache steps and return_attention (incremental) use SDPA / the
        explicit path."""
        return self._backend(self.cfg.position, device, incremental, None)

    def attention_paths(self, device) -> dict[str, dict[str, str]]:
        """What each scheme's layers run in a forward on `device` in the current mode (train/eval), with sequential
        positions, and why: {scheme: {"path": flex | sdpa | explicit, "why": ...}} (status.json's training segments,
        make bench's tables). In training on CUDA this runs FlexAttention's gradient probe (explain_backend)."""
        dropout = self.cfg.attn_dropout if self.training else 0.0
        paths = {}
        for name, scheme in self.schemes().items():
            blocked = self._window(name) is not None or self.cfg.ssmax or self.extension is not None
            path, why = explain_backend(self.cfg.attention, scheme, device, dropout, blocked,
                                        head_dim=self.cfg.d_model // self.cfg.n_head)
            paths[name] = dict(path=path, why=why)
        return paths

    def forward(self, idx, start_pos: int = 0, cache: KVCache | None = None, return_attention: bool = False,
                targets=None, positions: torch.Tensor | None = None):
        """idx (B, T) -> logits (B, T, V); with return_attention also per-layer (B, H, T, Tk) probs.
        With targets (B, T): the per-token loss (B, T) instead (what DDP training calls). positions: hidden()."""
        if targets is not None:  # without materialising the full logits when adaptive
            return self.token_nll(self.hidden(idx, start_pos, positions=positions), targets)
        probs = [] if return_attention else None
        logits = self.vocab.logits(self.hidden(idx, start_pos, cache, probs, positions))  # (B, T, V)
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
