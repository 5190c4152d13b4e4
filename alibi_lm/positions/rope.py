"""Rotary position embedding (Su et al., 2021) on queries and keys: theta_i = base^(-2i/Dh).
Defined for any position: the cos/sin table grows geometrically as longer inputs arrive.

A run trained with rope can be extended past its training length L at evaluation time
(position.scaling, set_scaling()). linear, dynamic and yarn are Hugging Face transformers'
modeling_rope_utils.py's; ntk is the NTK-aware base change those build on (transformers has no static
variant: its dynamic one with factor 1 at the length n = s L is this), with s the scale factor and d = Dh:

    linear   position interpolation (Chen et al., 2023): theta_i / s
    ntk      NTK-aware: base -> base * s^(d / (d - 2))
    dynamic  dynamic NTK: base -> base * (s * n / L - (s - 1))^(d / (d - 2)) at the current length
             n = the largest position + 1 (n >= L); as in transformers, n only grows until a forward
             ends below L, which restores the trained frequencies
    yarn     YaRN (Peng et al., 2023): pair i keeps theta_i when it turns more than beta_fast = 32 times
             over L, takes theta_i / s when it turns less than beta_slow = 1 time, and a linear ramp
             in between; cos and sin are multiplied by the attention factor 0.1 ln(s) + 1
    llama3   Llama 3.1's banded scaling (transformers' "llama3" rope type): wavelengths 2 pi / theta_i
             shorter than L / high_freq_factor (4) keep theta_i, longer than L / low_freq_factor (1) take
             theta_i / s, and in between a smooth mix with weight (L / wavelength - 1) / (4 - 1)

This module owns the extension's settings for every caller (the evaluate app's position.* config, the
evaluation, the Hugging Face adapter's refusal, the report's line styles): check_scaling() is their one
check, scaling_factor() the factor's default, scaling_label() the rows' rope_scaling value and
scaling_rank() a label's place among the methods.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import ConfigError, check_range
from ..labels import label_number
from .base import PositionOptions, PositionScheme
from .registry import register, scheme_of

ROPE_SCALINGS = ("linear", "ntk", "dynamic", "yarn", "llama3")
YARN_BETA_FAST, YARN_BETA_SLOW = 32, 1
LLAMA3_LOW_FREQ_FACTOR, LLAMA3_HIGH_FREQ_FACTOR = 1.0, 4.0  # Llama 3.1's (transformers' rope_scaling defaults)
MAX_SCALING_FACTOR = 1e9  # s: a billion times L is past any evaluation; far larger ones overflow ntk's and dynamic's bases


def check_scaling(method: str | None, factor: float | None = None,
                  factor_key: str = "position.scaling_factor") -> None:
    """The settings of an inference-time extension (position.scaling, position.scaling_factor), or a
    one-line ConfigError (a ValueError): a known method, and a factor >= 1 (None: the default, scaling_factor()).
    factor_key: the key the user set the factor with (extension.factor for extension=yarn and its kin)."""
    if method is None:
        if factor is not None:
            raise ConfigError(f"position.scaling_factor={factor} needs position.scaling (one of {', '.join(ROPE_SCALINGS)})")
        return
    if method not in ROPE_SCALINGS:
        raise ConfigError(f"position.scaling must be one of {', '.join(ROPE_SCALINGS)} (or null), got {method!r}")
    try:
        check_range(factor_key, factor, 1.0, MAX_SCALING_FACTOR)  # inf would write rows of NaN perplexity
    except ConfigError as e:
        raise ConfigError(f"{e}; leave it null to use Lv / L") from None


def scaling_factor(method: str, factor: float | None, train_len: int, eval_len: int) -> float:
    """The factor s at evaluation length eval_len: the one given, else max(1, Lv / L); dynamic's default is 1,
    since dynamic NTK grows its base with the current length itself (b (s n / L - (s - 1))^(d / (d - 2))):
    s = Lv / L on top would count the length twice."""
    if factor is not None:
        return float(factor)
    return 1.0 if method == "dynamic" else max(1.0, eval_len / train_len)


def scaling_label(method: str | None, factor: float | None) -> str:
    """The rows' rope_scaling value: '' without an extension, 'yarn', or 'yarn-x4' with a given factor."""
    if method is None:
        return ""
    return str(method) if factor is None else f"{method}-x{label_number(float(factor))}"


