"""Training-free extension (alibi_lm.extension): each remap against its closed form on hand-computed grids, every
method at its identity settings against the plain model, rotary multi-pass attention against a brute-force rotation
by d', StreamingLLM's blockwise form against the token-by-token cache it stands for, and the refusals."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import V, fake_run_data, make, tokens

from alibi_lm.attention import AttentionContext, MaskCache
from alibi_lm.errors import ConfigError, UserError
from alibi_lm.extension import REMAP_METHODS, build_extension, remapped_scores
from alibi_lm.extension.rotary import rotate_with
from alibi_lm.extension.self_extend import fitting_group, largest_distance
from alibi_lm.plans.variants import VARIANTS, model_overrides
from alibi_lm.positions import POSITION_SCHEMES

BIAS_SCHEMES = ["alibi", "t5", "kerple_log", "kerple_power", "sandwich", "fire"]
ROTARY_SCHEMES = ["rope", "xpos"]


def grid(method, n: int):
    """(visible, d') of method over queries and keys 0..n-1, as nested lists (None where hidden or in the future)."""
    pos = torch.arange(n)
    remap = method.remap(pos, pos)
    d = remap.distance()
    seen = torch.ones(n, n, dtype=torch.bool) if remap.visible is None else remap.visible
    return [[float(d[i, j]) if j <= i and seen[i, j] else None for j in range(n)] for i in range(n)]


def closed_form(n: int, rule):
    """The same grid from a rule (i, j) -> d' or None, written from the papers' formulas."""
    return [[rule(i, j) if j <= i else None for j in range(n)] for i in range(n)]


def test_self_extend_is_its_closed_form_and_the_reference_example():
    method = build_extension("self_extend", {"group": 2, "window": 4}, train_len=8)
    rule = lambda i, j: i - j if i - j < 4 else i // 2 - j // 2 + 4 - 4 // 2  # noqa: E731
    assert grid(method, 12) == closed_form(12, rule)
    assert grid(method, 12)[11][0] == 7  # 5 - 0 + 4 - 2, worked by hand


def test_rerope_and_leaky_rerope_are_their_closed_forms():
    assert grid(build_extension("rerope", {"window": 4}, 8), 10) == closed_form(10, lambda i, j: min(i - j, 4))
    leaky = build_extension("leaky_rerope", {"window": 4, "factor": 4}, 8)
    assert grid(leaky, 14) == closed_form(14, lambda i, j: i - j if i - j < 4 else 4 + (i - j - 4) / 4)
    assert grid(leaky, 13)[12][0] == 6  # 4 + 8 / 4


def test_dual_chunk_attention_is_its_closed_form_with_the_reference_defaults():
    method = build_extension("dca", {}, train_len=16)
    assert (method.options.chunk, method.options.local) == (12, 1)  # 3L/4 and L/16: chunks of c = 11 tokens

    def rule(i, j):  # ChunkLlama: keys at j mod c; the query at i mod c, min(i mod c + c, C) or min(2c - 1, C)
        c, C = 11, 12
        gap = i // c - j // c
        q = i % c if gap == 0 else min(i % c + c, C) if gap == 1 else min(2 * c - 1, C)
        return q - j % c

    assert grid(method, 40) == closed_form(40, rule)
    by_hand = grid(method, 26)
    assert (by_hand[15][12], by_hand[25][20], by_hand[25][5]) == (3, 3, 7)  # intra, successive, inter


def test_streaming_is_its_closed_form():
    method = build_extension("streaming", {"sinks": 2, "window": 3}, train_len=8)
    rule = lambda i, j: i - j if i - j <= 3 else (min(i, 5) - j if j < 2 else None)  # noqa: E731
    assert grid(method, 12) == closed_form(12, rule)
    assert grid(method, 11)[10][:3] == [5, 4, None]  # the sinks at slots 0, 1 seen from slot 5


def test_lm_infinite_is_its_closed_form():
    method = build_extension("lm_infinite", {"n_global": 2, "n_local": 5, "limit": 3}, train_len=8)
    rule = lambda i, j: min(i - j, 3) if (j < 2 or i - j < 5) else None  # noqa: E731
    assert grid(method, 12) == closed_form(12, rule)


def test_defaults_follow_the_training_length():
    L = 64
    assert build_extension("streaming", {}, L).options.window == L - 4 - 1
    lm = build_extension("lm_infinite", {}, L).options
    assert (lm.n_global, lm.n_local, lm.limit) == (10, L, L)
    assert build_extension("rerope", {}, L).options.window == L // 8
    assert build_extension("self_extend", {}, L).options.window == L // 4


@pytest.mark.parametrize("eval_len", [64, 128, 256, 1024])
def test_self_extend_group_is_the_smallest_that_keeps_distances_below_L(eval_len):
    L, W = 64, 16
    G = fitting_group(eval_len, L, W)
    assert largest_distance(eval_len, G, W) < L and (G == 1 or largest_distance(eval_len, G - 1, W) >= L)
    method = build_extension("self_extend", {"window": W}, L)
    method.at_length(eval_len)
    pos = torch.arange(eval_len)
    assert method.remap(pos, pos).distance().tril().max() < L


@pytest.mark.parametrize("window", [64, 100])
def test_self_extend_with_a_window_of_L_or_more_and_no_group_is_refused(window):
    """Its fitting group is then 1 at every length: rows labelled self_extend-window64 were the plain model's."""
    with pytest.raises(ConfigError, match=rf"^extension.window={window} is not below L=64: .*choose extension.window "
                                          r"< 64, or set extension.group$"):
        build_extension("self_extend", {"window": window}, 64)
    assert build_extension("self_extend", {"window": window, "group": 2}, 64).group == 2  # groups past the window


IDENTITY = {  # settings under which each method changes nothing at 24 tokens
    "streaming": {"sinks": 2, "window": 30},
    "lm_infinite": {"n_global": 1, "n_local": 30, "limit": 30},
    "self_extend": {"group": 3, "window": 30},
    "rerope": {"window": 30},
    "leaky_rerope": {"window": 30, "factor": 4},
    "dca": {"chunk": 40, "local": 2},
}


@pytest.mark.parametrize("method", list(REMAP_METHODS))
@pytest.mark.parametrize("scheme", BIAS_SCHEMES + ROTARY_SCHEMES + ["nope"])
def test_identity_settings_reproduce_the_plain_model(scheme, method):
    model = make(scheme, attn_query_block=8)  # several query blocks: each block's remap and mask
    extension = build_extension(method, IDENTITY[method], train_len=16)
    if scheme == "nope" and not extension.hides_keys:
        return  # refused: test_refusals
    idx = tokens(2, 24)
    with torch.no_grad():
        plain = model(idx).log_softmax(-1)
        model.set_extension(extension)
        extended = model(idx).log_softmax(-1)
    torch.testing.assert_close(extended, plain, rtol=0, atol=2e-5)


@pytest.mark.parametrize("method,options", [("self_extend", {"group": 3, "window": 4}), ("rerope", {"window": 5}),
                                            ("leaky_rerope", {"window": 3, "factor": 2.5}), ("dca", {"chunk": 7, "local": 2}),
                                            ("streaming", {"sinks": 2, "window": 4}),
                                            ("lm_infinite", {"n_global": 2, "n_local": 6, "limit": 4})])
@pytest.mark.parametrize("scheme", ROTARY_SCHEMES)
def test_rotary_multi_pass_equals_a_rotation_by_the_remapped_distance(scheme, method, options):
    """Each pair's score q_i . k_j from the passes equals, in float64, the query rotated by d'(i, j) against the
    unrotated key (RoPE: R(a) q . R(b) k = R(a - b) q . k; xPos's scales multiply to zeta^((a - b) / gamma))."""
    rotary = make(scheme).position
    n, dh = 20, rotary.head_dim
    rotary.check_positions(n)
    gen = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 2, n, dh, generator=gen), torch.randn(1, 2, n, dh, generator=gen)
    pos = torch.arange(n)
    remap = build_extension(method, options, train_len=8).remap(pos, pos)
    scores = remapped_scores(rotary, q, k, remap)  # (1, 2, n, n)
    d = remap.distance()
    brute = torch.empty(n, n, dtype=torch.float64)
    for i in range(n):
        cos, sin = rotary.rotation64(d[i], 0)  # (n, Dh): the query rotated once per key, by d'(i, j)
        rotated = rotate_with(q[0, 1, i].double()[None], cos, sin)  # (n, Dh)
        brute[i] = (rotated * k[0, 1].double()).sum(-1) / math.sqrt(dh)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    torch.testing.assert_close(scores[0, 1][causal].double(), brute[causal], rtol=1e-5, atol=1e-5)
    assert remap.piece is not None and len(set(remap.piece[causal].tolist())) > 1  # the rule switches inside


