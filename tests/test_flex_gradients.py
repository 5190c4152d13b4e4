"""FlexAttention's score_mods checked, not assumed: for every scheme with a learnable bias, its score_mod evaluated as
flex evaluates it (index tensors broadcast over a (B, H, Tq, Tk) grid, and torch.vmap nested over b, h, q_idx, kv_idx
as flex's own eager path does) gives the scores and the gradients (into q, k and every learnable tensor it captures)
of an fp64 reference built from the scheme's score_bias (FoX: content_bias over its gates' formula; FIRE: its defining
formula, as its score_bias computes in float32), within GRAD_RTOL, and non-zero.
Also: FoX through the compiled FlexAttention forward on CPU equals its explicit path; the gradient probe that makes a
run whose fused path would lose gradients train with SDPA (one warning), on CPU by simulating the loss; the block
sizes a device's shared memory allows, and the step down when a kernel does not fit; heads too narrow for the CPU kernel
(FLEX_CPU_MIN_HEAD_DIM) never reach it. On CUDA, the same checks through the real kernel are in tests/test_cuda.py."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import ATOL, FLEX_CPU_HEADS, compose_job, make, needs_cxx, tokens

from alibi_lm.attention import (
    FLEX_BLOCKS,
    FLEX_CPU_MIN_HEAD_DIM,
    AttentionContext,
    MaskCache,
    attend,
    backend,
    explain_backend,
    flex_available,
    flex_block_bytes,
    flex_block_ladder,
    flex_kernel,
    probe_flex_gradients,
)
from alibi_lm.model import TransformerLM
from alibi_lm.positions import ScoreBlock, build_position_scheme
from alibi_lm.training.trainer import Trainer

pytestmark = pytest.mark.skipif(not flex_available(), reason="FlexAttention needs torch >= 2.7")

H, D = 4, 4 * FLEX_CPU_MIN_HEAD_DIM  # heads 32 wide: flex_or_none gives narrower ones on the CPU to SDPA
# scheme -> options: every learnable bias (and fixed ALiBi and Sandwich, whose score_mods have no tensor to learn)
LEARNABLE = {"alibi": dict(learn_slopes=True), "t5": {}, "kerple_log": {}, "kerple_power": {},
             "fire": dict(init_threshold=45.0), "fox": {}}  # FIRE: queries on both sides of L_thr
FIXED = {"alibi": {}, "sandwich": {}}
# float32 (the score_mod as flex runs it) against float64 (the reference): |got - want| <= GRAD_RTOL * |want| by norm,
# for scores and gradients; float32's rounding over sums of ~T^2 terms stays under 1e-5 here
GRAD_RTOL = 1e-4
# a tensor that adds one constant to every score of a query row has no gradient (softmax is shift-invariant): FIRE's
# output bias; both sides must give it ~0 (float32: within 1e-5 of the gradient scale)
SHIFT_ONLY = {"fire": {"mlp.fc_out.bias"}}
# (q_start, k_start, Tq): a forward from 0, one at an offset, and queries after earlier keys (a cached prefix)
OFFSETS = [(0, 0, 40), (33, 33, 40), (20, 0, 30)]


def scheme_for_test(name: str, options: dict):
    torch.manual_seed(0)
    scheme = build_position_scheme(name, H, D, 1, **options)
    if name == "t5":  # its table starts at zero: give the buckets values that differ
        torch.nn.init.normal_(scheme.bias_table.weight)
    return scheme


def broadcast_mod(score_mod, scores):
    """score_mod over scores (B, H, Tq, Tk) with b, h, q_idx, kv_idx broadcast int32 index tensors, as the compiled
    kernel hands it int32 indices."""
    B, Hs, Tq, Tk = scores.shape
    index = [torch.arange(n, dtype=torch.int32).view(*[n if i == d else 1 for i in range(4)])
             for d, n in enumerate((B, Hs, Tq, Tk))]
    return score_mod(scores, *index)


def vmap_mod(score_mod, scores):
    """score_mod over scores (B, H, Tq, Tk) as FlexAttention's eager path evaluates it: torch.vmap nested over
    b, h, q_idx, kv_idx, tensor indexing turned into index ops."""
    from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex
    from torch.nn.attention.flex_attention import _vmap_for_bhqkv

    index = [torch.arange(n) for n in scores.shape]
    with TransformGetItemToIndex():
        return _vmap_for_bhqkv(score_mod, prefix=(0,))(scores, *index)


EVALUATIONS = {"broadcast": broadcast_mod, "vmap": vmap_mod}


def fox_state_fp64(scheme, x):
    """FoX's cumulative log forget gates (B, H, T) in float64 from the formula: c_t = sum_{s <= t} log sigmoid(w.x_s + b)."""
    return F.logsigmoid(x @ scheme.gate_weight[0].t() + scheme.gate_bias[0]).transpose(1, 2).cumsum(-1)


