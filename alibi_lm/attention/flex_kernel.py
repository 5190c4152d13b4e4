"""FlexAttention's kernel (CUDA; on CPU only on request, for tests): whether torch has it, the compiled function, the
causal block mask built from block indices, a learnable bias read from one tensor per forward, and block sizes that
fit the device's shared memory (a kernel that does not fit steps down them, then leaves the scheme to SDPA)."""

from __future__ import annotations

import functools
import warnings

import torch

from ..positions import PositionScheme

# Inductor's FlexAttention kernel on CUDA refuses heads narrower than this ("NYI: embedding dimension of the
# query, key, and value must be at least 16")
FLEX_MIN_HEAD_DIM = 16
# torch's compiled CPU kernel takes any width, but on some CPUs computes heads narrower than this wrong, silently: on
# an AVX2 one (torch 2.13) heads 8 and 16 wide gave NaN or outputs off by up to 2.9 in 10 to 20 of 20 calls of a shape
# at lengths 8 past a multiple of 16 (8, 24, ..., 104; 120 too at 8 wide), and were right at the others from 1 to 300;
# 12, 20, 24, 28, 32, 48, 64 and 128 were right at every length measured. 32, not 24: right and wrong do not follow
# the width (12 was right, 16 not), so the limit keeps a margin above the widest that failed. Below it
# model.attention=flex on the CPU is refused and flex_or_none runs SDPA.
FLEX_CPU_MIN_HEAD_DIM = 32
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


def flex_min_head_dim(device) -> int:
    """The narrowest heads FlexAttention's kernel computes on `device`: FLEX_MIN_HEAD_DIM on CUDA,
    FLEX_CPU_MIN_HEAD_DIM on the CPU."""
    return FLEX_MIN_HEAD_DIM if torch.device(device).type == "cuda" else FLEX_CPU_MIN_HEAD_DIM


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


def flex_or_none(q, k, v, ctx, score_mod=None):
    """FlexAttention's output (B, H, Tq, Dh) with `score_mod`, or None where its kernel does not fit the GPU
    (RESOURCE_FAILURES) at any step of the device's block-size ladder (flex_block_ladder): each failure moves the
    scheme one step down (FLEX_LEVEL), and past the last one it is recorded in FLEX_FAILED, with one warning, so
    that this forward's remaining layers and every later forward use SDPA (the same attention, unfused) instead of
    stopping the run. This covers the kernels built in a forward; in training the backward kernel is built by the
    gradient probe (flex_gradient_loss) first, at the same block sizes. Any other compile error is raised. Heads
    narrower than the device's kernel computes right (flex_min_head_dim: a context built with flex=True whose width
    explain_backend did not check, such as the gradient probe's) get None too: SDPA."""
    if q.shape[-1] < flex_min_head_dim(q.device):
        return None
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
