"""Which attention a forward of a scheme runs (explain_backend: flex | sdpa | explicit, and why), the refusals of
model.attention=flex where it cannot run, and the gradient probe that checks FlexAttention's backward against the
explicit path before training uses it (flex_gradient_loss)."""

from __future__ import annotations

import warnings

import torch

from ..errors import ConfigError
from ..positions import PositionScheme
from . import flex_kernel
from .context import AttentionContext, MaskCache
from .flex_kernel import FLEX_MIN_HEAD_DIM
from .kernels import attend, attend_explicitly

ATTENTION = ("auto", "sdpa", "flex")  # model.attention
BIAS_TENSOR_WHY = "FlexAttention reading its learnable bias from one (H, T, T) tensor per forward (not by atomic adds per pair)"

# (scheme name, device type, head width) -> why FlexAttention's backward did not give the gradients the explicit path
# gives (flex_gradient_loss): its layers train with SDPA from then on, in this process; evaluation keeps FlexAttention
FLEX_LOST_GRADIENTS: dict[tuple[str, str, int], str] = {}
# The gradient probe: one batch of this many tokens (two of the block mask's 128-blocks, the second partial), float32;
# a gradient agrees when |flex - explicit| <= PROBE_RTOL * |explicit| by norm (TF32 and summation order move it by
# ~1e-3 of its norm; a lost one by all of it)
PROBE_TOKENS = 200
PROBE_RTOL = 1e-2


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
    block: SDPA / the explicit path. model.attention=flex is refused in one line where FlexAttention cannot run, or
    would not run right (check_explicit_flex; on CPU, heads under FLEX_CPU_MIN_HEAD_DIM wide)."""
    kind = type(scheme)
    unfused = "explicit" if kind.content_aware else "sdpa"
    if mode == "sdpa":
        return unfused, "model.attention=sdpa"
    if incremental:
        return unfused, "masks built per query block (a KV-cache step, a window, a position map, model.ssmax or an extension)"
    missing = missing_flex_path(kind)
    on_cuda = torch.device(device).type == "cuda"
    narrow = head_dim is not None and head_dim < flex_kernel.flex_min_head_dim(device)  # auto on CPU: SDPA anyway
    key = (kind.name, torch.device(device).type, head_dim)
    training = torch.is_grad_enabled()
    if mode == "flex":
        check_explicit_flex(kind, missing, dropout, device, head_dim if narrow else None)
    elif missing or not on_cuda or dropout > 0 or narrow:
        return unfused, (missing or (f"attention dropout {dropout:g} (FlexAttention has none)" if dropout > 0 else None)
                         or ("FlexAttention on CUDA only (CPU: SDPA's fused kernel; torch has no CPU flex backward)"
                             if not on_cuda else f"heads {head_dim} wide, under FlexAttention's {FLEX_MIN_HEAD_DIM} on CUDA"))
    lost = training and key not in flex_kernel.FLEX_FAILED and flex_gradient_loss(scheme, device, head_dim)
    if key in flex_kernel.FLEX_FAILED:  # also where the probe's backward found no block size that fits
        return unfused, f"FlexAttention's kernel did not fit this device: {flex_kernel.FLEX_FAILED[key]}"
    if lost:
        return unfused, f"FlexAttention lost gradients: {lost}"
    if mode == "flex":
        return "flex", "model.attention=flex"
    if training and flex_kernel.learnable_score_bias(scheme):
        return "flex", BIAS_TENSOR_WHY
    return "flex", "FlexAttention with the scheme's score_mod"


def missing_flex_path(kind: type[PositionScheme]) -> str | None:
    """Why the scheme can have no FlexAttention path (torch too old, no score_mod), or None."""
    if not flex_kernel.flex_available():
        return "FlexAttention needs torch >= 2.7"
    if kind.content_aware and kind.flex_state_score_mod is PositionScheme.flex_state_score_mod:
        return "its bias depends on the content of each (query, key) pair, beyond per-token state (no score_mod)"
    if kind.score_bias is not PositionScheme.score_bias and kind.flex_score_mod is PositionScheme.flex_score_mod:
        return "its score bias has no flex_score_mod"
    return None


def check_explicit_flex(kind: type[PositionScheme], missing: str | None, dropout: float, device,
                        narrow_head: int | None):
    """The ConfigError (a ValueError; one line at the command line) for model.attention=flex where FlexAttention
    cannot run, or not right (heads `narrow_head` wide, under flex_min_head_dim's for `device`)."""
    on_cuda = torch.device(device).type == "cuda"
    if kind.content_aware and missing is not None and flex_kernel.flex_available():
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
        raise narrow_head_error(narrow_head, device)


def narrow_head_error(head_dim: int, device) -> ConfigError:
    """model.attention=flex refused for heads `head_dim` wide, under flex_min_head_dim's for `device`: CUDA's kernel
    refuses them, the CPU's computes them wrong on some CPUs (FLEX_CPU_MIN_HEAD_DIM)."""
    least = flex_kernel.flex_min_head_dim(device)
    if torch.device(device).type == "cuda":
        where, why, fix = "CUDA", "", "model.attention=auto, or fewer heads"
    else:
        where, why = "CPU", ": torch's CPU kernel gives wrong outputs for narrower heads on some CPUs"
        fix = f"model.attention=sdpa, or d_model / n_head >= {least}"
    return ConfigError(f"model.attention=flex on {where} needs heads at least {least} wide (d_model / n_head = "
                       f"{head_dim} here){why}; use {fix}")


def flex_gradient_loss(scheme: PositionScheme, device, head_dim: int | None) -> str | None:
    """Why FlexAttention would lose or change the gradients of a training forward of `scheme` on `device`, or None
    (also where there is nothing to probe: no CUDA device here, or no learnable tensor in the scheme). The probe runs
    once per scheme, device type, head width and autocast dtype in a process (FLEX_LOST_GRADIENTS keeps a failure;
    one warning): one random float32 batch of PROBE_TOKENS tokens through attend() with FlexAttention's compiled
    kernel, forward and backward, as a training forward runs it, against the explicit path (score_bias /
    content_bias), for the gradients into q, k and every learnable tensor of the scheme. A gradient that is missing,
    zero where the explicit path's is not, or off by more than PROBE_RTOL of its norm is lost (pytorch#162228:
    gradients into a score_mod's captured tensors can be dropped silently)."""
    key = (type(scheme).name, torch.device(device).type, head_dim)
    if key in FLEX_LOST_GRADIENTS:
        return FLEX_LOST_GRADIENTS[key]
    probed = key + (str(autocast_in_effect(key[1])),)  # a bf16 training builds kernels a float32 one did not
    if probed in FLEX_PROBED or torch.compiler.is_compiling() or not any(p.requires_grad for p in scheme.parameters()):
        return None
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        return None  # a question about CUDA asked on a machine without it (the CPU tests of the choice)
    FLEX_PROBED.add(probed)
    lost = probe_flex_gradients(scheme, device)
    if lost is not None:
        FLEX_LOST_GRADIENTS[key] = lost
        warnings.warn(f"FlexAttention loses gradients of position={key[0]} on this {key[1]} device ({lost}); its layers "
                      f"train with SDPA from now on", RuntimeWarning, stacklevel=2)
    return lost


# (scheme name, device type, head width, autocast dtype or "None"): what flex_gradient_loss has probed in this process
FLEX_PROBED: set[tuple[str, str, int | None, str]] = set()


def probe_flex_gradients(scheme: PositionScheme, device) -> str | None:
    """flex_gradient_loss's probe itself (see there): the first gradient that FlexAttention loses, or None. A backward
    kernel that does not fit the device steps down its block sizes as a forward's does (flex_or_none). The gradients
    are compared in float32; where the caller runs under autocast (training at bf16), the kernels are then built
    once more from inputs of autocast's dtype, as that training builds them: Triton picks larger blocks for 16-bit
    inputs, which may not fit where float32's did (an H200 at model=paper: T5's, KERPLE's and FIRE's bias-tensor
    backward). Training in float32 builds only float32's."""
    gen = torch.Generator().manual_seed(0)
    H, T, Dh = scheme.n_head, PROBE_TOKENS, scheme.head_dim
    q, k, v, weight = (torch.randn(1, H, T, Dh, generator=gen).to(device) for _ in range(4))  # (1, H, T, Dh)
    x = torch.randn(1, T, scheme.d_model, generator=gen).to(device)  # a layer's input, for prepare()
    names, params = zip(*[(n, p) for n, p in scheme.named_parameters() if p.requires_grad])
    key = (type(scheme).name, torch.device(device).type, Dh)

    def gradients(flex: bool, dtype=torch.float32):
        leaves = [q.to(dtype).requires_grad_(), k.to(dtype).requires_grad_()]
        ctx = AttentionContext(scheme, MaskCache(), 0, 0, T, device, T, flex=flex)
        state = scheme.prepare(x, 0, None) if scheme.content_aware else None
        out = (attend(*leaves, v.to(dtype), ctx, 0.0, None, 0, state) if flex
               else attend_explicitly(*leaves, v, ctx, 0.0, 0, state))  # (1, H, T, Dh)
        return torch.autograd.grad((out * weight.to(dtype)).sum(), leaves + list(params), allow_unused=True)

    device_type = torch.device(device).type
    training_dtype = autocast_in_effect(device_type)  # read before the float32 pass turns autocast off
    with torch.enable_grad(), torch.autocast(device_type, enabled=False):
        want = gradients(False)
        got = on_block_ladder(lambda: gradients(True), key, device)
    built = got is not None
    if built and training_dtype is not None:
        with torch.enable_grad(), torch.autocast(device_type, dtype=training_dtype):
            built = on_block_ladder(lambda: gradients(True, training_dtype), key, device) is not None
    if not built:
        return None  # no block size fits: FLEX_FAILED has it, and its layers use SDPA
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


def autocast_in_effect(device_type: str) -> torch.dtype | None:
    """The dtype forwards on `device_type` autocast to where the caller is, or None (float32: no autocast)."""
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


def on_block_ladder(gradients, key: tuple[str, str, int], device):
    """gradients() through FlexAttention at the block sizes of the scheme's step of the device's ladder, stepping down
    while its backward kernel does not fit (FLEX_LEVEL); None past the last step, which FLEX_FAILED then records, with
    one warning."""
    while True:
        try:
            return gradients()
        except flex_kernel.flex_compile_errors() as e:  # the backward kernel does not fit at these block sizes
            why = flex_kernel.resource_failure(e)
            flex_kernel.FLEX_LEVEL[key] = flex_kernel.FLEX_LEVEL.get(key, 0) + 1
            if flex_kernel.FLEX_LEVEL[key] >= len(flex_kernel.flex_block_ladder(flex_kernel.shared_memory(device), key[2])):
                flex_kernel.FLEX_LEVEL.pop(key)
                flex_kernel.FLEX_FAILED[key] = why
                warnings.warn(f"FlexAttention's backward kernel does not fit this {key[1]} device for position="
                              f"{key[0]} ({why}); its layers use SDPA from now on", RuntimeWarning, stacklevel=4)
                return None