@pytest.mark.parametrize("scheme", BIAS_SCHEMES)
def test_bias_schemes_take_the_remapped_distance_in_their_bias(scheme):
    """The folded mask of an extended block equals the scheme's own score_bias at key positions i - d'(i, j): the
    bias of distance d' (FIRE's normaliser keeps the query's i), -inf where hidden."""
    model = make(scheme)
    position = model.position
    method = build_extension("lm_infinite", {"n_global": 2, "n_local": 6, "limit": 4}, 8)
    n = 14
    pos = torch.arange(n)
    ctx = AttentionContext(position, MaskCache(), 0, 0, n, "cpu", 64, extension=method)
    with torch.no_grad():
        fold = ctx.fold(pos, pos, torch.float32)[0]  # (H, n, n)
        remap = method.remap(pos, pos)
        d = remap.distance().long()
        for i in range(n):
            for j in range(i + 1):
                seen = bool(remap.visible[i, j])
                expected = position.score_bias(pos[i : i + 1], (i - d[i, j]).reshape(1))[:, 0, 0] if seen else None
                if seen:
                    torch.testing.assert_close(fold[:, i, j], expected, rtol=1e-6, atol=1e-6)
                else:
                    assert torch.isneginf(fold[:, i, j]).all()


@pytest.mark.parametrize("scheme", ["rope", "alibi"])
def test_streaming_equals_the_token_by_token_cache_it_stands_for(scheme):
    """StreamingLLM's published protocol: one token at a time through a KV cache that keeps the first `sinks` keys
    and the last `window`, unrotated; every kept key rotated (RoPE) or biased (ALiBi, over slots, as MPT) at its slot
    in the cache, the query at the slot after them. Written out here layer by layer from the model's weights."""
    sinks, window, n = 2, 5, 20
    model = make(scheme)
    idx = tokens(1, n)
    with torch.no_grad():
        model.set_extension(build_extension("streaming", {"sinks": sinks, "window": window}, 8))
        blockwise = model(idx).log_softmax(-1)[0]  # (n, V)
        stepwise = streamed_logits(model, idx[0], sinks, window).log_softmax(-1)
    torch.testing.assert_close(blockwise, stepwise, rtol=0, atol=2e-5)


