"""Attention over explicit positions: what the model's layers share in one forward, and the kernels.

An AttentionContext (one per forward and scheme: layers may use different ones) holds the query and key
positions, the query blocks, and the scheme's score bias folded with the causal mask (and a window's hidden
keys); MaskCache keeps a static relative bias's fold across forwards. attend() runs one layer's attention
through SDPA (query block by query block), FlexAttention (CUDA), or the explicit path (the diagnostic that
returns the probabilities, and a content-aware scheme without a flex score_mod, query block by query block);
explain_backend() picks between them and says why; FlexAttention's block sizes follow the device's shared memory
(flex_block_ladder), and its gradients are probed against the explicit path before training uses it
(flex_gradient_loss).
Positions are never derived from tensor shapes.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .errors import ConfigError
from .extension import ExtensionMethod, Remap, remapped_scores, scheme_kind
from .positions import PositionScheme, ScoreBlock

ATTENTION = ("auto", "sdpa", "flex")

# Inductor's FlexAttention kernel on CUDA refuses heads narrower than this ("NYI: embedding dimension of the
# query, key, and value must be at least 16"); the CPU kernel takes any width
FLEX_MIN_HEAD_DIM = 16
# (scheme name, device type, head width) -> why FlexAttention's kernel could not be built for it (a Triton kernel
# that needs more shared memory than the GPU has): its layers use SDPA from then on, in this process
FLEX_FAILED: dict[tuple[str, str, int], str] = {}
# what a kernel that does not fit the GPU's resources says; any other compile error is a bug and is raised
RESOURCE_FAILURES = ("out of resource", "No valid triton configs")
# FlexAttention's Triton block sizes, largest first: forward BLOCK_M, BLOCK_N; backward BLOCK_M1, BLOCK_N1, BLOCK_M2,
# BLOCK_N2; pipeline stages. After torch's own choice, a CUDA device tries those whose estimate (flex_block_bytes) fits
# its shared memory, one after another while a kernel does not fit (T5's on an H200). Each divides the block mask's 128
# and keeps the backward's BLOCK_N1 % BLOCK_M1 == 0 and BLOCK_M2 % BLOCK_N2 == 0, which its kernel asserts.
FLEX_BLOCKS = ((128, 64, 32, 64, 64, 32, 3), (64, 64, 32, 64, 64, 32, 2), (64, 32, 16, 32, 32, 16, 2),
               (32, 32, 16, 16, 16, 16, 1), (16, 16, 16, 16, 16, 16, 1))
# (scheme name, device type, head width) -> the step of its device's block-size ladder (flex_block_ladder) in use,
# once a kernel did not fit at an earlier one
FLEX_LEVEL: dict[tuple[str, str, int], int] = {}
FLEX_OPTIONS: dict[tuple[str, str, int], dict | None] = {}  # the kernel_options that last built, for compiled graphs
# (scheme name, device type, head width) -> why FlexAttention's backward did not give the gradients the explicit path
# gives (flex_gradient_loss): its layers train with SDPA from then on, in this process; evaluation keeps FlexAttention
FLEX_LOST_GRADIENTS: dict[tuple[str, str, int], str] = {}
# The gradient probe: one batch of this many tokens (two of the block mask's 128-blocks, the second partial), float32;
# a gradient agrees when |flex - explicit| <= PROBE_RTOL * |explicit| by norm (TF32 and summation order move it by
# ~1e-3 of its norm; a lost one by all of it)
PROBE_TOKENS = 200
PROBE_RTOL = 1e-2

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
        self.flex = flex_attention_fn() if flex else None
        self.has_bias = type(scheme).score_bias is not PositionScheme.score_bias
        self.q_start, self.k_start = q_start, k_start
        self.k_index = torch.arange(k_start, end, device=device)  # (Tk,) indices in the sequence
        self.q_index = self.k_index[q_start - k_start :]  # (Tq,)
        self.k_pos = self.k_index if positions is None else positions.to(device)[k_start:end]  # (Tk,)
        self.q_pos = self.k_pos[q_start - k_start :]  # (Tq,)
        self.score_mod = None
        if flex and torch.is_grad_enabled() and learnable_score_bias(scheme):
            # (H, Tq, Tk) once; float32, as the kernel's scores are, whatever autocast made of it (FIRE's MLP: bf16)
            self.score_mod = bias_tensor_score_mod(scheme.score_bias(self.q_pos, self.k_pos).float())
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
            self._block_mask = causal_block_mask(n_queries, n_keys, self.q_start - self.k_start, self.device)
        return self._block_mask


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


def learnable_score_bias(scheme: PositionScheme) -> bool:
    """Whether a training forward of `scheme` reads its bias from a tensor built once per forward (bias_tensor_score_mod)
    rather than from its own score_mod: a score bias with learnable tensors (T5's buckets, KERPLE's and learned ALiBi
    slopes' per-head scalars, FIRE's MLP), not content-aware. FlexAttention's backward sums a captured tensor's
    gradient with one atomic add per (batch, head, query, key) (pytorch#137452): into a few values per head they
    contend, the likely cause of what an H200 measured (model=paper, L = 1024: T5 0.09x, KERPLE 0.04x of NoPE's
    tokens/s, fixed ALiBi 1.04x); into an (H, Tq, Tk) tensor each value takes B of them."""
    kind = type(scheme)
    return (not kind.content_aware and kind.score_bias is not PositionScheme.score_bias
            and any(p.requires_grad for p in scheme.parameters()))


BIAS_TENSOR_WHY = "FlexAttention reading its learnable bias from one (H, T, T) tensor per forward (not by atomic adds per pair)"


def bias_tensor_score_mod(bias: torch.Tensor):
    """A score_mod that adds bias (H, Tq, Tk), indexed by the call's own query and key indices: its gradient flows to
    the scheme's tensors through the autograd graph that built `bias`, outside the kernel."""

    def bias_tensor(score, b, h, q_idx, kv_idx):
        return score + bias[h, q_idx, kv_idx]

    return bias_tensor


@functools.cache
def flex_attention_fn():
    """flex_attention under torch.compile: fused kernels (eager flex would materialise the scores)."""
    import torch._dynamo
    from torch.nn.attention.flex_attention import flex_attention

    # every scheme's score_mod and each grad mode is its own graph: more than the default 8
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    return torch.compile(flex_attention, dynamic=False)


def choose_backend(mode: str, scheme: PositionScheme, device, dropout: float, incremental: bool = False,
                   head_dim: int | None = None) -> str:
    """"flex" or "sdpa" for model.attention=`mode` (auto | sdpa | flex) on `device`, with attention dropout
    `dropout` (0 in evaluation): explain_backend's path ("explicit", a content-aware scheme's unfused path, is
    "sdpa" here: attend() takes it for such a scheme)."""
    return "flex" if explain_backend(mode, scheme, device, dropout, incremental, head_dim)[0] == "flex" else "sdpa"


def explain_backend(mode: str, scheme: PositionScheme, device, dropout: float, incremental: bool = False,
                    head_dim: int | None = None) -> tuple[str, str]:
    """(path, why): the attention a forward of `scheme`'s layers runs, flex | sdpa | explicit (a content-aware
    scheme unfused), and the reason in a few words. auto picks FlexAttention on CUDA when torch has it, the scheme
    has a score_mod (flex_score_mod, or flex_state_score_mod over a content-aware scheme's prepared state), there is
    no attention dropout (FlexAttention has none), the heads are at least FLEX_MIN_HEAD_DIM wide, its kernel has not
    failed to fit this device, and, in training, the probe found the kernel's gradients (a learnable bias read from
    one tensor per forward: learnable_score_bias) equal to the explicit path's (flex_gradient_loss). KV-cache steps
    and return_attention (incremental), a window, a position map, model.ssmax and an extension build masks per query
    block: SDPA / the explicit path."""
    kind = type(scheme)
    unfused = "explicit" if kind.content_aware else "sdpa"
    if mode == "sdpa":
        return unfused, "model.attention=sdpa"
    if incremental:
        return unfused, "masks built per query block (a KV-cache step, a window, a position map, model.ssmax or an extension)"
    missing = missing_flex_path(kind)
    on_cuda = torch.device(device).type == "cuda"
    narrow = on_cuda and head_dim is not None and head_dim < FLEX_MIN_HEAD_DIM
    key = (kind.name, torch.device(device).type, head_dim)
    training = torch.is_grad_enabled()
    if mode == "flex":
        check_explicit_flex(kind, missing, dropout, on_cuda, head_dim if narrow else None)
    elif missing or not on_cuda or dropout > 0 or narrow:
        return unfused, (missing or (f"attention dropout {dropout:g} (FlexAttention has none)" if dropout > 0 else None)
                         or ("FlexAttention on CUDA only (CPU: SDPA's fused kernel; torch has no CPU flex backward)"
                             if not on_cuda else f"heads {head_dim} wide, under FlexAttention's {FLEX_MIN_HEAD_DIM} on CUDA"))
    lost = training and key not in FLEX_FAILED and flex_gradient_loss(scheme, device, head_dim)
    if key in FLEX_FAILED:  # also where the probe's backward found no block size that fits
        return unfused, f"FlexAttention's kernel did not fit this device: {FLEX_FAILED[key]}"
    if lost:
        return unfused, f"FlexAttention lost gradients: {lost}"
    if mode == "flex":
        return "flex", "model.attention=flex"
    if training and learnable_score_bias(scheme):
        return "flex", BIAS_TENSOR_WHY
    return "flex", "FlexAttention with the scheme's score_mod"


def missing_flex_path(kind: type[PositionScheme]) -> str | None:
    """Why the scheme can have no FlexAttention path (torch too old, no score_mod), or None."""
    if not flex_available():
        return "FlexAttention needs torch >= 2.7"
    if kind.content_aware and kind.flex_state_score_mod is PositionScheme.flex_state_score_mod:
        return "its bias depends on the content of each (query, key) pair, beyond per-token state (no score_mod)"
    if kind.score_bias is not PositionScheme.score_bias and kind.flex_score_mod is PositionScheme.flex_score_mod:
        return "its score bias has no flex_score_mod"
    return None


def check_explicit_flex(kind: type[PositionScheme], missing: str | None, dropout: float, on_cuda: bool,
                        narrow_head: int | None):
    """The ConfigError (a ValueError; one line at the command line) for model.attention=flex where FlexAttention
    cannot run."""
    if kind.content_aware and missing is not None and flex_available():
        raise ConfigError(f"model.attention=flex cannot run position={kind.name}: its bias depends on the content of "
                         f"queries and keys (the explicit attention path); use model.attention=auto")
    if missing is not None:
        raise ConfigError(f"model.attention=flex needs torch >= 2.7 (FlexAttention) and a flex_score_mod for "
                         f"position={kind.name}; use model.attention=auto")
    if dropout > 0:
        raise ConfigError("model.attention=flex cannot train with attention dropout (FlexAttention has "
                         "none); set model.attn_dropout=0 or model.attention=auto")
    if not on_cuda and torch.is_grad_enabled():
        raise ConfigError("model.attention=flex on CPU is inference only (torch has no CPU backward for "
                         "FlexAttention): run under torch.no_grad() or use model.attention=auto")
    if narrow_head is not None:
        raise narrow_head_error(narrow_head)


def narrow_head_error(head_dim: int) -> ConfigError:
    return ConfigError(f"model.attention=flex on CUDA needs heads at least {FLEX_MIN_HEAD_DIM} wide (d_model / n_head = "
                       f"{head_dim} here); use model.attention=auto, or fewer heads")


def flex_compile_errors() -> tuple[type[BaseException], ...]:
    """What torch raises when torch.compile cannot build FlexAttention's kernel (their home moved across
    versions)."""
    errors = []
    for module, name in (("torch._dynamo.exc", "BackendCompilerFailed"), ("torch._inductor.exc", "InductorError")):
        try:
            errors.append(getattr(__import__(module, fromlist=[name]), name))
        except (ImportError, AttributeError):
            pass
    return tuple(errors)


def shared_memory(device) -> int | None:
    """Bytes of shared memory one thread block may use on `device` (CUDA's opt-in maximum), or None (CPU)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", None)


def flex_block_bytes(block: tuple, head_dim: int, value_bytes: int = 4) -> int:
    """An estimate of the shared memory FlexAttention's kernels stage at these FLEX_BLOCKS sizes: the forward holds a
    query block and `stages` key and value blocks, the backward two query-side and `stages` key-side blocks (and the
    mirror), each head_dim wide; float32 by default (bf16 needs half). An estimate from the kernels' loads, which the
    fallback in flex_or_none backs up, not a measurement."""
    bm, bn, m1, n1, m2, n2, stages = block
    rows = max(bm + 2 * stages * bn, 2 * n1 + 2 * stages * m1, 2 * m2 + 2 * stages * n2)
    return rows * head_dim * value_bytes


def flex_block_ladder(shared: int | None, head_dim: int) -> list[dict | None]:
    """The kernel_options a device tries, in order, while a kernel does not fit: torch's own choice (None) first,
    then each of FLEX_BLOCKS whose estimate fits `shared` bytes per block (None, the CPU: torch's choice only).
    Empty where not even the smallest fits: the scheme then uses SDPA."""
    if shared is None:
        return [None]
    fitting = [block for block in FLEX_BLOCKS if flex_block_bytes(block, head_dim) <= shared]
    if not fitting:
        return []
    names = ("BLOCK_M", "BLOCK_N", "BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2", "num_stages")
    return [None] + [dict(zip(names, block)) for block in fitting]


def resource_failure(e: BaseException) -> str:
    """The first line of a compile error that says the kernel does not fit the device (RESOURCE_FAILURES); any other
    error is raised."""
    cause = getattr(e, "inner_exception", None) or e  # BackendCompilerFailed's first line names only the backend
    text = f"{type(cause).__name__}: {cause}"
    if not any(marker in text for marker in RESOURCE_FAILURES):
        raise e
    return next(line.strip() for line in text.splitlines() if line.strip())[:200]


def flex_or_none(q, k, v, ctx: AttentionContext, score_mod=None):
    """FlexAttention's output (B, H, Tq, Dh) with `score_mod`, or None where its kernel does not fit the GPU
    (RESOURCE_FAILURES) at any step of the device's block-size ladder (flex_block_ladder): each failure moves the
    scheme one step down (FLEX_LEVEL), and past the last one it is recorded in FLEX_FAILED, with one warning, so
    that this forward's remaining layers and every later forward use SDPA (the same attention, unfused) instead of
    stopping the run. This covers the kernels built in a forward; in training the backward kernel is built by the
    gradient probe (flex_gradient_loss) first, at the same block sizes. Any other compile error is raised."""
    block_mask = ctx.flex_block_mask(q.shape[2], k.shape[2])
    key = (type(ctx.scheme).name, q.device.type, q.shape[-1])
    if torch.compiler.is_compiling():  # inside train.compile's graph: the sizes an eager call settled (a dict lookup)
        return ctx.flex(q, k, v, score_mod=score_mod, block_mask=block_mask, kernel_options=FLEX_OPTIONS.get(key))
    shared = shared_memory(q.device)
    ladder = flex_block_ladder(shared, q.shape[-1])
    why = f"needs more than the {shared} bytes of shared memory per block at the smallest block sizes"
    while FLEX_LEVEL.get(key, 0) < len(ladder):
        try:
            options = ladder[FLEX_LEVEL.get(key, 0)]
            out = ctx.flex(q, k, v, score_mod=score_mod, block_mask=block_mask, kernel_options=options)
            FLEX_OPTIONS[key] = options
            return out
        except flex_compile_errors() as e:
            why = resource_failure(e)
            FLEX_LEVEL[key] = FLEX_LEVEL.get(key, 0) + 1
    FLEX_LEVEL.pop(key, None)
    FLEX_FAILED[key] = why
    warnings.warn(f"FlexAttention's kernel does not fit this {q.device.type} device for position={key[0]} ({why}); "
                  f"its layers use SDPA from now on", RuntimeWarning, stacklevel=2)
    ctx.flex = None
    return None


def flex_gradient_loss(scheme: PositionScheme, device, head_dim: int | None) -> str | None:
    """Why FlexAttention would lose or change the gradients of a training forward of `scheme` on `device`, or None
    (also where there is nothing to probe: no CUDA device here, or no learnable tensor in the scheme). The probe runs
    once per scheme, device type and head width in a process (FLEX_LOST_GRADIENTS keeps a failure; one warning):
    one random float32 batch of PROBE_TOKENS tokens through attend() with FlexAttention's compiled kernel, forward and
    backward, as a training forward runs it, against the explicit path (score_bias / content_bias), for the
    gradients into q, k and every learnable tensor of the scheme. A gradient that is missing, zero where the explicit
    path's is not, or off by more than PROBE_RTOL of its norm is lost (pytorch#162228: gradients into a score_mod's
    captured tensors can be dropped silently)."""
    key = (type(scheme).name, torch.device(device).type, head_dim)
    if key in FLEX_LOST_GRADIENTS:
        return FLEX_LOST_GRADIENTS[key]
    if key in FLEX_PROBED or torch.compiler.is_compiling() or not any(p.requires_grad for p in scheme.parameters()):
        return None
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        return None  # a question about CUDA asked on a machine without it (the CPU tests of the choice)
    FLEX_PROBED.add(key)
    lost = probe_flex_gradients(scheme, device)
    if lost is not None:
        FLEX_LOST_GRADIENTS[key] = lost
        warnings.warn(f"FlexAttention loses gradients of position={key[0]} on this {key[1]} device ({lost}); its layers "
                      f"train with SDPA from now on", RuntimeWarning, stacklevel=2)
    return lost


FLEX_PROBED: set[tuple[str, str, int]] = set()  # the keys flex_gradient_loss has probed in this process


def probe_flex_gradients(scheme: PositionScheme, device) -> str | None:
    """flex_gradient_loss's probe itself (see there): the first gradient that FlexAttention loses, or None. A backward
    kernel that does not fit the device steps down its block sizes as a forward's does (flex_or_none)."""
    gen = torch.Generator().manual_seed(0)
    H, T, Dh = scheme.n_head, PROBE_TOKENS, scheme.head_dim
    q, k, v, weight = (torch.randn(1, H, T, Dh, generator=gen).to(device) for _ in range(4))  # (1, H, T, Dh)
    x = torch.randn(1, T, scheme.d_model, generator=gen).to(device)  # a layer's input, for prepare()
    names, params = zip(*[(n, p) for n, p in scheme.named_parameters() if p.requires_grad])
    key = (type(scheme).name, torch.device(device).type, Dh)

    def gradients(flex: bool):
        leaves = [q.clone().requires_grad_(), k.clone().requires_grad_()]
        ctx = AttentionContext(scheme, MaskCache(), 0, 0, T, device, T, flex=flex)
        state = scheme.prepare(x, 0, None) if scheme.content_aware else None
        out = (attend(*leaves, v, ctx, 0.0, None, 0, state) if flex
               else attend_explicitly(*leaves, v, ctx, 0.0, 0, state))  # (1, H, T, Dh)
        return torch.autograd.grad((out * weight).sum(), leaves + list(params), allow_unused=True)

    with torch.enable_grad(), torch.autocast(torch.device(device).type, enabled=False):
        want = gradients(False)
        while True:
            try:
                got = gradients(True)
                break
            except flex_compile_errors() as e:  # the backward kernel does not fit at these block sizes
                why = resource_failure(e)
                FLEX_LEVEL[key] = FLEX_LEVEL.get(key, 0) + 1
                if FLEX_LEVEL[key] >= len(flex_block_ladder(shared_memory(device), Dh)):
                    FLEX_LEVEL.pop(key)
                    FLEX_FAILED[key] = why
                    warnings.warn(f"FlexAttention's backward kernel does not fit this {key[1]} device for position="
                                  f"{key[0]} ({why}); its layers use SDPA from now on", RuntimeWarning, stacklevel=3)
                    return None
    # a gradient under 1e-5 of q's is float32 rounding of a true zero (FIRE's output bias: softmax ignores a shift)
    floor = 1e-5 * float(want[0].norm())
    for name, g, w in zip(("q", "k") + names, got, want):
        want_norm = 0.0 if w is None else float(w.norm())
        if want_norm <= floor:
            continue
        if g is None or float(g.norm()) == 0:
            return f"no gradient into {name}"
        error = float((g - w).norm())
        if not error <= PROBE_RTOL * want_norm:
            return f"the gradient into {name} is off by {error / want_norm:.2g} of its norm"
    return None


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
        if (out := flex_or_none(q, k, v, ctx, score_mod)) is not None:
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