def fire_bias_fp64(scheme, q_pos, k_pos):
    """FIRE's bias (H, Tq, Tk) from its definition, f(psi(i - j) / psi(max(i, L_thr))) with the MLP itself, in float64
    throughout (its score_bias computes distances in float32 and the MLP as its piecewise-linear pieces)."""
    distance = (q_pos[:, None] - k_pos[None, :]).clamp(min=0).double()  # (Tq, Tk)
    c = scheme.c.abs()
    normaliser = torch.log1p(c * torch.maximum(q_pos.double(), scheme.threshold())) + 1e-6  # (Tq,)
    x = torch.log1p(c * distance) / normaliser[:, None]  # (Tq, Tk)
    return scheme.mlp(x[..., None]).permute(2, 0, 1)  # (H, Tq, Tk)


def attention_loss(scores, future, v, weight):
    """The loss both sides share: softmax over visible keys, @ v, a fixed random weighting."""
    p = scores.masked_fill(future, float("-inf")).softmax(-1)  # (B, H, Tq, Tk)
    return ((p @ v) * weight).sum()


def run_side(scheme, q, k, v, weight, x, q_start, k_start, flex, evaluate=None):
    """(modded scores, loss) of one side: the float32 score_mod (flex=True) or the float64 reference."""
    Tq, Tk = q.shape[2], k.shape[2]
    q_pos, k_pos = torch.arange(q_start, q_start + Tq), torch.arange(k_start, k_start + Tk)
    future = k_pos[None, :] > q_pos[:, None]  # (Tq, Tk)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, Tq, Tk)
    if flex:
        state = scheme.prepare(x, 0, None) if scheme.content_aware else None
        score_mod = (scheme.flex_state_score_mod(state, q_start, k_start) if scheme.content_aware
                     else scheme.flex_score_mod(q_start, k_start))
        modded = evaluate(score_mod, scores)
    elif scheme.content_aware:  # FoX: content_bias over the fp64 formula's state
        block = ScoreBlock(q=q, k=k, scores=scores, future=future, q_pos=q_pos, k_pos=k_pos,
                           query_index=slice(Tk - Tq, Tk), layer=0, state=fox_state_fp64(scheme, x))
        modded = scores + scheme.content_bias(block)
    else:
        modded = scores + (fire_bias_fp64 if scheme.name == "fire" else type(scheme).score_bias)(scheme, q_pos, k_pos)
    return modded, attention_loss(modded, future, v, weight), future


