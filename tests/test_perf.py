"""The performance structure, without timings: each scheme's bias is computed once per forward and
cached, blocked attention equals unblocked attention, tables grow geometrically, masks reach the
fused CPU kernel, and FlexAttention agrees with SDPA. The benchmark package (scripts/bench) is
tested in tests/test_bench.py."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import ATOL, FLEX_CPU_HEADS, V, make, needs_cxx, tokens, write_run

from alibi_lm.attention import BIAS_TENSOR_WHY, AttentionContext, causal_block_mask, flex_available
from alibi_lm.errors import ConfigError
from alibi_lm.positions import POSITION_SCHEMES, PositionScheme, alibi_bias, build_position_scheme
from alibi_lm.subjects import load_run

ALL_SCHEMES = list(POSITION_SCHEMES)  # the test scheme (conftest) included
SCHEMES = [s for s in ALL_SCHEMES if POSITION_SCHEMES[s].__module__.startswith("alibi_lm.")]  # the benchmark's
# schemes with a score bias, plus nope: the attention-mask paths; FLEX: those FlexAttention can run (a
# flex_score_mod, or no bias at all)
BIASED = [s for s in ALL_SCHEMES if POSITION_SCHEMES[s].score_bias is not PositionScheme.score_bias] + ["nope"]
FLEX = [s for s in BIASED if s == "nope" or POSITION_SCHEMES[s].flex_score_mod is not PositionScheme.flex_score_mod]


def count_bias_calls(model):
    calls = []
    original = model.position.score_bias

    def counting(q_pos, k_pos):
        out = original(q_pos, k_pos)
        calls.append(tuple(out.shape) if out is not None else None)
        return out

    model.position.score_bias = counting
    return calls


# ---------------------------------------------------------------------------------------------
# Blocked attention = unblocked attention


def test_query_blocks_shrink_with_the_keys_past_the_block_budget():
    """In CPU inference, past BLOCK_VALUES a block takes fewer query rows, so its (H, rows, keys) temporaries stop
    growing with the length: with 8 heads, 32 rows at 8,192 keys, half the 64 at 4,096. Training keeps its blocks."""
    from alibi_lm.attention.context import BLOCK_VALUES, MIN_BLOCK_ROWS

    scheme = build_position_scheme("fire", n_head=8, d_model=64)
    lengths = (512, 4096, 8192, 1 << 20)
    with torch.no_grad():
        rows = {n: AttentionContext(scheme, None, 0, 0, n, "cpu", 128).block for n in lengths}
    assert rows == {512: 128, 4096: 64, 8192: 32, 1 << 20: MIN_BLOCK_ROWS}
    assert 8 * rows[8192] * 8192 == BLOCK_VALUES == 8 * rows[4096] * 4096
    assert {AttentionContext(scheme, None, 0, 0, n, "cpu", 128).block for n in lengths} == {128}  # with grad


@pytest.mark.parametrize("scheme", ["fire", "cope", "fox", "alibi", "nope"])
def test_a_forward_under_a_small_block_budget_equals_the_whole(scheme, monkeypatch):
    """The budget only changes how many queries a block holds: 16-row blocks give the whole forward's loss."""
    from alibi_lm.attention import context

    T = 120
    whole = make(scheme, attn_query_block=100_000)
    idx, targets = tokens(1, T), tokens(1, T, seed=2)
    with torch.no_grad():
        expected = whole(idx, targets=targets)
        monkeypatch.setattr(context, "BLOCK_VALUES", 16 * whole.cfg.n_head * T)  # 16 rows at T keys
        calls = count_bias_calls(whole) if scheme == "fire" else None
        torch.testing.assert_close(whole(idx, targets=targets), expected, rtol=0, atol=ATOL)
    if calls is not None:  # FIRE's absolute bias: one per query block (kept for the other layers)
        assert [shape[1] for shape in calls] == [8] + [16] * 7  # the last block first


@pytest.mark.parametrize("scheme", ALL_SCHEMES)
def test_blocked_equals_unblocked_at_long_length_with_gradients(scheme):
    T = 600  # > rope's first 256-row table, > t5's max_distance; 64-query blocks, the last one partial
    whole = make(scheme, attn_query_block=100_000)
    blocked = make(scheme, seed=3, attn_query_block=64)
    blocked.load_state_dict(whole.state_dict())
    idx, targets = tokens(1, T), tokens(1, T, seed=2)
    losses = []
    for model in (whole, blocked):
        loss = model(idx, targets=targets)
        loss.mean().backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[1], losses[0], rtol=0, atol=ATOL)
    grads = dict(whole.named_parameters())
    for name, p in blocked.named_parameters():
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, grads[name].grad, rtol=0, atol=ATOL, msg=name)


