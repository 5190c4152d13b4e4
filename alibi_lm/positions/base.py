"""The one interface every position scheme implements.

A scheme can tell attention where tokens are in three places, and overrides only the ones it uses:

    embedding(pos)            -> (T, D) added to the token embeddings     (sinusoidal, learned)
    rotate(qk, pos)           -> qk with positions mixed into q and k     (rope, xpos)
    score_bias(q_pos, k_pos)  -> (H, Tq, Tk) added to the attention scores (alibi, t5, kerple, sandwich, fire)

A content-aware scheme (content_aware = True: cope, fox) also sees what is attended: prepare(x, layer, earlier)
turns a layer's input into per-layer state (kept in the KV cache), and content_bias(block) adds a (B, H, tq, tk)
bias computed from the query block's q, k, raw scores and that state. Attention then runs explicitly, query block
by query block, instead of through a fused kernel.

Positions are always explicit absolute indices (1-D LongTensors), never inferred from a tensor's
shape: the query block of a KV-cache decode step or of a long evaluation window gets its true
positions, so every scheme is right at any offset by construction. docs/architecture.md has the whole interface.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn


def override_value(value) -> str:
    """A config value as a Hydra override writes it: true, null, 0.25."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


@dataclass
class PositionOptions:
    """A scheme with options subclasses this as a dataclass in its own module: fields with defaults (the
    `position.*` keys), one-line ConfigErrors in __post_init__ for a value that is bad on its own and in
    check() for one that does not fit the model. A scheme without options declares none (register
    gives it an empty subclass, whose type names the scheme in a composed config)."""

    # Fields whose non-default values make a variant of the scheme with rows of its own (alibi+learn_slopes,
    # rope+fraction0.25): label() names them, and so do run folders, results rows and reports.
    labeled: ClassVar[tuple[str, ...]] = ()

    def check(self, n_head: int, d_model: int, seq_len: int | None = None) -> None:
        """Raise ConfigError when the scheme cannot serve a model of this shape, or train at context
        length seq_len (None: not training). Runs when a config is composed and when a scheme is built."""

    def label(self) -> str:
        """'+field' for each labeled bool field set, '+field<value>' for another value that is not the default;
        '' for the scheme as its paper runs it."""
        parts = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in self.labeled and value != f.default:
                parts.append(f"+{f.name}" if value is True else f"+{f.name}{value:g}" if isinstance(value, float)
                             else f"+{f.name}{value}")
        return "".join(parts)

    def labeled_overrides(self) -> list[str]:
        """The Hydra overrides (position.learn_slopes=true) that set the labeled fields to these values."""
        return [f"position.{name}={override_value(getattr(self, name))}" for name in self.labeled]