def streamed_logits(model, ids, sinks: int, window: int) -> torch.Tensor:
    """(n, V) logits of every token, scored one at a time: each layer's cache holds unrotated keys and values;
    after each token it keeps its first `sinks` entries and its last `window` (StartRecentKVCache's eviction)."""
    scheme, rotary = model.position, model.position.rotation_at(torch.zeros(1), 0) is not None
    caches = [([], []) for _ in model.blocks]  # per layer: kept keys, kept values, each (1, H, 1, Dh)
    logits = []
    for t in range(len(ids)):
        x = model.vocab.embed(ids[t : t + 1][None]) * model.embed_scale  # (1, 1, D)
        for block, (keys, values) in zip(model.blocks, caches):
            attn = block.attn
            q, k, v = attn.qkv(block.ln_attn(x)).view(1, 1, 3, attn.n_head, attn.head_dim).permute(2, 0, 3, 1, 4)
            keys.append(k)
            values.append(v)
            slots = torch.arange(len(keys))  # the cache's slots; the query sits at the last
            K, Vv = torch.cat(keys, 2), torch.cat(values, 2)  # (1, H, n, Dh)
            if rotary:
                q = rotate_with(q, *scheme.rotation_at(slots[-1:].double(), 0))
                K = rotate_with(K, *scheme.rotation_at(slots.double(), 1))
            scores = q @ K.transpose(-2, -1) / math.sqrt(attn.head_dim)  # (1, H, 1, n)
            if not rotary:
                scores = scores + scheme.score_bias(slots[-1:], slots)[None]
            y = attn.out((scores.softmax(-1) @ Vv).transpose(1, 2).reshape(1, 1, -1))
            x = x + y
            x = x + block.mlp(block.ln_mlp(x))
        logits.append(model.vocab.logits(model.ln_f(x))[0, 0])
        for keys, values in caches:  # evict: the sinks and the last `window` entries stay
            if len(keys) > sinks + window:
                del keys[sinks : len(keys) - window], values[sinks : len(values) - window]
    return torch.stack(logits)  # (n, V)


@pytest.mark.parametrize("scheme,why", [("sinusoidal", "added to the tokens at the input"),
                                        ("learned", "added to the tokens at the input"),
                                        ("fox", "content between query and key"), ("cope", "content between query")])
def test_absolute_and_content_aware_schemes_are_refused_in_one_line(scheme, why):
    model = make(scheme)
    for method in REMAP_METHODS:
        with pytest.raises(ConfigError, match=why) as e:
            model.set_extension(build_extension(method, {}, 16))
        assert "\n" not in str(e.value) and f"extension={method}" in str(e.value)


def test_nope_takes_only_methods_that_hide_keys():
    model = make("nope")
    for method in ("self_extend", "rerope", "leaky_rerope", "dca"):
        with pytest.raises(ConfigError, match="would change nothing"):
            model.set_extension(build_extension(method, {}, 16))
    model.set_extension(build_extension("streaming", {"sinks": 1, "window": 3}, 16))
    idx = tokens(1, 12)
    with torch.no_grad():
        hidden = model(idx)
        model.set_extension(None)
        full = model(idx)
    assert (hidden[:, 5:] - full[:, 5:]).abs().max() > 1e-4  # the hidden keys do change a NoPE model
    torch.testing.assert_close(hidden[:, :5], full[:, :5], rtol=0, atol=2e-5)


def test_bad_options_are_one_line_errors():
    with pytest.raises(ConfigError, match="extension.window must be >= 1"):
        build_extension("rerope", {"window": 0}, 16)
    with pytest.raises(ConfigError, match="has no key 'windw'"):
        build_extension("rerope", {"windw": 3}, 16)
    with pytest.raises(ConfigError, match="extension must be one of"):
        build_extension("selfextend", {}, 16)
    with pytest.raises(ConfigError, match="must exceed extension.local"):
        build_extension("dca", {"chunk": 4, "local": 4}, 16)
    for method, factor in (("yarn", -1), ("yarn", math.inf), ("ntk", 1e308), ("dynamic", 1e300), ("linear", 2e9)):
        with pytest.raises(ConfigError, match=r"^extension.factor must be (a finite number )?in \[1.0, 1000000000.0\], got"):
            build_extension(method, {"factor": factor}, 16)