# ---------------------------------------------------------------------------------------------
# One bias per forward, for every layer, batch element and query block


@pytest.mark.parametrize("block", [10_000, 16])
def test_t5_bias_is_computed_once_per_forward(block):
    model = make("t5", n_layer=4, attn_query_block=block)
    calls = count_bias_calls(model)
    T = 100
    with torch.no_grad():
        model(tokens(3, T))
    assert len(calls) == 1, "one score_bias call per forward, shared by all 4 layers (and query blocks)"
    H, rows, cols = calls[0]
    assert H == 4 and rows == min(block, T)
    assert rows * cols < T * T or block >= T  # blocked: a window template, never (H, T, T)
    assert cols <= T + rows - 1  # keys up to the last block's last row (a partial last block rounds up)
    calls.clear()
    model.train()
    model(tokens(3, T), targets=tokens(3, T, seed=2)).mean().backward()  # learned: with a gradient, still once
    assert len(calls) == 1
    assert model.position.bias_table.weight.grad.abs().sum() > 0


def test_bias_is_never_expanded_over_the_batch_and_stays_linear_in_length():
    model = make("t5", attn_query_block=32)
    calls = count_bias_calls(model)
    with torch.no_grad():
        for T in (256, 512, 1024):
            model(tokens(4, T))
    for (H, rows, cols), T in zip(calls, (256, 512, 1024)):
        assert (H, rows) == (4, 32) and cols <= T  # (H, 32, <= T): no batch dim, linear in T


def test_static_bias_cache_hit_is_the_identical_tensor_and_equals_a_fresh_one():
    model = make("alibi", attn_query_block=32)
    calls = count_bias_calls(model)
    idx = tokens(2, 100)
    with torch.no_grad():
        first = model(idx)
        (key,) = model.masks
        fold, top = model.masks[key]
        assert key == (32, torch.device("cpu"), torch.float32) and top == 96 - 0  # last block starts at 96
        second = model(idx)
        shifted = model(idx, start_pos=1000)  # same relative offsets: the same entry, untouched
        assert len(calls) == 1
        assert model.masks[key][0] is fold
    assert torch.equal(first, second)
    torch.testing.assert_close(shifted, first, rtol=0, atol=ATOL)
    # the cached template equals an independent computation (alibi_bias folds -inf itself)
    expected = alibi_bias(4, torch.arange(top, top + 32), torch.arange(0, top + 32))
    assert torch.equal(fold[0], expected)
    # and a mask handed to attention is a view of it, not a copy
    ctx = AttentionContext(model.position, model.masks, 0, 0, 100, "cpu", query_block=32)
    mask, causal = ctx.mask(32, 64, torch.float32)
    assert not causal and mask.shape == (1, 4, 32, 64)
    assert mask.untyped_storage().data_ptr() == fold.untyped_storage().data_ptr()


def test_static_template_grows_geometrically_while_decoding():
    model = make("alibi")
    calls = count_bias_calls(model)
    steps = 150
    model.generate(tokens(1, 3), max_new_tokens=steps, temperature=0.0)
    # the prompt (3 rows), then 1-row steps at offsets 3..152: doubling makes it ~log2(152) builds
    assert len(calls) <= 2 + math.ceil(math.log2(steps + 3)), len(calls)
    one_row = [v for k, v in model.masks.items() if k[0] == 1]
    assert one_row and one_row[0][1] < 2 * (steps + 3)  # offset at most twice the longest needed


def test_rope_table_grows_geometrically():
    rope = build_position_scheme("rope", n_head=2, d_model=16)
    sizes = []
    original = rope._grow
    rope._grow = lambda n, device: sizes.append(n) or original(n, device)
    for end in range(1, 5001, 7):
        rope.check_positions(end)
    assert sizes == [256, 512, 1024, 2048, 4096, 8192]


@pytest.mark.parametrize("cutoffs", [None, [20, 50]])
def test_inference_nll_in_slices_equals_the_whole(cutoffs):
    model = make("alibi", adaptive_cutoffs=cutoffs, adaptive_factor=2)
    model.nll_chunk_logits = 7 * V  # slices of 7 tokens
    idx, targets = tokens(2, 40), tokens(2, 40, seed=2)
    whole = model(idx, targets=targets)  # with grad: the training path, unsliced
    with torch.no_grad():
        sliced = model(idx, targets=targets)
        assert torch.equal(model(idx, targets=targets), sliced)
    assert whole.requires_grad and sliced.shape == (2, 40)
    torch.testing.assert_close(sliced, whole.detach(), rtol=0, atol=ATOL)