class PositionScheme(nn.Module):
    # The options dataclass: configs/position/<name>.yaml extends it, and __init__ receives one.
    Options: type[PositionOptions] = PositionOptions
    # True when score_bias() depends on positions only (no learned parameters), so the model may
    # cache the folded bias + causal mask across steps. A learned bias (T5) must say False.
    static_bias: bool = False
    # True when score_bias(q_pos, k_pos) depends on q_pos[:, None] - k_pos[None, :] only: the model then
    # builds one folded bias per forward for every layer and query block (block b's bias is a window of it),
    # cached across forwards when static_bias.
    relative_bias: bool = False
    # True when attention depends on positions only through i - j, whatever the scheme does (a relative
    # bias, a rotation, nothing at all): shifting every position then changes no output. The generic
    # tests check it both ways (tests/test_model.py).
    shift_invariant: bool = False
    # Largest number of positions the scheme can represent; None means any length works.
    max_positions: int | None = None
    # True when attention also depends on the content of q, k or the layer's input: the scheme implements
    # content_bias() (and prepare() when it keeps per-token state), and attention runs the explicit path, query
    # block by query block (no SDPA or FlexAttention kernel).
    content_aware: bool = False
    # True when the scheme holds parameters per layer: it is built with n_layer (its constructor takes
    # n_layer=, after options) and is told the layer in prepare() and content_bias().
    per_layer: bool = False

    def __init__(self, n_head: int, d_model: int, options: PositionOptions | None = None, n_layer: int = 1):
        super().__init__()
        self.n_head = n_head
        self.d_model = d_model
        self.head_dim = d_model // n_head
        self.n_layer = n_layer
        self.options = self.Options() if options is None else options
        self.options.check(n_head, d_model)

    def check_positions(self, end: int) -> None:
        """Raise a clear error if absolute position `end - 1` is beyond what the scheme supports."""
        if self.max_positions is not None and end > self.max_positions:
            raise PositionRangeError(
                f"position {end - 1} is beyond the {type(self).__name__} table of {self.max_positions} "
                f"positions; raise position.max_len (for example position.max_len={1 << (end - 1).bit_length()}) "
                f"or use a relative scheme such as position=alibi"
            )

    def relative_below(self) -> float:
        """Queries at positions below this get a bias of i - j only. A relative_bias holds everywhere; a
        scheme that is relative only up to some position (FIRE below L_thr) says where, so a forward whose
        queries all lie below it gets the relative bias's speed: one bias for every layer and query block."""
        return math.inf if self.relative_bias else 0

    def embedding(self, pos: torch.Tensor) -> torch.Tensor | None:
        """(T,) absolute positions -> (T, D) vectors added at the input, or None."""
        return None

    def rotate(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """x (2, ..., T, Dh): queries (x[0]) and keys (x[1]) at absolute positions pos (T,) -> same shape.

        The model passes them stacked, (2, B, H, T, Dh), before the keys are cached, so one call
        transforms both. A scheme that treats both alike (rope) may take any (..., T, Dh); one that
        does not (xpos scales q and k oppositely) relies on index 0 being q and 1 being k."""
        return x

    def score_bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        """(Tq,), (Tk,) absolute positions -> (H, Tq, Tk) float32 additive score bias, or None: only the
        scheme's own bias (the model adds the causal mask and shares the result across layers and batch)."""
        return None

    def distance_bias(self, q_pos: torch.Tensor, distance: torch.Tensor) -> torch.Tensor | None:
        """(H, tq, tk) float32 bias of queries at positions q_pos (tq,) for keys at the given distances (tq, tk),
        float >= 0 and not necessarily i - j: what a training-free extension (alibi_lm.extension) feeds a bias
        scheme after remapping d = i - j to d'. With distance = i - j it equals score_bias() on every visible key.
        None: the scheme has no bias of a distance (absolute, rotary, content-aware or none)."""
        return None

    def rotation_at(self, pos: torch.Tensor, role: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(cos, sin), (T, Dh) float32 each, that rotate() applies at real-valued positions pos (T,): role 0 for
        queries, 1 for keys. A rotary scheme gives it so that an extension can rotate queries and keys at
        remapped positions (several passes); at integer positions it equals what rotate() uses. None: not rotary."""
        return None

    def flex_score_mod(self, q_offset: int, k_offset: int):
        """The score bias as a FlexAttention score_mod (used on CUDA), or None when the scheme cannot give one.

        Queries are at absolute positions q_offset + q_idx and keys at k_offset + kv_idx; the returned
        score_mod(score, b, h, q_idx, kv_idx) must add exactly what score_bias() gives for those positions
        (the causal mask is the model's block mask). Without it the model uses SDPA for the scheme."""
        return None

    def flex_state_score_mod(self, state: Any, q_offset: int, k_offset: int):
        """A content-aware scheme's bias as a FlexAttention score_mod built from one layer's prepare() state, or None
        (the explicit path). Queries are at q_offset + q_idx and keys at k_offset + kv_idx, the state covering the
        forward's keys from k_offset on; score_mod(score, b, h, q_idx, kv_idx) must add exactly what content_bias()
        gives, from per-token values (FoX: c_i - c_j), so that its cost is the state's, not (B, H, Tq, Tk)."""
        return None

    def learned_values(self) -> dict[str, float]:
        """Learned scalars worth following (FIRE's threshold L_thr and c): the trainer logs them with every
        validation and records their final values in status.json."""
        return {}

    def prepare(self, x: torch.Tensor, layer: int, earlier: Any) -> Any:
        """A content-aware scheme's per-layer state for one forward: x (B, T, D) is layer `layer`'s normalised
        input for the new tokens (what feeds q, k, v), `earlier` what prepare() returned for the tokens already in
        the KV cache (None without them). The result covers every key of the forward, the cached ones first; the
        model keeps it in the cache (KVCache.state[layer]) and hands it to content_bias() for each query block."""
        return None

    def content_bias(self, block: ScoreBlock) -> torch.Tensor:
        """(B, H, tq, tk) float bias added to one query block's scaled scores q k^T / sqrt(Dh), before the
        causal mask (which the model adds). Only content-aware schemes implement it."""
        raise NotImplementedError(f"{type(self).__name__} declares content_aware but has no content_bias()")

    def set_scaling(self, method: str | None, factor: float, train_len: int) -> None:
        """Inference-time length extension (position.scaling at evaluation): only rope has one."""
        if method is not None:
            raise ValueError(rescaling_refusal(method, f"position={getattr(self, 'name', type(self).__name__)}"))


def rescaling_refusal(method: str, subject: str) -> str:
    """The one line that refuses RoPE rescaling `method` on what is not a run trained with position=rope."""
    return (f"the RoPE rescaling {method} (extension={method}, or position.scaling={method}) applies to runs trained "
            f"with position=rope, not {subject}; drop it")


@dataclass
class ScoreBlock:
    """What a content-aware scheme sees of one query block (alibi_lm.attention builds it).

    The block's queries are tokens keys[query_index] of the forward: the keys it sees are the first tk of the
    forward's keys (the cached ones first) and end with the block's own tokens, so a state that prepare()
    aligned with the keys serves both sides (FoX: state[..., :tk] for keys, state[..., query_index] for queries)."""

    q: torch.Tensor  # (B, H, tq, Dh) queries, after rotate()
    k: torch.Tensor  # (B, H, tk, Dh) the keys they can see, after rotate()
    scores: torch.Tensor  # (B, H, tq, tk) q k^T / sqrt(Dh): no bias, no mask
    future: torch.Tensor  # (tq, tk) bool, True where the key comes after the query (masked by the model)
    q_pos: torch.Tensor  # (tq,) absolute positions
    k_pos: torch.Tensor  # (tk,)
    query_index: slice  # the block's queries among the keys: [tk - tq, tk)
    layer: int
    state: Any  # prepare()'s result for this layer


class PositionRangeError(ValueError):
    """A position outside the range a scheme can represent (e.g. past a learned table)."""
