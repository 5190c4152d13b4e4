"""The CUDA paths, on a machine with a CUDA device (skipped elsewhere): every scheme computes on the GPU what it
computes on the CPU, KV-cache decoding and FlexAttention (what evaluation picks on CUDA) agree with SDPA there,
forward and backward, bf16 autocast trains and scores every scheme, and the Trainer runs, resumes and compiles
on the GPU."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from conftest import V, make, tokens, write_corpus
from test_flex_gradients import LEARNABLE, SHIFT_ONLY, D, H, run_side, scheme_for_test
from test_train import killed_at_step_4

from alibi_lm import checkpoint as ckpt
from alibi_lm.attention import AttentionContext, MaskCache, attend, flex_attention_fn, flex_available, probe_flex_gradients
from alibi_lm.config import DataConfig, LoggerConfig, PathsConfig, TokenizerConfig, TrainConfig, TrainJob, WandbConfig
from alibi_lm.eval.scoring import score_stream
from alibi_lm.model import KVCache, LMConfig
from alibi_lm.positions import POSITION_SCHEMES, PositionScheme
from alibi_lm.training.trainer import Trainer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CUDA = torch.device("cuda")
SCHEMES = list(POSITION_SCHEMES)  # the test scheme (conftest) included
FLEX = [s for s in SCHEMES if POSITION_SCHEMES[s].flex_score_mod is not PositionScheme.flex_score_mod
        or POSITION_SCHEMES[s].flex_state_score_mod is not PositionScheme.flex_state_score_mod] + ["nope"]  # fox too
GPU_ATOL = 1e-4  # float32 kernels of another device: summation order only (TF32 stays off, torch's default)
CUDA_GRAD_RTOL = 1e-3  # the kernel's float32 against float64, by norm: its online softmax and block sums reorder terms
WIDE = dict(n_head=2)  # heads 16 wide, the narrowest CUDA's FlexAttention takes: evaluation (auto) runs it


@pytest.fixture(autouse=True)
def no_tf32():
    """Float32 matmuls in full precision, so that the GPU's logits are comparable with the CPU's."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_schemes_logits_on_cuda_equal_the_cpus(scheme):
    model = make(scheme, attention="sdpa")
    idx = tokens(2, 150)  # (B, T)
    with torch.no_grad():
        cpu = model(idx), model(idx, start_pos=40)
        model.to(CUDA)
        gpu = model(idx.to(CUDA)), model(idx.to(CUDA), start_pos=40)
    for want, got in zip(cpu, gpu):
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=GPU_ATOL)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_kv_cache_decoding_on_cuda_equals_the_full_forward(scheme):
    model = make(scheme, **WIDE).to(CUDA)
    idx = tokens(2, 21).to(CUDA)  # (B, T)
    with torch.no_grad():
        full = model(idx)  # (B, T, V)
        cache, chunks, t = KVCache(model.cfg.n_layer), [], 0
        for n in (5, 1, 7, 8):
            chunks.append(model(idx[:, t : t + n], start_pos=t, cache=cache))
            t += n
    torch.testing.assert_close(torch.cat(chunks, 1), full, rtol=0, atol=GPU_ATOL)
    assert cache.keys[0].device.type == "cuda" and (cache.start, cache.end) == (0, 21)