# ---------------------------------------------------------------------------------------------
# Kernels


@pytest.mark.parametrize("scheme", BIASED)
def test_masks_reach_the_fused_cpu_kernel(scheme):
    """CPU SDPA runs its fused (flash) kernel only for 2-D or 4-D masks; a 3-D one falls back to the
    unfused math kernel, which materialises (B, H, Tq, Tk) scores."""
    model = make(scheme, attn_query_block=32)
    from torch.profiler import profile

    with torch.no_grad(), profile() as prof:
        model(tokens(2, 100))
    names = {e.key for e in prof.key_averages()}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in names
    assert "aten::_scaled_dot_product_attention_math" not in names


def test_attention_backend_choice():
    model = make("alibi", attn_dropout=0.1, **FLEX_CPU_HEADS)  # heads 32 wide: FlexAttention takes them on CUDA and CPU
    assert model.attention_backend("cpu") == "sdpa"
    if flex_available():
        assert model.attention_backend("cuda") == "flex"  # eval: no dropout
        model.train()
        assert model.attention_backend("cuda") == "sdpa"  # FlexAttention has no attention dropout
        assert model.attention_backend("cuda", incremental=True) == "sdpa"
        model.cfg.attention = "flex"
        with pytest.raises(ValueError, match="dropout"):
            model.attention_backend("cuda")
        model.eval()
        with pytest.raises(ValueError, match="inference only"):
            model.attention_backend("cpu")
        with torch.no_grad():
            assert model.attention_backend("cpu") == "flex"
    model.cfg.attention = "sdpa"
    assert model.attention_backend("cuda") == "sdpa"


@pytest.mark.skipif(not flex_available(), reason="FlexAttention needs torch >= 2.7")
def test_fire_trains_with_flex_reading_its_bias_tensor_and_evaluates_with_its_score_mod():
    """FIRE's score_mod has no CUDA backward (its unrolled MLP indexes each learned tensor once per unit); a training
    forward never differentiates a learnable scheme's score_mod, so FIRE trains through FlexAttention too."""
    fire = make("fire", n_head=2).train()  # dropout 0, heads 16 wide
    assert fire.attention_paths("cuda")["fire"] == dict(path="flex", why=BIAS_TENSOR_WHY)
    with torch.no_grad():
        assert fire.attention_paths("cuda")["fire"] == dict(path="flex", why="FlexAttention with the scheme's score_mod")
    fire.cfg.attention = "flex"
    assert fire.attention_backend("cuda") == "flex"


@pytest.mark.skipif(not flex_available(), reason="FlexAttention needs torch >= 2.7")
def test_heads_narrower_than_16_use_sdpa_on_cuda_and_an_explicit_flex_says_why():
    """Inductor's CUDA FlexAttention kernel refuses heads under 16 wide (the CPU's: below)."""
    narrow = make("alibi", n_head=4)  # d_model 32 / 4 heads = 8
    assert narrow.attention_backend("cuda") == "sdpa"
    narrow.cfg.attention = "flex"
    with pytest.raises(ValueError, match=r"heads at least 16 wide \(d_model / n_head = 8 here\); use model.attention=auto"):
        narrow.attention_backend("cuda")
    assert make("alibi", n_head=2).attention_backend("cuda") == "flex"


@pytest.mark.skipif(not flex_available(), reason="FlexAttention needs torch >= 2.7")
def test_an_explicit_flex_on_cpu_refuses_heads_its_kernel_computes_wrong_in_one_line_that_names_the_fix():
    """torch's compiled CPU kernel gave NaN or wrong outputs for heads 8 and 16 wide on an AVX2 CPU
    (FLEX_CPU_MIN_HEAD_DIM): model.attention=flex on the CPU refuses heads under 32 wide, in a forward as in the choice,
    where CUDA takes 16; auto runs SDPA on the CPU at any width."""
    for n_head, width in ((4, 8), (2, 16)):
        narrow = make("alibi", n_head=n_head, attention="flex")
        with torch.no_grad(), pytest.raises(ConfigError) as refused:
            narrow(tokens(1, 40))
        assert str(refused.value) == (
            f"model.attention=flex on CPU needs heads at least 32 wide (d_model / n_head = {width} here): torch's CPU kernel "
            f"gives wrong outputs for narrower heads on some CPUs; use model.attention=sdpa, or d_model / n_head >= 32")
        with torch.no_grad():
            assert make("alibi", n_head=n_head).attention_backend("cpu") == "sdpa"  # auto
    with torch.no_grad():
        assert make("alibi", n_head=2, attention="flex").attention_backend("cuda") == "flex"
        assert make("alibi", n_head=1, attention="flex").attention_backend("cpu") == "flex"  # 32 wide