def test_labels_name_the_values_set():
    assert build_extension("self_extend", {}, 64).label() == "self_extend"
    assert build_extension("self_extend", {"group": 4, "window": 32}, 64).label() == "self_extend-group4-window32"
    assert build_extension("yarn", {}, 64).label() == "yarn" and build_extension("yarn", {"factor": 4}, 64).label() == "yarn-x4"
    # a value :g would round is written in full: two settings never share a label (and a rerun never their rows)
    assert build_extension("yarn", {"factor": 4.0000001}, 64).label() == "yarn-x4.0000001"
    assert build_extension("self_extend", {"window": 1000001}, 2**21).label() == "self_extend-window1000001"
    assert build_extension("self_extend", {"window": 1000000}, 2**21).label() == "self_extend-window1e+06"


def test_kv_cache_steps_equal_the_whole_window_under_an_extension():
    from alibi_lm.model import KVCache

    for scheme in ("rope", "alibi"):
        model = make(scheme)
        model.set_extension(build_extension("self_extend", {"group": 2, "window": 4}, 8))
        idx = tokens(1, 14)
        with torch.no_grad():
            full = model(idx)
            cache = KVCache(model.cfg.n_layer)
            steps = torch.cat([model(idx[:, t : t + 1], start_pos=t, cache=cache) for t in range(14)], 1)
        torch.testing.assert_close(steps, full, rtol=0, atol=2e-5)


# ---- metrics: key-token perplexity (LongPPL), effective length, attention sinks ------------------------------


class ContextLengthScorer(torch.nn.Module):
    """A fake model whose loss depends only on the context a target has in its window: 10 / (p + 1) at position p."""

    def forward(self, idx, targets=None):
        p = torch.arange(idx.shape[1], dtype=torch.float32)
        return (10.0 / (p + 1))[None].expand(idx.shape[0], -1)  # (B, T)


def test_key_token_perplexity_counts_the_targets_the_papers_rule_names():
    from alibi_lm.eval.scoring import KeyTokens, score_stream, short_context_nll

    stream, L, Lv = np.arange(201), 8, 32  # 200 targets: the last window of 8 ends at the stream's end
    short = short_context_nll(ContextLengthScorer(), stream, L)
    # by hand: windows of 8 advancing by 4; the first scores targets 0..7 at positions 0..7, every later one its last
    # 4 targets at positions 4..7
    expected_short = np.array([10 / (t + 1) if t < L else 10 / (4 + (t - L) % 4 + 1) for t in range(200)])
    np.testing.assert_allclose(short, expected_short)
    r = score_stream(ContextLengthScorer(), stream, Lv, key=KeyTokens(short, L, alpha=0.5, beta=1.1))
    full = np.array([10 / (t % Lv + 1) for t in range(200)])
    key = (np.arange(200) % Lv >= L) & (full < 1.1) & (expected_short - full > 0.5)
    assert r.key_tokens == key.sum() > 0
    assert r.key_ppl == pytest.approx(math.exp(full[key].mean()))
    assert score_stream(ContextLengthScorer(), stream, Lv).key_tokens is None


def test_first_token_mass_of_uniform_attention_is_its_closed_form():
    """With zero query and key weights NoPE attends uniformly: query i puts n_first / (i + 1) on the first tokens."""
    from alibi_lm.eval.sinks import first_token_mass

    model = make("nope")
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight[: 2 * 32].zero_()
            block.attn.qkv.bias[: 2 * 32].zero_()
    mass = first_token_mass(model, np.arange(100) % V, eval_len=16, n_first=2, windows=3)
    expected = np.mean([2 / (i + 1) for i in range(2, 16)])
    np.testing.assert_allclose(mass, np.full((2, 4), expected), rtol=1e-5)
    model.set_extension(build_extension("streaming", {"sinks": 2, "window": 3}, 8))  # the sinks kept: more mass there
    assert (first_token_mass(model, np.arange(100) % V, 16, 2, 3) > mass + 0.1).all()


# ---- the same layer on Hugging Face models: a tiny random Llama (RoPE) and BLOOM (ALiBi), no download ----------


def tiny_llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # sharper attention than the 0.02 init gives, so that distances matter to the logits
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(30)
            layer.self_attn.k_proj.weight.mul_(30)
    return model


def tiny_bloom():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.BloomForCausalLM(transformers.BloomConfig(vocab_size=V, hidden_size=32, n_layer=2, n_head=4))
    with torch.no_grad():
        for block in model.transformer.h:
            block.self_attention.query_key_value.weight.mul_(30)
    return model.eval()