def scaling_rank(label: str) -> int:
    """The place of a label's method ('yarn-x4': yarn) among ROPE_SCALINGS; len(ROPE_SCALINGS) if unknown."""
    method = label.split("-x")[0]
    return ROPE_SCALINGS.index(method) if method in ROPE_SCALINGS else len(ROPE_SCALINGS)


def rope_frequencies(head_dim: int, base: float, scaling: str | None = None, factor: float = 1.0,
                     train_len: int | None = None, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """((Dh/2,) float64 inverse frequencies, attention factor) of RoPE, plain or with an extension.

    train_len is L (transformers' max_position_embeddings / original_max_position_embeddings) and
    seq_len the current length n, used by dynamic only."""
    if scaling in ("ntk", "dynamic"):
        n = max(seq_len or train_len, train_len)
        ratio = factor if scaling == "ntk" else factor * n / train_len - (factor - 1)
        base = base * ratio ** (head_dim / (head_dim - 2))
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (Dh/2,)
    if scaling == "linear":
        return inv_freq / factor, 1.0
    if scaling == "yarn":

        def pair_turning(rotations):  # the (fractional) pair index that turns `rotations` times over L
            return head_dim * math.log(train_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low = max(math.floor(pair_turning(YARN_BETA_FAST)), 0)
        high = min(math.ceil(pair_turning(YARN_BETA_SLOW)), head_dim - 1)
        if low == high:
            high += 0.001  # transformers' guard against a zero-width ramp
        ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        inv_freq = inv_freq / factor * ramp + inv_freq * (1 - ramp)  # 0: extrapolate (keep), 1: interpolate
        return inv_freq, (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)
    if scaling == "llama3":
        return llama3_frequencies(inv_freq, factor, train_len), 1.0
    return inv_freq, 1.0


def llama3_frequencies(inv_freq: torch.Tensor, factor: float, train_len: int) -> torch.Tensor:
    """(Dh/2,) Llama 3.1's banded position interpolation of inv_freq for a model trained at train_len."""
    low, high = LLAMA3_LOW_FREQ_FACTOR, LLAMA3_HIGH_FREQ_FACTOR
    wavelength = 2 * math.pi / inv_freq  # (Dh/2,)
    interpolated = torch.where(wavelength > train_len / low, inv_freq / factor, inv_freq)  # long waves: / s
    smooth = (train_len / wavelength - low) / (high - low)  # 0 at L / low, 1 at L / high
    mixed = (1 - smooth) * interpolated / factor + smooth * interpolated
    medium = (wavelength >= train_len / high) & (wavelength <= train_len / low)
    return torch.where(medium, mixed, interpolated)


@dataclass
class RopeOptions(PositionOptions):
    labeled = ("fraction",)  # a variant with rows of its own: PositionOptions.label
    base: float = 10000.0  # theta_i = base^(-2i/Dh)
    # p-RoPE (Barbero et al., ICLR 2025): only the fraction p of pairs with the highest frequencies rotates; the
    # others keep theta = 0 (position-free channels). Not GPT-NeoX's partial rotary, which re-spaces the
    # frequencies over the rotated dimensions: here each rotated pair keeps its theta_i.
    fraction: float = 1.0

    def __post_init__(self):
        check_range("position.base", self.base, low=1, low_open=True)  # theta_i falls with i only for a base > 1
        if not 0 < self.fraction <= 1:
            raise ConfigError(f"position.fraction must be in (0, 1], got {self.fraction}")

    def check(self, n_head: int, d_model: int, seq_len: int | None = None) -> None:
        if (d_model // n_head) % 2:  # dimensions are rotated in pairs
            raise ConfigError(f"{scheme_of(self)} needs an even head dimension, got d_model/n_head = {d_model // n_head}; "
                              f"change model.d_model or model.n_head")


@register("rope")
class RotaryEmbedding(PositionScheme):
    Options = RopeOptions
    shift_invariant = True

    def __init__(self, n_head: int, d_model: int, options: RopeOptions | None = None):
        super().__init__(n_head, d_model, options)
        self.base = float(self.options.base)
        self.scaling, self.scaling_factor, self.train_len = None, 1.0, None
        self.attention_factor = 1.0
        self._dynamic_len = None  # dynamic: the length n the frequencies are computed for
        self.rotated_pairs = round(self.options.fraction * self.head_dim / 2)  # the highest-frequency pairs
        self.register_buffer("inv_freq", self.frequencies()[0], persistent=False)  # (Dh/2,)
        self._cos_full = self._sin_signed = None  # built on the first check_positions(), on inv_freq's device

    def set_scaling(self, method: str | None, factor: float, train_len: int) -> None:
        """Extend a trained model past its training length train_len (module docstring); None restores it."""
        check_scaling(method, None if method is None else float(factor))  # None: the trained frequencies
        if method in ("ntk", "dynamic") and self.head_dim <= 2:
            raise ValueError(f"position.scaling={method} needs a head dimension > 2, got {self.head_dim}")
        self.scaling, self.scaling_factor, self.train_len = method, float(factor), int(train_len)
        self._dynamic_len = self.train_len
        self._set_frequencies(seq_len=None)

    def frequencies(self, seq_len=None) -> tuple[torch.Tensor, float]:
        """(Dh/2,) inverse frequencies with the extension (if any) and p-RoPE's unrotated pairs at 0; the attention factor."""
        inv_freq, factor = rope_frequencies(self.head_dim, self.base, self.scaling, self.scaling_factor, self.train_len,
                                            seq_len)
        inv_freq[self.rotated_pairs :] = 0.0  # the lowest frequencies (largest i) stay unrotated
        return inv_freq, factor

    def _set_frequencies(self, seq_len):
        inv_freq, self.attention_factor = self.frequencies(seq_len)
        self.inv_freq = inv_freq.to(self.inv_freq.device)
        self._cos_full = self._sin_signed = None  # rebuilt by the next check_positions()

    def _grow(self, n: int, device) -> None:
        angles = torch.arange(n, dtype=torch.float64, device=device)[:, None] * self.inv_freq.to(device)
        cos, sin = angles.cos(), angles.sin()  # (N, Dh/2); float64 angles keep long positions exact
        # the same values laid out for rotate(): [cos, cos] and [-sin, sin], (N, Dh) each
        a = self.attention_factor  # 1 but for yarn
        self._set_tables(torch.cat((cos, cos), dim=-1) * a, torch.cat((-sin, sin), dim=-1) * a)

    @property
    def table_len(self) -> int:
        """Positions the rotation tables reach (0 before the first check_positions())."""
        return 0 if self._cos_full is None else self._cos_full.shape[-2]

    def _set_tables(self, cos_full, sin_signed) -> None:
        self._cos_full, self._sin_signed = cos_full.float(), sin_signed.float()  # (N, Dh) each

    def check_positions(self, end: int) -> None:
        if self.scaling == "dynamic":  # transformers' dynamic update (module docstring)
            if end > self._dynamic_len:
                self._dynamic_len = end
                self._set_frequencies(seq_len=end)
            elif end < self.train_len < self._dynamic_len:
                self._dynamic_len = self.train_len
                self._set_frequencies(seq_len=None)
        if self._cos_full is None or end > self.table_len or self._cos_full.device != self.inv_freq.device:
            size = max(self.table_len, 256)
            while size < end:
                size *= 2
            self._grow(size, self.inv_freq.device)

    def rotation_at(self, pos, role):
        cos, sin = self.rotation64(pos, role)
        return cos.float(), sin.float()  # (T, Dh) each

    def rotation64(self, pos, role):
        """The tables' float64 rows at any real positions pos (T,): [cos, cos] and [-sin, sin] times the attention
        factor, computed as _grow computes them (role matters to xpos only)."""
        angles = pos.to(torch.float64)[:, None] * self.inv_freq.to(pos.device)  # (T, Dh/2)
        cos, sin, a = angles.cos(), angles.sin(), self.attention_factor
        return torch.cat((cos, cos), dim=-1) * a, torch.cat((-sin, sin), dim=-1) * a  # (T, Dh) each

    def rotate(self, x, pos):
        # x (..., T, Dh); rotate each pair (x_i, x_{i+Dh/2}) by pos * theta_i:
        # (x1 cos - x2 sin, x2 cos + x1 sin) = x * [cos, cos] + [x2, x1] * [-sin, sin], bit for bit
        # (a + (-b) is a - b exactly), in 4 kernels instead of 7
        cos = self._cos_full[pos].to(x.dtype)  # (T, Dh)
        sin = self._sin_signed[pos].to(x.dtype)  # (T, Dh)
        x1, x2 = x.chunk(2, dim=-1)  # (..., T, Dh/2) each
        return x * cos + torch.cat((x2, x1), dim=-1) * sin  # (..., T, Dh)