@pytest.mark.skipif(not flex_available(), reason="FlexAttention needs torch >= 2.7")
def test_a_run_trained_with_an_explicit_flex_and_heads_16_wide_is_scored_on_the_cpu(tmp_path):
    """model.attention=flex is the training machine's choice: CUDA takes heads 16 wide, the CPU's kernel refuses
    them, and evaluation has no model.attention to change. A loaded run executes it as auto (SDPA here), with the
    outputs of the same weights under model.attention=sdpa; an explicit sdpa stays sdpa."""
    trained = make("alibi", n_head=2, attention="flex")  # d_model 32 / 2 heads = 16
    model, _, _ = load_run(write_run(tmp_path, trained))
    assert model.cfg.attention == "auto"
    with torch.no_grad():
        assert model.attention_backend("cpu") == "sdpa"
        torch.testing.assert_close(model(tokens(2, 40)), make("alibi", n_head=2, attention="sdpa")(tokens(2, 40)))
    sdpa, _, _ = load_run(write_run(tmp_path, make("alibi", n_head=2, attention="sdpa"), name="plain"))
    assert sdpa.cfg.attention == "sdpa"


@pytest.mark.skipif(not flex_available(), reason="FlexAttention needs torch >= 2.7")
def test_a_flex_kernel_that_does_not_fit_the_device_falls_back_to_sdpa_once_with_a_warning(monkeypatch):
    """A Triton kernel that needs more shared memory than the GPU has (seen on an H200 with T5's score_mod) must
    not stop an evaluation: that forward and every later one of the scheme (at this head width) run SDPA, after
    one warning. Any other compile error is a bug, and is raised."""
    from torch._dynamo.exc import BackendCompilerFailed
    from torch._inductor.exc import InductorError

    from alibi_lm.attention import flex_kernel

    calls = []

    def out_of_resources(*args, **kwargs):
        calls.append(1)
        raise InductorError(RuntimeError("No valid triton configs. OutOfMemoryError: out of resource"), None)

    monkeypatch.setattr(flex_kernel, "FLEX_FAILED", {})
    monkeypatch.setattr(flex_kernel, "flex_attention_fn", lambda: out_of_resources)
    sdpa = make("t5", attention="sdpa", **FLEX_CPU_HEADS)
    flex = make("t5", attention="flex", **FLEX_CPU_HEADS)
    idx = tokens(2, 40)
    warned = r"does not fit this cpu device for position=t5 \(RuntimeError: No valid triton configs"
    with torch.no_grad(), pytest.warns(RuntimeWarning, match=warned):
        torch.testing.assert_close(flex(idx), sdpa(idx), rtol=0, atol=ATOL)
    assert calls == [1] and list(flex_kernel.FLEX_FAILED) == [("t5", "cpu", 32)]
    with torch.no_grad():
        assert flex.attention_backend("cpu") == "sdpa"
        torch.testing.assert_close(flex(idx), sdpa(idx), rtol=0, atol=ATOL)
    assert calls == [1]  # never tried again in this process
    assert make("alibi", n_head=2).attention_backend("cuda") == "flex"  # other schemes keep FlexAttention
    with torch.no_grad():
        assert make("t5", n_head=2).attention_backend("cpu") == "sdpa"  # auto: never flex on CPU
        assert make("t5", n_head=2, attention="flex", **FLEX_CPU_HEADS).attention_backend("cpu") == "flex"  # another width

    def broken(*args, **kwargs):
        raise BackendCompilerFailed("inductor", RuntimeError("C++ compile error: undefined symbol"), None)

    monkeypatch.setattr(flex_kernel, "flex_attention_fn", lambda: broken)
    with torch.no_grad(), pytest.raises(BackendCompilerFailed, match="undefined symbol"):
        make("alibi", attention="flex", **FLEX_CPU_HEADS)(idx)
    assert list(flex_kernel.FLEX_FAILED) == [("t5", "cpu", 32)]