def brute_force_llama_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Each pair scored in float64 from the unrotated q and k, the query rotated once per key by d'(i, j)."""
    method, rotary = module.alibi_lm_extension
    T, groups = query.shape[2], query.shape[1] // key.shape[1]
    pos = torch.arange(T)
    q, k = rotary.unrotate(query, pos).double(), rotary.unrotate(key, pos).double().repeat_interleave(groups, 1)
    remap = method.remap(pos, pos)
    d = remap.distance()
    scores = torch.full((*q.shape[:2], T, T), float("-inf"), dtype=torch.float64)
    for i in range(T):
        cos, sin = (t.double() for t in rotary.tables(d[i]))  # (T, Dh): R(d'(i, j)) for every key j
        rotated = (q[:, :, i : i + 1] * cos + torch.cat(q[:, :, i : i + 1].chunk(2, -1)[::-1], -1) * sin)
        row = (rotated * k).sum(-1) * rotary.scaling**2 * scaling  # (B, H, T)
        seen = (pos <= i) & (remap.visible[i] if remap.visible is not None else True)
        scores[:, :, i] = torch.where(seen, row, float("-inf"))
    probs = scores.softmax(-1)
    return (probs @ value.double().repeat_interleave(groups, 1)).to(value.dtype).transpose(1, 2).contiguous(), probs


@pytest.mark.parametrize("method,options", [("self_extend", {"group": 2, "window": 4}), ("dca", {"chunk": 6, "local": 1}),
                                            ("streaming", {"sinks": 2, "window": 3}), ("leaky_rerope", {"window": 3})])
def test_a_hugging_face_llama_takes_the_same_remap(method, options):
    from transformers import AttentionInterface

    from alibi_lm.extension.hf import install_llama

    model, idx = tiny_llama(), tokens(2, 20)
    extension = build_extension(method, options, train_len=8)
    with torch.no_grad():
        plain = model(input_ids=idx).logits
        install_llama(model, build_extension(method, {k: 40 if k in ("window", "chunk") else v
                                                      for k, v in options.items()}, 8))  # identity settings
        torch.testing.assert_close(model(input_ids=idx).logits, plain, rtol=0, atol=2e-5)
        install_llama(model, extension)
        extended = model(input_ids=idx).logits
        AttentionInterface.register("brute_force_test", brute_force_llama_attention)
        model.set_attn_implementation("brute_force_test")
        brute = model(input_ids=idx).logits
        install_llama(model, None)
        torch.testing.assert_close(model(input_ids=idx).logits, plain, rtol=0, atol=2e-5)
    assert (extended - plain).abs().max() > 1e-3  # the remap does change this model
    torch.testing.assert_close(extended, brute, rtol=0, atol=2e-5)


def test_a_hugging_face_bloom_takes_the_remapped_alibi_bias():
    """BLOOM with lm_infinite equals the same weights given, block by block, a bias built from the closed form."""
    from alibi_lm.extension.hf import install_bloom
    from alibi_lm.positions.alibi import alibi_slopes

    model, idx, T = tiny_bloom(), tokens(2, 20), 20
    with torch.no_grad():
        plain = model(input_ids=idx).logits
        install_bloom(model, build_extension("lm_infinite", {"n_global": 40, "n_local": 40, "limit": 40}, 8))
        torch.testing.assert_close(model(input_ids=idx).logits, plain, rtol=0, atol=2e-5)
        install_bloom(model, build_extension("lm_infinite", {"n_global": 2, "n_local": 6, "limit": 4}, 8))
        extended = model(input_ids=idx).logits
        install_bloom(model, None)
        bias = torch.tensor([[-min(i - j, 4) if j <= i and (j < 2 or i - j < 6) else -1e30 for j in range(T)]
                             for i in range(T)])  # distance, or hidden

        def closed_form(block, args, kwargs):
            kwargs["alibi"] = (alibi_slopes(4)[:, None, None] * bias.clamp(min=-4)[None]).repeat(2, 1, 1)
            kwargs["attention_mask"] = torch.where(bias < -1e29, torch.finfo(torch.float32).min, 0.0)[None, None]
            return args, kwargs

        handles = [block.register_forward_pre_hook(closed_form, with_kwargs=True) for block in model.transformer.h]
        reference = model(input_ids=idx).logits
        for h in handles:
            h.remove()
    assert (extended - plain).abs().max() > 1e-3
    torch.testing.assert_close(extended, reference, rtol=0, atol=2e-5)


# ---- the evaluate app: extension=<method>, its rows, LongPPL columns, the position.scaling alias ----------------


@pytest.fixture
def fake_data(monkeypatch):
    return fake_run_data(monkeypatch, V, 16 * 8 + 1)


def evaluated(tmp_path, scheme, name="exp", **kwargs):
    from conftest import write_run
    from omegaconf import OmegaConf

    from alibi_lm.eval import evaluation

    run = tmp_path / "runs" / name / f"{scheme}-L16-seed0"
    if not run.exists():
        write_run(tmp_path, make(scheme), 16, name=name)
    ev = OmegaConf.create(dict(split="valid", mode="nonoverlapping", multipliers=[1, 2, 4], tokens_per_batch=256,
                               longppl=kwargs.pop("longppl", False), longppl_alpha=0.0, longppl_beta=20.0))
    return evaluation.evaluate_run(run, ev, tmp_path / "results", device="cpu", progress=False, **kwargs)