@pytest.mark.skipif(not flex_available(), reason="FlexAttention needs torch >= 2.7")
@pytest.mark.parametrize("scheme", FLEX)
def test_flex_attention_on_cuda_matches_sdpa_forward_and_backward(scheme):
    """FlexAttention on CUDA against SDPA: in training (a learnable bias read from its (H, T, T) tensor, FoX's score_mod)
    logits and gradients, the schemes' learned biases included; in evaluation (each scheme's own score_mod) logits."""
    sdpa = make(scheme, attention="sdpa", **WIDE).to(CUDA).train()
    flex = make(scheme, seed=3, attention="flex", **WIDE).to(CUDA).train()
    flex.load_state_dict(sdpa.state_dict())
    idx = tokens(2, 300).to(CUDA)  # (B, T), not a multiple of flex's 128-block
    for start_pos in (0, 40):
        outs = []
        for model in (sdpa, flex):
            model.zero_grad()
            logits = model(idx[:, :-1], start_pos=start_pos)  # (B, T-1, V)
            torch.nn.functional.cross_entropy(logits.reshape(-1, V), idx[:, 1:].reshape(-1)).backward()
            outs.append((logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
        (want, want_grads), (got, got_grads) = outs
        torch.testing.assert_close(got, want, rtol=0, atol=GPU_ATOL)
        assert flex.attention_backend(CUDA) == "flex" and got_grads.keys() == want_grads.keys()
        for name, grad in want_grads.items():  # a learned bias's gradient sums ~T^2 terms in another order: by norm
            error = float((got_grads[name] - grad).norm())
            assert error <= 1e-4 * float(grad.norm()) + 1e-7, f"{name}: |flex - sdpa| = {error:.3g}, |sdpa| = {grad.norm():.3g}"
    sdpa.eval(), flex.eval()
    with torch.no_grad():
        for start_pos in (0, 40):
            torch.testing.assert_close(flex(idx, start_pos=start_pos), sdpa(idx, start_pos=start_pos), rtol=0, atol=GPU_ATOL)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_bf16_autocast_trains_and_scores_every_scheme_on_cuda(scheme):
    """What the Trainer does on CUDA: steps under bf16 autocast, and scores under it (FlexAttention in eval)."""
    model = make(scheme, **WIDE).to(CUDA).train()
    idx = tokens(2, 64).to(CUDA)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(idx[:, :-1], targets=idx[:, 1:]).mean()  # (B, T) per-token nll
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    stream = tokens(1, 400)[0].numpy()
    bf16 = score_stream(model.eval(), stream, 64, device=CUDA, autocast_dtype=torch.bfloat16).ppl
    fp32 = score_stream(model, stream, 64, device=CUDA).ppl
    assert bf16 == pytest.approx(fp32, rel=0.05)  # bf16 rounding only


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def cuda_job(tmp_path, corpus, **train) -> TrainJob:
    settings = dict(seq_len=32, batch_size=4, max_steps=8, warmup_steps=2, eval_tokens=512, eval_every=4,
                    checkpoint_every=4, progress=False, device="cuda")
    return TrainJob(
        name="cuda", model=LMConfig(n_layer=2, n_head=2, d_model=32, d_ff=64, position="alibi"),  # validates with flex
        data=DataConfig("wikitext2", "wikitext-2", root=str(corpus), cache_dir=str(tmp_path / "cache")),
        tokenizer=TokenizerConfig("word"), train=TrainConfig(**{**settings, **train}),
        logger=LoggerConfig(WandbConfig(mode="disabled")), paths=PathsConfig(runs=str(tmp_path / "runs")),
    )


def test_a_run_trains_on_cuda_and_a_stopped_one_resumes_to_the_same_weights(tmp_path, corpus, monkeypatch):
    whole = Trainer(cuda_job(tmp_path, corpus), tmp_path / "whole").run()
    assert 1 < whole["val_ppl"] < float("inf")
    assert ckpt.read_status(tmp_path / "whole")["train_segments"][0]["device"] == f"{torch.cuda.get_device_name(0)}, bf16"
    killed_at_step_4(tmp_path, corpus, monkeypatch, "resumed", cuda_job)
    resumed = Trainer(cuda_job(tmp_path, corpus, resume="auto"), tmp_path / "resumed").run()
    a, b = (ckpt.load_checkpoint(tmp_path / run)["model"] for run in ("whole", "resumed"))
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-3, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    assert resumed["val_ppl"] == pytest.approx(whole["val_ppl"], rel=1e-3)


@pytest.mark.parametrize("position", ["alibi", "t5", "fire"])  # fixed, learned (its bias tensor), learned with .item()
def test_train_compile_on_cuda_trains_the_same_model(tmp_path, corpus, position):
    """train.compile=true: the same validation perplexity as eager, through FlexAttention (dropout 0), for a fixed
    bias and for learnable ones, whose (H, T, T) bias tensor is built inside the compiled forward."""
    runs = {}
    for name, compile_ in (("eager", False), ("compiled", True)):
        job = cuda_job(tmp_path, corpus, compile=compile_)
        job.model = dataclasses.replace(job.model, position=position, position_options={})  # not ALiBi's options
        runs[name] = Trainer(job, tmp_path / name).run()["val_ppl"]
    assert runs["compiled"] == pytest.approx(runs["eager"], rel=1e-2)  # bf16 autocast: the fused kernels round differently


def test_train_precision_fp32_on_cuda_trains_what_the_cpu_trains(tmp_path, corpus):
    """train.precision=fp32: no autocast on the GPU, so a run's validation perplexity is the CPU's up to the
    summation order of float32 kernels (dropout 0: the two devices draw different random numbers)."""
    runs = {}
    for device in ("cpu", "cuda"):
        job = cuda_job(tmp_path, corpus, device=device, precision="fp32")
        job.model.dropout = 0.0
        runs[device] = Trainer(job, tmp_path / device).run()["val_ppl"]
        segment = ckpt.read_status(tmp_path / device)["train_segments"][0]["device"]
        assert segment.endswith(", fp32") == (device == "cuda") and not segment.endswith(", bf16")
    assert runs["cuda"] == pytest.approx(runs["cpu"], rel=1e-3)


# ---------------------------------------------------------------------------------------------
# FlexAttention's gradients through the real kernel (the CPU checks evaluate the score_mods as flex does)


# the learnable biases: each trains through FlexAttention (FoX by its score_mod, the others by their bias tensor)
FLEX_LEARNABLE = list(LEARNABLE)


@pytest.mark.skipif(not flex_available(), reason="FlexAttention needs torch >= 2.7")
@pytest.mark.parametrize("name", FLEX_LEARNABLE)
def test_flex_kernels_gradients_equal_the_fp64_reference_on_cuda(name):
    """The compiled FlexAttention kernel, forward and backward, as a training forward runs it (a learnable bias read from
    one (H, T, T) tensor, FoX's score_mod over its gate sums): output and gradients into q,
    k and every learnable tensor equal an fp64 eager reference from score_bias (content_bias) within CUDA_GRAD_RTOL, and
    are non-zero. float32 inputs, TF32 off (the fixture)."""
    scheme = scheme_for_test(name, LEARNABLE[name]).to(CUDA)
    reference = copy.deepcopy(scheme).double().cpu()  # the fp64 reference runs on the CPU, beside its inputs
    T = 300  # three of the block mask's 128-blocks, the last partial
    scheme.check_positions(T)
    reference.check_positions(T)
    gen = torch.Generator().manual_seed(1)
    q, k, v, weight = (torch.randn(2, H, T, D // H, generator=gen, dtype=torch.float64) for _ in range(4))
    x = torch.randn(2, T, D, generator=gen, dtype=torch.float64)  # FoX's layer input
    ctx = AttentionContext(scheme, MaskCache(), 0, 0, T, CUDA, T, flex=True)
    leaves = [t.to(CUDA, torch.float32).requires_grad_() for t in (q, k)]
    state = scheme.prepare(x.to(CUDA, torch.float32), 0, None) if scheme.content_aware else None
    # what a training forward reads: a learnable bias its (H, T, T) tensor; FoX its state's score_mod (in attend)
    assert (getattr(ctx.score_mod, "__name__", None) == "bias_tensor") == (not scheme.content_aware)
    out = attend(*leaves, v.to(CUDA, torch.float32), ctx, 0.0, None, 0, state)  # (2, H, T, Dh) through the kernel
    assert ctx.flex is not None, "the kernel did not build"
    params = dict(scheme.named_parameters())
    got = torch.autograd.grad((out * weight.to(CUDA, torch.float32)).sum(), leaves + list(params.values()))
    ref_leaves = [t.clone().requires_grad_() for t in (q, k)]
    _, loss, _ = run_side(reference, *ref_leaves, v, weight, x, 0, 0, flex=False)
    ref_params = dict(reference.named_parameters())
    want = torch.autograd.grad(loss, ref_leaves + list(ref_params.values()), allow_unused=True)
    shift_only = SHIFT_ONLY.get(name, set())
    for tensor, g, w in zip(["q", "k", *params], got, want):
        g = g.double().cpu()
        if tensor in shift_only:  # no gradient by construction (softmax ignores a shift)
            assert float(g.norm()) < 1e-4 * float(want[0].norm()), tensor
            continue
        assert float(w.norm()) > 0 and float(g.norm()) > 0, f"no gradient into {tensor}"
        error = float((g - w).norm())
        assert error <= CUDA_GRAD_RTOL * float(w.norm()), f"{tensor}: |flex - fp64| = {error:.3g}, |fp64| = {w.norm():.3g}"


@pytest.mark.skipif(not flex_available(), reason="FlexAttention needs torch >= 2.7")
@pytest.mark.parametrize("name", FLEX_LEARNABLE)
def test_the_gradient_probe_passes_every_learnable_bias_on_cuda(name):
    """What a training run asks before it trains with FlexAttention: the kernel's gradients equal the explicit path's."""
    assert probe_flex_gradients(scheme_for_test(name, LEARNABLE[name]).to(CUDA), CUDA) is None
    assert flex_attention_fn() is not None