@pytest.mark.parametrize("evaluation", list(EVALUATIONS))
@pytest.mark.parametrize("q_start, k_start, n_q", OFFSETS)
@pytest.mark.parametrize("name", list(LEARNABLE) + [f"{n}:fixed" for n in FIXED])
def test_a_score_mod_gives_the_fp64_references_scores_and_gradients(name, q_start, k_start, n_q, evaluation):
    name, fixed = name.split(":")[0], name.endswith(":fixed")
    scheme = scheme_for_test(name, FIXED[name] if fixed else LEARNABLE[name])
    reference = copy.deepcopy(scheme).double()
    n_k = q_start + n_q - k_start
    scheme.check_positions(q_start + n_q)
    reference.check_positions(q_start + n_q)
    gen = torch.Generator().manual_seed(1)
    q, k, v, weight = (torch.randn(2, H, n, D // H, generator=gen, dtype=torch.float64) for n in (n_q, n_k, n_k, n_q))
    x = torch.randn(2, n_k, D, generator=gen, dtype=torch.float64)  # FoX's layer input
    sides = []
    for model, dtype, flex in ((scheme, torch.float32, True), (reference, torch.float64, False)):
        leaves = [t.to(dtype).requires_grad_() for t in (q, k)]
        modded, loss, future = run_side(model, *leaves, v.to(dtype), weight.to(dtype), x.to(dtype), q_start, k_start,
                                        flex, EVALUATIONS[evaluation])
        params = dict(model.named_parameters())
        grads = torch.autograd.grad(loss, leaves + list(params.values()), allow_unused=True)
        sides.append((modded.detach(), dict(zip(["q", "k", *params], grads))))
    (got, got_grads), (want, want_grads) = sides
    visible = ~future
    error = float((got.double() - want)[..., visible].norm())
    assert error <= GRAD_RTOL * float(want[..., visible].norm()), f"scores off by {error:.3g}"
    learnable = [n for n in want_grads if n not in ("q", "k")]
    assert fixed == (not learnable)
    for tensor in SHIFT_ONLY.get(name, ()):
        g, w = got_grads.pop(tensor), want_grads.pop(tensor)
        assert float(w.norm()) < 1e-10 and float(g.norm()) < 1e-5 * float(want_grads["q"].norm()), tensor
        learnable.remove(tensor)
    for tensor in ["q", "k", *learnable]:
        g, w = got_grads[tensor], want_grads[tensor]
        assert g is not None and float(w.norm()) > 0 and float(g.norm()) > 0, f"no gradient into {tensor}"
        error = float((g.double() - w).norm())
        assert error <= GRAD_RTOL * float(w.norm()), f"{tensor}: |flex - fp64| = {error:.3g}, |fp64| = {w.norm():.3g}"


def test_every_learnable_bias_scheme_is_checked():
    """A new scheme with a flex score_mod and parameters must join LEARNABLE (or FIXED without parameters)."""
    from alibi_lm.positions import POSITION_SCHEMES, PositionScheme

    with_mod = {name for name, kind in POSITION_SCHEMES.items() if kind.__module__.startswith("alibi_lm.")
                and (kind.flex_score_mod is not PositionScheme.flex_score_mod
                     or kind.flex_state_score_mod is not PositionScheme.flex_state_score_mod)}
    assert with_mod == set(LEARNABLE) | set(FIXED)
    for name in with_mod - set(FIXED):
        assert any(p.requires_grad for p in scheme_for_test(name, LEARNABLE[name]).parameters()), name


# ---------------------------------------------------------------------------------------------
# FoX through FlexAttention


@needs_cxx
def test_fox_through_compiled_flex_attention_on_cpu_equals_its_explicit_path():
    """The compiled FlexAttention forward (its CPU kernel) with FoX's score_mod over the (B, H, T) gate sums gives the
    explicit path's logits, from position 0 and at an offset."""
    explicit = make("fox", attn_query_block=64, **FLEX_CPU_HEADS)
    flex = make("fox", seed=3, attention="flex", **FLEX_CPU_HEADS)
    flex.load_state_dict(explicit.state_dict())
    idx = tokens(2, 300)  # not a multiple of flex's 128-block
    with torch.no_grad():
        assert flex.attention_backend("cpu") == "flex" and explicit.attention_backend("cpu") == "sdpa"
        torch.testing.assert_close(flex(idx), explicit(idx), rtol=0, atol=ATOL)
        torch.testing.assert_close(flex(idx, start_pos=40), explicit(idx, start_pos=40), rtol=0, atol=ATOL)


def test_fox_picks_flex_where_it_applies_and_cope_stays_explicit():
    fox, cope = make("fox", n_head=2).position, make("cope", n_head=2).position  # heads 16 wide
    with torch.no_grad():
        assert explain_backend("auto", fox, "cuda", 0.0, head_dim=16)[0] == "flex"
        dropped = explain_backend("auto", fox, "cuda", 0.1, head_dim=16)
        assert dropped == ("explicit", "attention dropout 0.1 (FlexAttention has none)")
        path, why = explain_backend("auto", cope, "cuda", 0.0, head_dim=16)
    assert path == "explicit" and "content of each (query, key) pair" in why
    assert explain_backend("auto", fox, "cpu", 0.0, head_dim=16)[0] == "explicit"


# ---------------------------------------------------------------------------------------------
# The gradient probe: a fused path that would lose gradients falls back, with one warning


def math_flex(lose_bias_gradients: bool):
    """A stand-in for the compiled flex_attention on CPU (which has no backward): flex's semantics through the vmap
    evaluation, differentiable; with lose_bias_gradients the score_mod's captured tensors get no gradient (scores
    keep theirs), as pytorch#162228 reports of some graphs."""

    def flex(q, k, v, score_mod=None, block_mask=None, kernel_options=None):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, Tq, Tk)
        modded = vmap_mod(score_mod, scores) if score_mod is not None else scores
        if lose_bias_gradients:
            modded = scores + (modded - scores).detach()
        n_q, n_k = scores.shape[-2:]
        future = torch.arange(n_k)[None, :] > torch.arange(n_q)[:, None] + (n_k - n_q)
        return modded.masked_fill(future, float("-inf")).softmax(-1) @ v

    return lambda: flex


@pytest.mark.parametrize("name", list(LEARNABLE))
def test_the_probe_passes_a_path_that_keeps_gradients_and_names_the_one_it_loses(name, monkeypatch):
    scheme = scheme_for_test(name, LEARNABLE[name])
    monkeypatch.setattr(flex_kernel, "flex_attention_fn", math_flex(False))
    assert probe_flex_gradients(scheme, "cpu") is None
    monkeypatch.setattr(flex_kernel, "flex_attention_fn", math_flex(True))
    first = next(n for n, p in scheme.named_parameters() if p.requires_grad)
    assert probe_flex_gradients(scheme, "cpu") == f"no gradient into {first}"


def test_a_run_whose_fused_path_loses_gradients_trains_with_sdpa_after_one_warning(monkeypatch):
    """What the model asks on CUDA, answered by the real probe run on the CPU with a lossy flex: training falls back
    to SDPA with one warning, and says why; evaluation keeps FlexAttention; another scheme is unaffected."""
    monkeypatch.setattr(backend, "FLEX_PROBED", set())
    monkeypatch.setattr(backend, "FLEX_LOST_GRADIENTS", {})
    monkeypatch.setattr(flex_kernel, "flex_attention_fn", math_flex(True))
    monkeypatch.setattr(backend, "probe_flex_gradients", lambda scheme, device, real=probe_flex_gradients: real(scheme, "cpu"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    t5 = make("t5", **FLEX_CPU_HEADS).train()  # heads 32 wide, which the probe's flex path takes on the CPU
    with pytest.warns(RuntimeWarning, match=r"loses gradients of position=t5 .*\(no gradient into bias_table.weight\)"):
        assert t5.attention_backend("cuda") == "sdpa"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        assert explain_backend("auto", t5.position, "cuda", 0.0, head_dim=32) == (
            "sdpa", "FlexAttention lost gradients: no gradient into bias_table.weight")
        with torch.no_grad():
            assert t5.attention_backend("cuda") == "flex"
    assert list(backend.FLEX_LOST_GRADIENTS) == [("t5", "cuda", 32)]
    monkeypatch.setattr(flex_kernel, "flex_attention_fn", math_flex(False))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert make("kerple_log", **FLEX_CPU_HEADS).train().attention_backend("cuda") == "flex"  # probed: gradients hold


# ---------------------------------------------------------------------------------------------
# Training reads a learnable bias from one (H, Tq, Tk) tensor per forward, not through atomic adds per pair


@pytest.mark.parametrize("name", [n for n in LEARNABLE if n != "fox"])
def test_training_reads_a_learnable_bias_from_one_tensor_per_forward_and_evaluation_from_its_score_mod(name):
    """FlexAttention's backward sums a score_mod's captured tensors' gradients by one atomic add per (b, h, q, kv): into
    T5's buckets or KERPLE's per-head scalars that made training 11-24x slower on an H200. A training forward's score_mod
    reads score_bias's (H, Tq, Tk) tensor instead, and its gradient reaches the scheme's tensors through autograd;
    evaluation (no gradients) keeps the scheme's own score_mod."""
    scheme = scheme_for_test(name, LEARNABLE[name])
    q_start, n = 20, 50
    scheme.check_positions(q_start + n)
    ctx = AttentionContext(scheme, MaskCache(), q_start, 0, q_start + n, "cpu", n, flex=True)
    assert ctx.score_mod.__name__ == "bias_tensor"
    scores = torch.randn(2, H, n, q_start + n)  # (B, H, Tq, Tk)
    got = broadcast_mod(ctx.score_mod, scores)
    want = scores + scheme.score_bias(torch.arange(q_start, q_start + n), torch.arange(q_start + n))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    params = [p for p in scheme.parameters() if p.requires_grad]
    weight = torch.randn_like(scores)
    for g, w in zip(torch.autograd.grad((got * weight).sum(), params), torch.autograd.grad((want * weight).sum(), params)):
        assert float(g.norm()) > 0
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    with torch.no_grad():
        evaluation = AttentionContext(scheme, MaskCache(), q_start, 0, q_start + n, "cpu", n, flex=True)
        assert evaluation.score_mod.__name__ != "bias_tensor"
        torch.testing.assert_close(broadcast_mod(evaluation.score_mod, scores), want.detach(), rtol=1e-5, atol=1e-5)
    assert explain_backend("auto", scheme, "cuda", 0.0, head_dim=D // H) == ("flex", backend.BIAS_TENSOR_WHY)
    for p in params:  # frozen (a fine-tune that keeps the bias fixed): nothing to sum, its own score_mod again
        p.requires_grad_(False)
    assert not flex_kernel.learnable_score_bias(scheme)
    assert AttentionContext(scheme, MaskCache(), q_start, 0, q_start + n, "cpu", n, flex=True).score_mod.__name__ != "bias_tensor"


def test_the_bias_tensor_is_float32_under_bf16_autocast():
    """FIRE's MLP runs in bf16 under autocast (CUDA training): the tensor the kernel reads, and sums gradients into,
    stays float32 as score_bias promises."""
    scheme = scheme_for_test("fire", LEARNABLE["fire"])
    scheme.check_positions(40)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert scheme.score_bias(torch.arange(40), torch.arange(40)).dtype == torch.bfloat16  # why the cast is there
        ctx = AttentionContext(scheme, MaskCache(), 0, 0, 40, "cpu", 40, flex=True)
        [bias] = [cell.cell_contents for cell in ctx.score_mod.__closure__]
    assert bias.dtype == torch.float32 and bias.shape == (H, 40, 40)


def test_flexattention_is_compiled_once_per_process():
    """Every context shares one compiled flex_attention (a new torch.compile wrapper per forward would trace again)."""
    assert flex_kernel.flex_attention_fn() is flex_kernel.flex_attention_fn()


def test_a_fixed_or_content_aware_bias_trains_through_its_own_score_mod():
    """Fixed ALiBi and Sandwich have no gradient to sum, FoX's goes to one value per token: their score_mods stay."""
    for name, options in (("alibi", {}), ("sandwich", {}), ("fox", {})):
        scheme = scheme_for_test(name, options)
        assert not flex_kernel.learnable_score_bias(scheme), name
        assert explain_backend("auto", scheme, "cuda", 0.0, head_dim=D // H) == (
            "flex", "FlexAttention with the scheme's score_mod")
        if name != "fox":
            scheme.check_positions(30)
            assert AttentionContext(scheme, MaskCache(), 0, 0, 30, "cpu", 30, flex=True).score_mod.__name__ != "bias_tensor"


# ---------------------------------------------------------------------------------------------
# Block sizes per device


def test_block_size_estimates_follow_the_kernels_staged_blocks():
    """float32, head width 64: forward BLOCK_M + 2 * stages * BLOCK_N rows (or the backward's, if more) of 256 bytes."""
    assert [flex_block_bytes(block, 64) for block in FLEX_BLOCKS] == [131072, 81920, 49152, 24576, 16384]
    assert flex_block_bytes(FLEX_BLOCKS[0], 128) == 262144 and flex_block_bytes(FLEX_BLOCKS[0], 64, 2) == 65536


@pytest.mark.parametrize("shared, head_dim, first", [
    (232448, 64, 0),  # H100 / H200: 227 KiB per block, every size
    (232448, 128, 1),  # its largest blocks need 256 KiB at head width 128
    (166912, 64, 0),  # A100
    (101376, 64, 1),  # RTX 30xx / 40xx: 99 KiB
    (101376, 128, 2),
    (49152, 128, 3),  # 48 KiB, the default of older GPUs
    (16384, 64, 4),
])
def test_a_devices_block_sizes_are_those_its_shared_memory_holds(shared, head_dim, first):
    ladder = flex_block_ladder(shared, head_dim)
    assert ladder[0] is None  # torch's own choice first
    assert [tuple(options.values()) for options in ladder[1:]] == list(FLEX_BLOCKS[first:])
    assert ladder[1] == dict(zip(("BLOCK_M", "BLOCK_N", "BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2", "num_stages"),
                                 FLEX_BLOCKS[first]))


def test_no_block_sizes_where_even_the_smallest_does_not_fit_and_the_cpu_keeps_torchs_choice():
    assert flex_block_ladder(16383, 64) == [] and flex_block_ladder(None, 64) == [None]


def test_a_kernel_that_does_not_fit_steps_down_the_ladder_and_past_its_end_uses_sdpa(monkeypatch):
    """A device of 99 KiB per block whose kernels fit only at 32-row blocks: the forward fails at torch's choice and the
    three larger sizes, then runs at 32 (that step kept for later forwards); where none fits, one warning and SDPA.
    The kernel that runs is flex's semantics computed exactly (math_flex): this checks the ladder, not a kernel."""
    from torch._inductor.exc import InductorError

    exact, calls = math_flex(False)(), []

    def fits_at_32(q, k, v, score_mod=None, block_mask=None, kernel_options=None):
        calls.append(None if kernel_options is None else kernel_options["BLOCK_M"])
        if kernel_options is None or kernel_options["BLOCK_M"] > 32:
            raise InductorError(RuntimeError("No valid triton configs. OutOfMemoryError: out of resource"), None)
        return exact(q, k, v, score_mod)

    for name, value in (("FLEX_LEVEL", {}), ("FLEX_FAILED", {})):
        monkeypatch.setattr(flex_kernel, name, value)
    monkeypatch.setattr(flex_kernel, "shared_memory", lambda device: 101376)
    monkeypatch.setattr(flex_kernel, "flex_attention_fn", lambda: fits_at_32)
    sdpa, flex = make("t5", attention="sdpa", **FLEX_CPU_HEADS), make("t5", seed=3, attention="flex", **FLEX_CPU_HEADS)
    flex.load_state_dict(sdpa.state_dict())
    idx = tokens(2, 40)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(flex(idx), sdpa(idx), rtol=0, atol=ATOL)
        assert calls == [None, 128, 64, 64, 32, 32] and flex_kernel.FLEX_LEVEL == {("t5", "cpu", 32): 4}  # 2 layers
        calls.clear()
        flex(idx)
        assert calls == [32, 32]
    monkeypatch.setattr(flex_kernel, "shared_memory", lambda device: 1000)  # not even the smallest
    monkeypatch.setattr(flex_kernel, "FLEX_LEVEL", {})
    calls.clear()
    with torch.no_grad(), pytest.warns(RuntimeWarning, match=r"position=t5 \(needs more than the 1000 bytes"):
        torch.testing.assert_close(flex(idx), sdpa(idx), rtol=0, atol=ATOL)
    assert calls == [] and ("t5", "cpu", 32) in flex_kernel.FLEX_FAILED


def test_a_flex_context_never_hands_the_cpu_kernel_heads_narrower_than_it_computes_right(monkeypatch):
    """A context built with flex=True without explain_backend's check of the width (the gradient probe builds one):
    attend() gives heads under FLEX_CPU_MIN_HEAD_DIM wide to SDPA on the CPU, the kernel never sees them; 32 reach it."""
    exact, widths = math_flex(False)(), []

    def recorded(q, k, v, score_mod=None, block_mask=None, kernel_options=None):
        widths.append(q.shape[-1])
        return exact(q, k, v, score_mod)

    monkeypatch.setattr(flex_kernel, "flex_attention_fn", lambda: recorded)
    gen = torch.Generator().manual_seed(0)
    for width in (8, 16, 32):
        scheme, T = build_position_scheme("alibi", H, H * width, 1), 40
        q, k, v = (torch.randn(2, H, T, width, generator=gen) for _ in range(3))  # (B, H, T, Dh)
        want = attend(q, k, v, AttentionContext(scheme, MaskCache(), 0, 0, T, "cpu", T), 0.0, None)  # SDPA
        got = attend(q, k, v, AttentionContext(scheme, MaskCache(), 0, 0, T, "cpu", T, flex=True), 0.0, None)
        torch.testing.assert_close(got, want, rtol=0, atol=ATOL)
    assert widths == [32]


class NoRoomBackward(torch.autograd.Function):
    """The identity, whose backward raises what a backward kernel that does not fit the device raises."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        from torch._inductor.exc import InductorError

        raise InductorError(RuntimeError("No valid triton configs. OutOfMemoryError: out of resource"), None)


def backward_fits_at(largest: int, only: torch.dtype | None = None):
    """A stand-in for the compiled flex_attention (exact, eager) whose backward does not fit the device above
    `largest`-row blocks or at torch's own choice; with `only`, just for inputs of that dtype."""
    exact = math_flex(False)()

    def flex(q, k, v, score_mod=None, block_mask=None, kernel_options=None):
        out = exact(q, k, v, score_mod)
        too_big = kernel_options is None or kernel_options["BLOCK_M"] > largest
        return NoRoomBackward.apply(out) if too_big and only in (None, q.dtype) else out

    return lambda: flex


def test_a_backward_kernel_that_does_not_fit_steps_down_in_the_probe_and_past_the_end_trains_with_sdpa(monkeypatch):
    """The probe builds the backward kernel before training does: where it does not fit (at torch's choice and
    above 32-row blocks here) the scheme steps down its sizes; where it never fits, one warning and SDPA."""
    for name, value in (("FLEX_LEVEL", {}), ("FLEX_FAILED", {}), ("FLEX_OPTIONS", {})):
        monkeypatch.setattr(flex_kernel, name, value)
    for name, value in (("FLEX_PROBED", set()), ("FLEX_LOST_GRADIENTS", {})):
        monkeypatch.setattr(backend, name, value)
    monkeypatch.setattr(flex_kernel, "shared_memory", lambda device: 232448)
    monkeypatch.setattr(flex_kernel, "flex_attention_fn", backward_fits_at(32))
    scheme = scheme_for_test("t5", {})
    assert probe_flex_gradients(scheme, "cpu") is None
    assert flex_kernel.FLEX_LEVEL == {("t5", "cpu", 32): 4} and flex_kernel.FLEX_OPTIONS[("t5", "cpu", 32)]["BLOCK_M"] == 32
    monkeypatch.setattr(flex_kernel, "FLEX_LEVEL", {})
    monkeypatch.setattr(flex_kernel, "flex_attention_fn", backward_fits_at(0))  # no size fits
    with pytest.warns(RuntimeWarning, match=r"backward kernel does not fit this cpu device for position=t5"):
        assert probe_flex_gradients(scheme, "cpu") is None
    assert list(flex_kernel.FLEX_FAILED) == [("t5", "cpu", 32)] and flex_kernel.FLEX_LEVEL == {}
    # what the choice then says on the device where it happened (CUDA; the probe ran on the CPU here)
    flex_kernel.FLEX_FAILED["t5", "cuda", 32] = flex_kernel.FLEX_FAILED.pop(("t5", "cpu", 32))
    path, why = explain_backend("auto", scheme, "cuda", 0.0, head_dim=32)
    assert path == "sdpa" and why == ("FlexAttention's kernel did not fit this device: RuntimeError: No valid triton "
                                      "configs. OutOfMemoryError: out of resource")


def test_a_backward_kernel_that_fits_in_float32_but_not_from_bfloat16_inputs_steps_down_in_the_probe(monkeypatch):
    """Triton picks larger blocks for 16-bit inputs: a backward that fits at torch's choice in float32 but, from the
    bfloat16 inputs training under autocast gives it, only at 32-row blocks moves the scheme down the ladder in the
    probe, not in the first training step."""
    for name, value in (("FLEX_LEVEL", {}), ("FLEX_FAILED", {}), ("FLEX_OPTIONS", {})):
        monkeypatch.setattr(flex_kernel, name, value)
    monkeypatch.setattr(flex_kernel, "shared_memory", lambda device: 232448)
    monkeypatch.setattr(flex_kernel, "flex_attention_fn", backward_fits_at(32, only=torch.bfloat16))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # where a bf16 training's Trainer.start() asks
        assert probe_flex_gradients(scheme_for_test("t5", {}), "cpu") is None
    assert flex_kernel.FLEX_LEVEL == {("t5", "cpu", 32): 4} and flex_kernel.FLEX_OPTIONS[("t5", "cpu", 32)]["BLOCK_M"] == 32
    assert flex_kernel.FLEX_FAILED == {}


def test_a_float32_training_builds_only_float32_kernels_in_the_probe_and_a_bf16_one_in_the_same_process_probes_again(
        monkeypatch):
    """train.precision=fp32 on CUDA runs no autocast: the probe builds no bfloat16 kernel, so a backward that would not
    fit from 16-bit inputs leaves the scheme's block sizes where float32's fit. A later bf16 training in the same
    process (a sweep) is probed again and builds its own."""
    for name, value in (("FLEX_LEVEL", {}), ("FLEX_FAILED", {}), ("FLEX_OPTIONS", {})):
        monkeypatch.setattr(flex_kernel, name, value)
    for name, value in (("FLEX_PROBED", set()), ("FLEX_LOST_GRADIENTS", {})):
        monkeypatch.setattr(backend, name, value)
    monkeypatch.setattr(flex_kernel, "shared_memory", lambda device: 232448)
    monkeypatch.setattr(flex_kernel, "flex_attention_fn", backward_fits_at(32, only=torch.bfloat16))
    built = []
    monkeypatch.setattr(backend, "probe_flex_gradients",
                        lambda scheme, device, real=probe_flex_gradients: built.append(1) or real(scheme, "cpu"))
    scheme = scheme_for_test("t5", {})
    assert backend.flex_gradient_loss(scheme, "cpu", 32) is None
    assert flex_kernel.FLEX_LEVEL == {} and flex_kernel.FLEX_FAILED == {} and len(built) == 1
    assert backend.flex_gradient_loss(scheme, "cpu", 32) is None and len(built) == 1  # probed once per precision
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert backend.flex_gradient_loss(scheme, "cpu", 32) is None
    assert len(built) == 2 and flex_kernel.FLEX_LEVEL == {("t5", "cpu", 32): 4}


@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("fp32", None)])
def test_the_trainer_asks_for_its_attention_paths_under_its_own_autocast(precision, dtype, tmp_path, monkeypatch):
    """Trainer.start() runs the gradient probe (through attention_paths) before a compiled model traces its first
    step, where the probe cannot run: so it asks under the training's autocast, and a bf16 training's probe builds
    the bf16 kernels it will train with; a float32 training's builds none."""
    seen, real = [], TransformerLM.attention_paths

    def recorded(self, device):
        seen.append(backend.autocast_in_effect(torch.device(device).type))
        return real(self, device)

    monkeypatch.setattr(TransformerLM, "attention_paths", recorded)
    Trainer(compose_job("train", "experiment=tasks", "task=passkey", "position=t5", "model.n_layer=1",
                        "model.d_model=32", "model.d_ff=64", "train.seq_len=32", "train.batch_size=2",
                        "train.max_steps=1", "train.warmup_steps=1", "train.eval_every=1", "train.checkpoint_every=1",
                        "train.progress=false", "train.evaluate_after=false", f"train.precision={precision}",
                        f"paths.runs={tmp_path}"), tmp_path / "passkey-t5").run()
    assert seen[0] == dtype