def test_the_evaluate_app_scores_a_method_into_rows_of_its_own(tmp_path, fake_data):
    from alibi_lm.extension import OPTIONS
    from alibi_lm.results import store

    plain = evaluated(tmp_path, "alibi")
    same = evaluated(tmp_path, "alibi", extension_cfg=OPTIONS["lm_infinite"](n_global=1, n_local=100, limit=100))
    capped = evaluated(tmp_path, "alibi", extension_cfg=OPTIONS["lm_infinite"](limit=8), longppl=True)
    assert [r["rope_scaling"] for r in same] == ["lm_infinite-n_global1-n_local100-limit100"] * 3
    assert [r["rope_scaling"] for r in capped] == ["lm_infinite-limit8"] * 3
    assert [r["ppl"] for r in same] == pytest.approx([r["ppl"] for r in plain], rel=1e-5)  # the identity settings
    assert abs(capped[0]["ppl"] - plain[0]["ppl"]) > 1e-3  # distances 8..15 capped even at L
    assert all(r["longppl_alpha"] == 0 for r in capped)  # key: past L, and better with the whole window than cut
    expected = expected_key_tokens(tmp_path, {"limit": 8})
    assert [r["key_tokens"] for r in capped] == [0, *expected] and min(expected) > 0
    df = store.read_results(tmp_path / "results" / "exp" / store.CSV_NAME)
    assert len(df) == 9 and df["key_ppl"].notna().sum() == 2  # Lv = 2L and 4L of the LongPPL rows
    assert df["key_tokens"].notna().sum() == 3  # Lv = L too: 0 key tokens, no key_ppl


def expected_key_tokens(tmp_path, options: dict) -> list[int]:
    """Targets at window positions >= L = 16 whose full-window loss is below their cut-context loss, at Lv = 32 and 64,
    counted from the model's own per-target losses (the same weights as the evaluated run)."""
    from alibi_lm.eval.scoring import short_context_nll

    model = make("alibi")
    model.set_extension(build_extension("lm_infinite", options, 16))
    stream = np.random.default_rng(5).integers(0, V, 16 * 8 + 1)
    with torch.no_grad():
        short = short_context_nll(model, stream, 16)
        counts = []
        for Lv in (32, 64):
            idx = torch.from_numpy(stream[:-1].reshape(-1, Lv)), torch.from_numpy(stream[1:].reshape(-1, Lv))
            full = model(idx[0], targets=idx[1]).numpy().reshape(-1)  # (128,) in stream order
            past_L = np.arange(128) % Lv >= 16
            counts.append(int((past_L & (short - full > 0) & (full < 20)).sum()))
    return counts


def test_position_scaling_is_an_alias_of_the_rescaling_methods(tmp_path, fake_data):
    from alibi_lm.extension import OPTIONS

    old = evaluated(tmp_path, "rope", "old", position_cfg={"scaling": "yarn", "scaling_factor": 4})
    new = evaluated(tmp_path, "rope", "new", extension_cfg=OPTIONS["yarn"](factor=4))
    assert [r["rope_scaling"] for r in old] == [r["rope_scaling"] for r in new] == ["yarn-x4"] * 3
    assert [r["ppl"] for r in old] == [r["ppl"] for r in new]
    with pytest.raises(UserError, match="keep one"):
        evaluated(tmp_path, "rope", "new", extension_cfg=OPTIONS["yarn"](), position_cfg={"scaling": "yarn"})


def test_the_evaluate_app_refuses_a_method_that_does_not_fit_in_one_line(tmp_path, fake_data):
    from alibi_lm.extension import OPTIONS

    with pytest.raises(UserError, match="position=sinusoidal: its absolute positions") as e:
        evaluated(tmp_path, "sinusoidal", extension_cfg=OPTIONS["self_extend"]())
    assert "\n" not in str(e.value) and not (tmp_path / "results").exists()
    with pytest.raises(UserError, match="applies to runs trained with position=rope, not position=alibi"):
        evaluated(tmp_path, "alibi", extension_cfg=OPTIONS["yarn"]())


def test_the_preflight_refuses_a_remap_with_block_attention_and_takes_a_rescaling_with_it():
    """eval.attention=bca with extension=streaming passed the preflight and failed in the model's forward, after the
    plan and the progress bar, with a traceback."""
    from conftest import compose_job

    from alibi_lm.eval.app import check

    for method in ("streaming", "dca", "self_extend", "lm_infinite"):
        with pytest.raises(UserError, match=rf"^extension={method} remaps positions over full attention, and "
                                            r"eval.attention=bca limits it: .*drop one$"):
            check(compose_job("evaluate", f"extension={method}", "eval.attention=bca"))
    check(compose_job("evaluate", "extension=yarn", "eval.attention=bca"))  # a rescaling: RoPE's own, with any window