def test_older_torch_trains_and_evaluates_with_sdpa(monkeypatch):
    from torch.torch_version import TorchVersion

    monkeypatch.setattr(torch, "__version__", TorchVersion("2.6.0+cu124"))  # no gradients through a learned bias
    assert not flex_available()
    t5 = make("t5")
    assert t5.attention_backend("cuda") == t5.train().attention_backend("cuda") == "sdpa"
    t5.cfg.attention = "flex"
    with pytest.raises(ValueError, match=r"torch >= 2\.7"):
        t5.attention_backend("cuda")


# ---------------------------------------------------------------------------------------------
# FlexAttention (the CUDA path), checked on CPU where torch allows it: inference, compiled, heads FLEX_CPU_HEADS wide


@pytest.mark.skipif(not flex_available(), reason="FlexAttention needs torch >= 2.7")
@pytest.mark.parametrize("n_q, n_k, offset", [(300, 300, 0), (128, 256, 128), (100, 357, 257), (1, 200, 199),
                                              (256, 256, 0)])
def test_causal_block_mask_matches_create_block_mask(n_q, n_k, offset):
    from torch.nn.attention.flex_attention import create_block_mask

    ours = causal_block_mask(n_q, n_k, offset, "cpu")
    ref = create_block_mask(lambda b, h, q, k: q + offset >= k, None, None, n_q, n_k, device="cpu")
    assert torch.equal(ours.to_dense(), ref.to_dense())
    assert torch.equal(ours.kv_num_blocks, ref.kv_num_blocks)
    assert torch.equal(ours.full_kv_num_blocks, ref.full_kv_num_blocks)


@pytest.mark.skipif(not flex_available(), reason="FlexAttention needs torch >= 2.7")
@pytest.mark.parametrize("scheme", FLEX)
@needs_cxx
def test_flex_attention_matches_sdpa_on_cpu(scheme):
    sdpa = make(scheme, attn_query_block=64, **FLEX_CPU_HEADS)
    flex = make(scheme, seed=3, attention="flex", **FLEX_CPU_HEADS)
    flex.load_state_dict(sdpa.state_dict())
    idx = tokens(2, 300)  # not a multiple of flex's 128-block
    with torch.no_grad():
        torch.testing.assert_close(flex(idx), sdpa(idx), rtol=0, atol=ATOL)
        torch.testing.assert_close(flex(idx, start_pos=40), sdpa(idx, start_pos=40), rtol=0, atol=ATOL)


@pytest.mark.skipif(not flex_available(), reason="FlexAttention needs torch >= 2.7")
@needs_cxx
def test_flex_block_mask_is_built_once_per_forward_for_every_layer(monkeypatch):
    from alibi_lm.attention import flex_kernel

    built, real = [], flex_kernel.causal_block_mask
    monkeypatch.setattr(flex_kernel, "causal_block_mask", lambda *args: built.append(args) or real(*args))
    model = make("alibi", attention="flex", **FLEX_CPU_HEADS)
    assert model.cfg.n_layer > 1
    with torch.no_grad():
        model(tokens(2, 300))
    assert [args[:3] for args in built] == [(300, 300, 0)]


