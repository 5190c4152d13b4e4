"""What one forward's layers share about positions (AttentionContext): the query and key positions, the query blocks,
and the scheme's score bias folded with the causal mask (and a window's hidden keys, an extension's remap); MaskCache
keeps a static relative bias's fold across forwards. Positions are never derived from tensor shapes."""

from __future__ import annotations

import functools
from collections import OrderedDict
from dataclasses import dataclass

import torch

from ..extension import ExtensionMethod, Remap, scheme_kind
from ..positions import PositionScheme
from . import flex_kernel

# Values of an absolute score bias (FIRE past L_thr) kept across layers within one forward: 2^25 float32
# values, 128 MiB (16L of L = 128 with 4 heads and query blocks of 128 needs 8.9 M).
ABSOLUTE_BIAS_KEPT = 1 << 25

# In inference on CPU, a query block's temporaries (its (B, H, rows, keys) scores and probabilities, an absolute
# bias, the explicit path's content bias) hold at most this many values per batch element: past it a forward
# takes fewer query rows per block (never fewer than MIN_BLOCK_ROWS), so that at long lengths they stop growing
# with the keys and evaluation memory grows with the activations and the keys and values only (make bench's
# 16L / 8L target). Training and GPUs keep model.attn_query_block: fewer rows there means more kernel launches.
BLOCK_VALUES = 1 << 21
MIN_BLOCK_ROWS = 16


WINDOWS = ("bca", "sliding", "chunk")