def test_extension_composes_from_the_command_line():
    from conftest import compose_job

    job = compose_job("evaluate", "extension=self_extend", "extension.group=4", "extension.window=32")
    assert type(job.extension).__name__ == "SelfExtendOptions" and (job.extension.group, job.extension.window) == (4, 32)
    assert compose_job("evaluate").extension is None


# ---- short fine-tuning at s L from a trained run -------------------------------------------------------------


def test_a_finetune_starts_from_its_parent_and_spends_its_fraction(ws):
    """Train a parent at L = 16, fine-tune it at 4L for 25% of its tokens: the child starts from the parent's
    weights, takes ceil(0.25 * parent tokens / tokens per step) steps, records both in finetune.json, and its rows
    are labelled <scheme>+ft4x0.25 at the parent's L."""
    import json

    from conftest import compose_job

    from alibi_lm.checkpoint import load_checkpoint
    from alibi_lm.training.trainer import Trainer

    common = ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "model.adaptive_cutoffs=null", "data=wikitext2",
              f"data.root={ws}/data", f"paths.cache={ws}/cache", "train.progress=false", "train.device=cpu",
              "train.eval_tokens=256", "train.batch_size=4", "train.warmup_steps=1", "logger.wandb.mode=disabled",
              "position=alibi"]
    parent_dir, child_dir = ws / "runs" / "ft" / "alibi-L16-seed0", ws / "runs" / "ft" / "alibi-L16-seed0-ft4x0.25"
    Trainer(compose_job("train", *common, "train.seq_len=16", "train.max_steps=16", "train.eval_every=16",
                        "train.checkpoint_every=16"), parent_dir).run()
    with pytest.raises(ConfigError, match="sets the budget"):
        compose_job("train", *common, f"train.init_from={parent_dir}", "train.finetune_fraction=0.25")
    job = compose_job("train", *common, "train.seq_len=64", "train.max_steps=null", f"train.init_from={parent_dir}",
                      "train.finetune_fraction=0.25", "train.eval_every=100", "train.checkpoint_every=100",
                      "train.batch_size=2")
    trainer = Trainer(job, child_dir)
    trainer.build()
    parent = load_checkpoint(parent_dir / "checkpoint.pt")
    assert trainer.steps == math.ceil(0.25 * (16 * 4 * 16) / (2 * 64)) == 2  # a quarter of the parent's tokens
    record = json.loads((child_dir / "finetune.json").read_text())
    assert (record["parent_train_len"], record["scale"], record["fraction"], record["steps"]) == (16, 4, 0.25, 2)
    from alibi_lm.training.finetune import start_from_parent

    start_from_parent(trainer.model, parent, parent_dir)
    for name, value in trainer.model.state_dict().items():
        torch.testing.assert_close(value, parent["model"][name])
    Trainer(job, child_dir).run()
    from alibi_lm.subjects import open_native

    subject = open_native(child_dir, ws / "results", torch.device("cpu"))
    assert (subject.identity["position"], subject.identity["train_len"]) == ("alibi+ft4x0.25", 16)


def test_the_comparison_picks_the_methods_each_scheme_takes():
    from alibi_lm.plans.extension.runs import methods_for

    assert methods_for("rope") == [*REMAP_METHODS, "linear", "ntk", "yarn"]
    assert methods_for("alibi") == list(REMAP_METHODS) and methods_for("fire") == list(REMAP_METHODS)
    assert methods_for("nope") == ["streaming", "lm_infinite"]
    assert methods_for("sinusoidal") == methods_for("learned") == methods_for("fox") == []


def test_the_evaluate_app_extends_a_hugging_face_llama_and_bloom(tmp_path):
    """Evaluation of a Hugging Face scorer (subjects/hf.py) with extension=<method>: rows carry its label, identity
    settings give the plain rows' perplexity, the method itself changes it."""
    from conftest import HandMadeSubject
    from omegaconf import OmegaConf

    from alibi_lm.eval.evaluation import Evaluation
    from alibi_lm.extension import OPTIONS
    from alibi_lm.subjects.hf import HFScorer

    stream = np.random.default_rng(2).integers(0, V, 8 * 16 + 1)
    ev = OmegaConf.create(dict(split="valid", mode="nonoverlapping", multipliers=[1, 4], tokens_per_batch=256))
    for name, model, method in (("llama", tiny_llama(), "self_extend"), ("bloom", tiny_bloom(), "lm_infinite")):
        def rows(options, out, model=model, name=name):
            subject = HandMadeSubject(HFScorer(model), stream, dict(position=f"hf:{name}", train_len=16, seed=None),
                                      dict(run=name, step=None, weights="w", data="toy", commit="c", device="cpu"),
                                      tmp_path / out)
            return Evaluation(subject, ev, progress=False, extension_cfg=options).run()

        plain = rows(None, f"{name}-plain")
        wide = {"window": 100, "group": 2} if method == "self_extend" else {"n_local": 100, "limit": 100}  # past every Lv
        same = rows(OPTIONS[method](**wide), f"{name}-same")
        extended = rows(OPTIONS[method](), f"{name}-extended")
        assert [r["rope_scaling"] for r in extended] == [method] * 2
        assert [r["ppl"] for r in same] == pytest.approx([r["ppl"] for r in plain], rel=1e-5)
        assert extended[1]["ppl"] != pytest.approx(plain[1]["ppl"], rel=1e-4)