def test_an_absolute_bias_is_built_once_per_forward_while_it_fits(monkeypatch):
    model = make("fire", attn_query_block=8)  # 40 queries: 5 blocks
    with torch.no_grad():
        model.position.threshold_multiplier.fill_(1.0)  # L_thr = 8: most queries past it
    calls = count_bias_calls(model)
    idx = tokens(2, 40)
    with torch.no_grad():
        kept = model(idx)
        assert len(calls) == 5  # one per block, shared by the 2 layers
        needed = 4 * sum(8 * 8 * b for b in range(1, 6))  # H x the (8, 8b) blocks: 3840 values
        monkeypatch.setattr("alibi_lm.attention.context.ABSOLUTE_BIAS_KEPT", needed)
        calls.clear()
        model(idx)
        assert len(calls) == 5  # exactly fits
        monkeypatch.setattr("alibi_lm.attention.context.ABSOLUTE_BIAS_KEPT", needed - 1)  # too large to keep
        calls.clear()
        rebuilt = model(idx)
    assert len(calls) == 10  # each layer rebuilds every block
    torch.testing.assert_close(rebuilt, kept, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# Which attention each scheme's layers use, and why: chosen per device and config, recorded in each run


def test_attention_paths_say_which_kernel_each_schemes_layers_use_and_why():
    """Per scheme of the layers: flex where FlexAttention applies (CUDA, no attention dropout, a score_mod), else sdpa,
    or explicit for a content-aware scheme without a score_mod, with the reason."""
    mixed = make("fox", n_head=2, nope_every=2, attn_dropout=0.1)  # heads 16 wide; fox and nope layers
    with torch.no_grad():
        assert mixed.attention_paths("cuda") == {"fox": dict(path="flex", why="FlexAttention with the scheme's score_mod"),
                                                 "nope": dict(path="flex", why="FlexAttention with the scheme's score_mod")}
    mixed.train()
    dropped = dict(path="explicit", why="attention dropout 0.1 (FlexAttention has none)")
    assert mixed.attention_paths("cuda")["fox"] == dropped
    assert mixed.attention_paths("cuda")["nope"] == dict(path="sdpa", why="attention dropout 0.1 (FlexAttention has none)")
    assert make("cope", n_head=2).attention_paths("cuda")["cope"]["path"] == "explicit"
    assert make("alibi", n_head=2).attention_paths("cpu")["alibi"] == dict(
        path="sdpa", why="FlexAttention on CUDA only (CPU: SDPA's fused kernel; torch has no CPU flex backward)")
    assert make("alibi", n_head=4).attention_paths("cuda")["alibi"]["why"] == "heads 8 wide, under FlexAttention's 16 on CUDA"
    assert make("alibi", n_head=2, ssmax=True).attention_paths("cuda")["alibi"]["path"] == "sdpa"
    assert make("t5", n_head=2).train().attention_paths("cuda")["t5"] == dict(path="flex", why=BIAS_TENSOR_WHY)
    assert make("example_sdpa", n_head=2).attention_paths("cuda")["example_sdpa"] == dict(
        path="sdpa", why="its score bias has no flex_score_mod")


def test_a_runs_status_records_the_attention_its_schemes_trained_with(tmp_path):
    from conftest import write_corpus

    from alibi_lm import checkpoint as ckpt
    from alibi_lm.config import DataConfig, LoggerConfig, PathsConfig, TokenizerConfig, TrainConfig, TrainJob, WandbConfig
    from alibi_lm.model import LMConfig
    from alibi_lm.training.trainer import Trainer

    job = TrainJob(
        name="paths", model=LMConfig(n_layer=1, n_head=2, d_model=32, d_ff=64, position="t5"),
        data=DataConfig("wikitext2", "wikitext-2", root=str(write_corpus(tmp_path / "corpus")),
                        cache_dir=str(tmp_path / "cache")),
        tokenizer=TokenizerConfig("word"), logger=LoggerConfig(WandbConfig(mode="disabled")),
        train=TrainConfig(seq_len=16, batch_size=4, max_steps=2, warmup_steps=1, eval_tokens=256, eval_every=2,
                          checkpoint_every=2, progress=False),
        paths=PathsConfig(runs=str(tmp_path / "runs")))
    Trainer(job, tmp_path / "run").run()
    (segment,) = ckpt.read_status(tmp_path / "run")["train_segments"]
    assert segment["attention"] == {"t5": dict(
        path="sdpa", why="FlexAttention on CUDA only (CPU: SDPA's fused kernel; torch has no CPU flex backward)")}


def test_the_bench_table_says_why_each_scheme_has_the_attention_it_has():
    """make bench's section 1 lists each scheme's path and the reason (explain_backend's), once per scheme."""
    from types import SimpleNamespace

    from alibi_lm.bench.report import attention_reasons
    from alibi_lm.bench.rows import TrainRow

    why = "its bias depends on the content of each (query, key) pair, beyond per-token state (no score_mod)"
    rows = [TrainRow("train", "cope", "alibi-lm", "adaptive", "explicit", L, 8, why=why) for L in (512, 1024)]
    rows += [TrainRow("train", "alibi (dropout 0)", "alibi-lm", "adaptive", "flex", 512, 8,
                      why="FlexAttention with the scheme's score_mod"),
             TrainRow("peers", "naive", "naive", "plain", "by hand", 512, 8)]
    lines = attention_reasons(SimpleNamespace(train=rows))
    assert lines[0] == "Attention path of each row, and why:" and len(lines) == 2 + 2 + 2
    assert lines[4:] == [f"| cope | explicit | {why} |",
                         "| alibi (dropout 0) | flex | FlexAttention with the scheme's score_mod |"]