@dataclass(frozen=True)
class AttentionWindow:
    """Keys a query may not see although they are not in its future, by indices in the sequence (from its first):
    bca (blockwise causal attention, as the xPos paper evaluates): blocks of `size` tokens, each query seeing its
    own block and the one before (a query in block b sees keys from the start of block b - 1); sliding: query i
    sees keys i - size + 1 .. i; chunk (Llama 4's chunked attention): a query sees the keys of its own block."""

    kind: str  # bca | sliding | chunk
    size: int

    def __post_init__(self):
        if self.kind not in WINDOWS or self.size < 1:
            raise ValueError(f"AttentionWindow takes a kind of {WINDOWS} and a size >= 1, got {self.kind}, {self.size}")

    def first(self, q_index: torch.Tensor) -> torch.Tensor:
        """(Tq,) the index of the first key each query q_index (indices in the sequence) may see."""
        if self.kind == "sliding":
            return q_index - self.size + 1
        if self.kind == "chunk":
            return q_index // self.size * self.size
        return (q_index // self.size - 1).clamp(min=0) * self.size

    def outside(self, q_index: torch.Tensor, k_index: torch.Tensor) -> torch.Tensor:
        """(Tq, Tk) True where key k_index[c] is outside the window of query q_index[r] (indices in the sequence)."""
        return k_index[None, :] < self.first(q_index)[:, None]


@dataclass(frozen=True)
class TemperatureTuning:
    """Llama 4's attention temperature tuning (HF transformers' attn_temperature_tuning, after Scalable-Softmax),
    an evaluation-time option: queries at position p are multiplied by 1 + attn_scale * log(floor((p + 1) /
    floor_scale) + 1), so 1 up to position floor_scale - 2 and growing with log position past it."""

    floor_scale: int
    attn_scale: float

    def scale(self, q_pos: torch.Tensor) -> torch.Tensor:
        """(Tq,) float32 multipliers of the queries at absolute positions q_pos."""
        return 1 + self.attn_scale * torch.log(torch.floor((q_pos.float() + 1) / self.floor_scale) + 1)


class MaskCache(OrderedDict):
    """The masks a model reuses across forwards (see AttentionContext): (block rows, device, dtype) -> (fold,
    offset D), the template of a static relative bias or of the causal mask alone; least recently used first."""

    LIMIT = 8  # a few block sizes (train, eval, decode, and BLOCK_VALUES' smaller ones at long lengths)

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
    """What attention needs to know about positions, built once per forward and scheme and shared by its layers.

    Queries sit at absolute positions [q_start, q_start + Tq) and keys at [k_start, q_start + Tq).
    Attention runs over query blocks of `block` rows (one block when Tq <= query_block; fewer rows in CPU
    inference where BLOCK_VALUES asks for it); block b holds queries [q0, q1) and sees keys [k_start, q_start + q1).

    The scheme's score bias and the causal mask are folded into one tensor. For a relative bias
    (or none) that tensor is built once per forward, for every layer, batch element and query block:
    with D = q_start + q0_last - k_start, the offset of the last block, the template
    fold[i, c] = bias(D + i - c), -inf where c > D + i, for i < block, c < D + block, holds block b's
    mask at columns [D - (q_start + q0 - k_start), D + q1 - q0). Its size grows linearly with the
    length, never as (Tq, Tk). A static bias (ALiBi) keeps its template in the model's MaskCache,
    grown geometrically in D, so later forwards take a view of it without computing anything.
    With flex=True FlexAttention runs instead: `flex` is its compiled function and `score_mod` the
    scheme's bias for these offsets (None without a bias): its own score_mod, or in a training forward of a learnable
    bias one that reads score_bias's (H, Tq, Tk) tensor (learnable_score_bias).

    q_start, k_start and end index the sequence; token i sits at position i, unless `positions` (N,), an
    increasing map from index to position (randomized positions: Ruoss et al. 2023), says otherwise. With a
    map, a bias is built from the mapped positions per query block (their differences vary: no template). A
    `window` (AttentionWindow) hides keys outside it as the causal mask hides future ones (per query block too).

    An `extension` (alibi_lm.extension: a training-free method's key mask and distance remap) is applied per query
    block too: a bias scheme takes the remapped distances in its bias, a rotary one (rotary_remap) gets its queries
    and keys unrotated and scores each pair at its piece's rotation on the explicit path.
    """

    def __init__(self, scheme: PositionScheme, masks: MaskCache, q_start: int, k_start: int, end: int, device,
                 query_block: int, flex: bool = False, positions: torch.Tensor | None = None,
                 window: AttentionWindow | None = None, temperature: TemperatureTuning | None = None,
                 extension: ExtensionMethod | None = None):
        self.scheme, self.masks = scheme, masks
        self.extension = extension
        # a rotary scheme under an extension: q and k reach attention unrotated (the model skips rotate())
        self.rotary_remap = extension is not None and scheme_kind(scheme) == "rotary"
        self._remaps: dict = {}  # (first query, queries, keys) -> the block's Remap, for every layer
        self.flex = flex_kernel.flex_attention_fn() if flex else None
        self.has_bias = type(scheme).score_bias is not PositionScheme.score_bias
        self.q_start, self.k_start = q_start, k_start
        self.k_index = torch.arange(k_start, end, device=device)  # (Tk,) indices in the sequence
        self.q_index = self.k_index[q_start - k_start :]  # (Tq,)
        self.k_pos = self.k_index if positions is None else positions.to(device)[k_start:end]  # (Tk,)
        self.q_pos = self.k_pos[q_start - k_start :]  # (Tq,)
        self.score_mod = None
        if flex and torch.is_grad_enabled() and flex_kernel.learnable_score_bias(scheme):
            # (H, Tq, Tk) once; float32, as the kernel's scores are, whatever autocast made of it (FIRE's MLP: bf16)
            self.score_mod = flex_kernel.bias_tensor_score_mod(scheme.score_bias(self.q_pos, self.k_pos).float())
        elif flex:
            self.score_mod = scheme.flex_score_mod(q_start, k_start)
        self.window = window
        self.device = self.q_pos.device
        # (Tq,) the queries' multipliers of evaluation's temperature tuning, or None
        self.query_scale = None if temperature is None else temperature.scale(self.q_pos)
        n_queries = end - q_start
        self.block = min(n_queries, query_block)
        if torch.device(device).type == "cpu" and not torch.is_grad_enabled():
            self.block = min(self.block, max(MIN_BLOCK_ROWS, BLOCK_VALUES // (scheme.n_head * (end - k_start))))
        self.blocks = [(q0, min(q0 + self.block, n_queries)) for q0 in range(0, n_queries, self.block)]
        # the relative template holds rows for a whole last block, which may run past `end`
        template_end = q_start + self.blocks[-1][0] + self.block
        self.relative = window is None and extension is None and (
            not self.has_bias or (positions is None and template_end <= scheme.relative_below()))
        # a bias of absolute positions is built per query block, kept for the forward's other layers while
        # all blocks fit in ABSOLUTE_BIAS_KEPT (else each layer rebuilds them: their total grows as length^2)
        kept = scheme.n_head * sum((q1 - q0) * (q_start + q1 - k_start) for q0, q1 in self.blocks)
        self.keep_absolute = len(self.blocks) == 1 or kept <= ABSOLUTE_BIAS_KEPT
        self._template = None  # (fold, offset D) once built
        self._absolute: dict = {}  # (q0, q1, dtype) -> a block's absolute mask
        self._block_mask = None  # FlexAttention's, once built

    @functools.cached_property
    def log_keys_seen(self) -> torch.Tensor:
        """(Tq,) float32 log n, n the number of keys each query attends (itself and the earlier keys of the forward
        and its cache, within the window if any): Scalable-Softmax's log n, which counts keys, not positions.
        Computed once per forward, for every layer of the scheme."""
        first = torch.full_like(self.q_index, self.k_start)
        if self.window is not None:
            first = self.window.first(self.q_index).clamp(min=self.k_start)
        return torch.log((self.q_index - first + 1).float())

    def mask(self, q0: int, q1: int, dtype):
        """(attn_mask, is_causal) for queries q_pos[q0:q1] against keys k_pos[:q_start + q1 - k_start].

        attn_mask is (1, H, q1 - q0, n_keys) with a bias, (q1 - q0, n_keys) without: 2-D or 4-D, the
        shapes for which CPU SDPA has a fused kernel (it falls back to the unfused math one for 3-D)."""
        offset = self.q_start + q0 - self.k_start  # block's first query minus first key
        if not self.has_bias and offset == 0 and self.window is None and self.extension is None:
            return None, True  # aligned causal square: SDPA's own causal kernel
        if self.relative:
            fold, top = self._relative_template(dtype)
            return fold[..., : q1 - q0, top - offset : top + q1 - q0], False  # (1, H, rows, n_keys) or (rows, n_keys)
        mask = self._absolute.get((q0, q1, dtype))
        if mask is None:
            keys = slice(0, offset + q1 - q0)
            mask = self.fold(self.q_pos[q0:q1], self.k_pos[keys], dtype, self.q_index[q0:q1], self.k_index[keys])
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

    def remap(self, q_pos, k_pos) -> Remap:
        """The extension's Remap of these queries against these keys, computed once for all layers."""
        key = (int(q_pos[0]), len(q_pos), len(k_pos))
        if key not in self._remaps:
            self._remaps[key] = self.extension.remap(q_pos, k_pos)
        return self._remaps[key]

    def fold(self, q_pos, k_pos, dtype, q_index=None, k_index=None):
        """The scheme's bias with -inf on future keys (and, with a window, on keys outside it: by the indices
        q_index, k_index of these queries and keys; with an extension, on the keys it hides, and the bias of its
        remapped distances): (1, H, tq, tk), or (tq, tk) without a bias."""
        future = k_pos[None, :] > q_pos[:, None]  # (tq, tk)
        if self.window is not None:
            future |= self.window.outside(q_index, k_index)
        if self.extension is not None:
            return self._extended_fold(q_pos, k_pos, dtype, future)
        bias = self.scheme.score_bias(q_pos, k_pos) if self.has_bias else None  # (H, tq, tk)
        if bias is None:
            return torch.zeros_like(future, dtype=dtype).masked_fill(future, float("-inf"))  # (tq, tk)
        return bias.masked_fill(future[None], float("-inf")).to(dtype)[None]  # (1, H, tq, tk)

    def _extended_fold(self, q_pos, k_pos, dtype, hidden):
        remap = self.remap(q_pos, k_pos)
        if remap.visible is not None:
            hidden = hidden | ~remap.visible
        if not self.has_bias:  # NoPE's mask, or a rotary scheme's (its distances are in its scores)
            return torch.zeros_like(hidden, dtype=dtype).masked_fill(hidden, float("-inf"))  # (tq, tk)
        bias = self.scheme.distance_bias(q_pos, remap.distance())  # (H, tq, tk)
        return bias.masked_fill(hidden[None], float("-inf")).to(dtype)[None]  # (1, H, tq, tk)

    def flex_block_mask(self, n_queries: int, n_keys: int):
        if self._block_mask is None:  # once per forward, for every layer (dynamo traces through lru_cache)
            self._block_mask = flex_kernel.causal_block_mask(n_queries, n_keys, self.q_start - self.k_start, self.device)
        return self._block_mask