def run_with_model_config(tmp_path: Path, position: str, **model) -> Path:
    """A run folder whose config.yaml carries its model node, as train.py writes it."""
    from dataclasses import asdict

    from conftest import write_run
    from omegaconf import OmegaConf

    run = write_run(tmp_path, make(position, **model), L=16)
    cfg = OmegaConf.load(run / "config.yaml")
    cfg.model = asdict(make(position, **model).cfg)
    (run / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    return run


def test_the_preflight_refuses_each_run_of_a_sweep_that_a_method_does_not_fit(tmp_path):
    """`eval -m run=<rope>,<alibi> extension=yarn` scored the rope run, then stopped at the alibi one: each
    cell's run is checked against the method from its config alone, before any cell is scored."""
    import json

    from conftest import compose_job

    from alibi_lm.eval.app import check

    rope, alibi, window = (run_with_model_config(tmp_path, p, **m) for p, m in
                           (("rope", {}), ("alibi", {}), ("nope", {"local_window": 8})))
    check(compose_job("evaluate", f"run={rope}", "extension=yarn"))
    check(compose_job("evaluate", f"run={alibi}", "extension=self_extend"))  # a bias: its distances remapped
    with pytest.raises(UserError, match=rf"^{alibi}: the RoPE rescaling yarn .* not position=alibi; drop it$"):
        check(compose_job("evaluate", f"run={alibi}", "extension=yarn"))
    with pytest.raises(UserError, match=rf"^{alibi}: the RoPE rescaling linear"):
        check(compose_job("evaluate", f"run={alibi}", "position.scaling=linear"))
    with pytest.raises(UserError, match=rf"^{window}: extension=streaming cannot extend a model trained with "
                                        r"model.local_window"):
        check(compose_job("evaluate", f"run={window}", "extension=streaming"))
    with pytest.raises(UserError, match=rf"^{rope}: extension.window=16 is not below L=16"):
        check(compose_job("evaluate", f"run={rope}", "extension=self_extend", "extension.window=16"))
    # a fine-tune at 2L: its rows and its extensions are at the parent's L (8), as the evaluation builds them
    (rope / "finetune.json").write_text(json.dumps(dict(parent_train_len=8, scale=2.0, fraction=0.05)))
    check(compose_job("evaluate", f"run={rope}", "extension=self_extend", "extension.window=7"))
    with pytest.raises(UserError, match=rf"^{rope}: extension.window=10 is not below L=8"):
        check(compose_job("evaluate", f"run={rope}", "extension=self_extend", "extension.window=10"))
    assert not (tmp_path / "runs" / "exp" / "results").exists()


@pytest.mark.parametrize("name", [*POSITION_SCHEMES, *VARIANTS])
def test_every_scheme_and_variant_has_a_skeleton_for_the_preflight(name, tmp_path):
    """The preflight builds a run's model on the meta device; a scheme that reads a tensor's value while it is built
    (xPos's range did) would leave it without a check or stop it with a traceback."""
    from dataclasses import asdict

    from conftest import compose_job
    from omegaconf import OmegaConf

    from alibi_lm.subjects import run_skeleton

    model = compose_job("train", *model_overrides(name, 2, 16), "train.seq_len=16").model
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create({"model": asdict(model),
                                                                          "train": {"seq_len": 16}})))
    scorer, train_len = run_skeleton(run)
    assert train_len == 16 and scorer.model.cfg.position == model.position
    assert next(scorer.model.parameters()).device.type == "meta"


def test_a_scheme_with_a_score_bias_but_no_distance_bias_is_told_what_to_add():
    """A new scheme that gives score_bias alone (tests/example_scheme.py's example_sdpa, as docs/position-schemes.md
    shows it) was told it "has no distances: it would change nothing"; it has a bias an extension cannot remap."""
    from alibi_lm.extension import scheme_kind
    from alibi_lm.extension.base import check_scheme
    from alibi_lm.plans.extension.runs import methods_for

    scheme = POSITION_SCHEMES["example_sdpa"]
    assert scheme_kind(scheme) == "score" and scheme_kind(POSITION_SCHEMES["alibi"]) == "bias"
    for method in REMAP_METHODS.values():
        with pytest.raises(ConfigError, match=r"^extension=\w+ cannot extend position=example_sdpa: it gives "
                                              r"score_bias\(q_pos, k_pos\) but no distance_bias\(q_pos, distance\)"):
            check_scheme(method, scheme, "example_sdpa")
    assert methods_for("example_sdpa") == [] and "streaming" in methods_for("nope")
