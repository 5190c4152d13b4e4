"""The decoder with every position scheme: causality, KV cache, shifts, long inputs, blocking, vocab."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import ATOL, V, make, shift_invariant, tokens

from alibi_lm.attention import MaskCache
from alibi_lm.errors import ConfigError
from alibi_lm.model import KVCache, LMConfig, TransformerLM
from alibi_lm.positions import POSITION_SCHEMES, PositionRangeError, PositionScheme
from alibi_lm.vocab import AdaptiveVocabulary, TiedVocabulary

SCHEMES = list(POSITION_SCHEMES)  # the test scheme (conftest) included


def test_the_registry_holds_the_built_in_schemes_in_the_papers_order_and_the_test_scheme():
    assert SCHEMES[:6] == ["sinusoidal", "learned", "t5", "rope", "alibi", "nope"] and "example" in SCHEMES


def test_shift_invariance_is_declared_consistently():
    assert any(map(shift_invariant, SCHEMES)) and not all(map(shift_invariant, SCHEMES))
    for name in SCHEMES:
        cls = POSITION_SCHEMES[name]
        if cls.relative_bias:  # a bias of i - j only (and nothing absolute elsewhere) is shift invariant
            assert cls.shift_invariant, name
        if cls.embedding is not PositionScheme.embedding or (cls.score_bias is not PositionScheme.score_bias
                                                              and not cls.relative_bias):
            assert not cls.shift_invariant, name  # added at the input, or a bias of absolute positions


@pytest.mark.parametrize("block", [1024, 8])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_causality(scheme, block):
    model = make(scheme, attn_query_block=block)
    idx = tokens(2, 24)
    t = 13
    changed = idx.clone()
    changed[:, t] = (changed[:, t] + 1) % V
    with torch.no_grad():
        a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :t], b[:, :t], rtol=0, atol=ATOL)
    seen = (a[:, t:] - b[:, t:]).abs().amax(-1)  # (B, T - t): how much each later position moved
    assert seen.min() > 1e-4, (  # every later position does see it
        f"a later position moved by {seen.min():.2g} when token {t} changed: not a leak, a check that nothing hides "
        f"an earlier token; a scheme's bias steep enough to push it under 1e-4 on this 2-layer model fails it")


@pytest.mark.parametrize("scheme", SCHEMES)
def test_kv_cache_parity(scheme):
    model = make(scheme)
    idx = tokens(2, 21)
    with torch.no_grad():
        full = model(idx)
        cache = KVCache(model.cfg.n_layer)
        steps = [model(idx[:, t : t + 1], start_pos=t, cache=cache) for t in range(idx.shape[1])]
        torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=ATOL)
        assert (cache.start, cache.end) == (0, 21)
        assert cache.keys[0].shape == (2, 4, 21, 8)
        cache, chunks, t = KVCache(model.cfg.n_layer), [], 0
        for n in (5, 1, 7, 8):
            chunks.append(model(idx[:, t : t + n], start_pos=t, cache=cache))
            t += n
        torch.testing.assert_close(torch.cat(chunks, 1), full, rtol=0, atol=ATOL)
        with pytest.raises(ValueError, match="does not continue"):
            model(idx[:, :1], start_pos=3, cache=cache)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_greedy_generate_matches_naive_loop(scheme):
    model = make(scheme)
    prompt = tokens(2, 7)
    out = model.generate(prompt, max_new_tokens=15, temperature=0.0)
    assert out.shape == (2, 22)
    assert torch.equal(out[:, :7], prompt)
    seq = prompt
    with torch.no_grad():
        for _ in range(15):
            nxt = model(seq)[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], 1)
    assert torch.equal(out, seq)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_shift_of_all_positions(scheme):
    model = make(scheme)
    idx = tokens(2, 20)
    with torch.no_grad():
        logits0, probs0 = model(idx, return_attention=True)
        logits37, probs37 = model(idx, start_pos=37, return_attention=True)
    assert len(probs0) == model.cfg.n_layer and probs0[0].shape == (2, 4, 20, 20)
    torch.testing.assert_close(probs0[0].sum(-1), torch.ones(2, 4, 20))
    assert (probs0[0].triu(1) == 0).all()  # no weight on the future
    if shift_invariant(scheme):
        for p0, p37 in zip(probs0, probs37):
            torch.testing.assert_close(p37, p0, rtol=0, atol=ATOL)
        torch.testing.assert_close(logits37, logits0, rtol=0, atol=ATOL)
    else:
        assert (probs37[-1] - probs0[-1]).abs().max() > 1e-3
        assert (logits37 - logits0).abs().max() > 1e-3
    # return_attention takes the explicit path; its logits equal the fused path's
    with torch.no_grad():
        torch.testing.assert_close(model(idx, start_pos=37), logits37, rtol=0, atol=ATOL)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_runs_at_eight_times_the_training_length(scheme):
    L = 40
    if scheme == "learned":
        model = make(scheme, position_options={"max_len": L})
        with torch.no_grad():
            assert model(tokens(1, L)).shape == (1, L, V)  # exactly max_len works
            with pytest.raises(PositionRangeError, match="max_len"):
                model(tokens(1, 8 * L))
            with pytest.raises(PositionRangeError, match="max_len"):
                model(tokens(1, 1), start_pos=L)  # one past the table through a cache offset too
        return
    model = make(scheme)
    idx = tokens(1, 8 * L)  # 320: beyond rope's initial 256-row table, t5's max_distance 128, sinusoidal's L
    with torch.no_grad():
        long = model(idx)
        short = model(idx[:, :L])
    assert long.shape == (1, 8 * L, V) and torch.isfinite(long).all()
    torch.testing.assert_close(long[:, :L], short, rtol=0, atol=ATOL)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_query_blocked_attention_parity(scheme):
    blocked = make(scheme, attn_query_block=8)
    whole = make(scheme, seed=5, attn_query_block=100_000)
    whole.load_state_dict(blocked.state_dict())
    idx = tokens(2, 40)
    with torch.no_grad():
        ref = whole(idx)
        torch.testing.assert_close(blocked(idx), ref, rtol=0, atol=ATOL)
        # with a KV cache offset: 13 tokens first, then 27 at once (4 blocks, not aligned at 8)
        for model in (blocked, whole):
            cache = KVCache(model.cfg.n_layer)
            head = model(idx[:, :13], cache=cache)
            tail = model(idx[:, 13:], start_pos=13, cache=cache)
            torch.testing.assert_close(torch.cat([head, tail], 1), ref, rtol=0, atol=ATOL)


def test_static_bias_cache_is_reused_and_keyed_by_position():
    model = make("alibi")
    calls = []
    original = model.position.score_bias
    model.position.score_bias = lambda q, k: calls.append((q[0].item(), len(q), len(k))) or original(q, k)
    idx = tokens(2, 12)
    with torch.no_grad():
        first = model(idx)
        assert len(calls) == 1  # built once, shared by both layers
        keys = list(model.masks)
        assert len(keys) == 1
        second = model(idx)
        assert len(calls) == 1, "the second forward of the same shape must hit the model's static mask cache"
        assert torch.equal(first, second)
        assert list(model.masks) == keys
        # the bias is relative: shifting every position keeps the offsets, so the entry is reused
        shifted = model(idx, start_pos=5)
        assert len(calls) == 1 and list(model.masks) == keys
        # a KV-cache continuation puts queries 5 positions after the first key: a larger offset
        # grows the entry (keyed by block rows, device, dtype) rather than adding one per position
        cache = KVCache(model.cfg.n_layer)
        model(idx[:, :5], cache=cache)
        cont = model(idx[:, 5:10], start_pos=5, cache=cache)
        assert len(calls) == 3  # 5 rows at offset 0; then 5 rows at offset 5 (grown in place)
        (entry,) = [v for key, v in model.masks.items() if key[0] == 5]
        assert entry[1] == 5
        model(idx[:, 10:11], start_pos=10, cache=cache)  # 1 row at offset 10: its own small entry
        # and the cached answers are right: a fresh copy with an empty cache agrees
        fresh = copy.deepcopy(model)
        fresh.masks.clear()
        fresh.position.score_bias = original.__func__.__get__(fresh.position)
        torch.testing.assert_close(shifted, fresh(idx, start_pos=5), rtol=0, atol=0)
        torch.testing.assert_close(second, fresh(idx), rtol=0, atol=0)
        fresh_cache = KVCache(model.cfg.n_layer)
        fresh(idx[:, :5], cache=fresh_cache)
        torch.testing.assert_close(cont, fresh(idx[:, 5:10], start_pos=5, cache=fresh_cache), rtol=0, atol=0)
        for T in range(1, 12):  # 12 block sizes in all, more than the cache holds
            model(idx[:, :T])
        assert len(model.masks) == MaskCache.LIMIT  # bounded: the least recently used went


def test_learned_bias_is_never_cached():
    model = make("t5")
    idx = tokens(1, 10)
    with torch.no_grad():
        before = model(idx)
        model.position.bias_table.weight.add_(torch.randn_like(model.position.bias_table.weight))
        after = model(idx)
        fresh = copy.deepcopy(model)
        again = fresh(idx)  # under no_grad like `after`: with grad, SDPA takes another kernel (~1e-7 apart)
    assert len(model.masks) == 0
    assert (after - before).abs().max() > 1e-3
    torch.testing.assert_close(after, again, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# Vocabulary: tying and the adaptive softmax


def test_tied_vocabulary_shares_one_table():
    model = make("alibi")
    assert isinstance(model.vocab, TiedVocabulary)
    params = list(model.vocab.parameters())
    assert len(params) == 1 and params[0].data_ptr() == model.vocab.weight.data_ptr()
    # no other (V, D) matrix anywhere in the model
    assert [n for n, p in model.named_parameters() if p.shape[0] == V] == ["vocab.weight"]
    h = torch.randn(3, 32)
    torch.testing.assert_close(model.vocab.logits(h), h @ model.vocab.embed(torch.arange(V)).t())
    # the gradient of the output layer lands in the input table
    model.vocab.logits(h).sum().backward()
    assert model.vocab.weight.grad is not None and model.vocab.weight.grad.abs().sum() > 0


def test_adaptive_vocabulary_is_tied_and_nll_matches_logits():
    model = make("alibi", adaptive_cutoffs=[20, 50], adaptive_factor=2)
    vocab = model.vocab
    assert isinstance(vocab, AdaptiveVocabulary)
    assert [tuple(t.shape) for t in vocab.tables] == [(20, 32), (30, 16), (47, 8)]
    expected = sum(t.numel() for t in vocab.tables) + sum(p.numel() for p in vocab.projections)
    expected += vocab.cluster_logits.weight.numel()
    assert sum(p.numel() for p in vocab.parameters()) == expected == 20 * 32 + 30 * 16 + 47 * 8 + 32 * 56 + 2 * 32
    assert not any(p.shape[0] == V for p in model.parameters())  # no (V, D) output matrix
    idx = tokens(2, 16)
    targets = torch.cat([torch.tensor([[0, 19, 20, 49, 50, 96]] * 2), tokens(2, 10, seed=2)], 1)
    with torch.no_grad():
        logits = model(idx)
        torch.testing.assert_close(logits.logsumexp(-1), torch.zeros(2, 16), rtol=0, atol=ATOL)
        ref = -F.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)
        nll = model(idx, targets=targets)
    assert nll.shape == (2, 16)
    torch.testing.assert_close(nll, ref, rtol=0, atol=ATOL)
    # embed: each band is its table row through its projection
    emb = vocab.embed(torch.tensor([[3, 25, 60]]))[0]
    torch.testing.assert_close(emb[1], vocab.projections[1] @ vocab.tables[1][5])
    torch.testing.assert_close(emb[2], vocab.projections[2] @ vocab.tables[2][10])
    # the output layer's gradient reaches the input tables of every band
    model(idx, targets=targets).sum().backward()
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in vocab.tables)


def test_tied_nll_matches_logits():
    model = make("rope")
    idx, targets = tokens(2, 12), tokens(2, 12, seed=3)
    with torch.no_grad():
        ref = F.cross_entropy(model(idx).flatten(0, 1), targets.flatten(), reduction="none").view(2, 12)
        torch.testing.assert_close(model(idx, targets=targets), ref, rtol=0, atol=ATOL)


def test_paper_model_has_247m_parameters():
    cfg = LMConfig(
        n_layer=16, n_head=8, d_model=1024, d_ff=4096, adaptive_cutoffs=[20000, 60000], adaptive_factor=4,
        vocab_size=267735,
    )  # fmt: skip
    with torch.device("meta"):
        model = TransformerLM(cfg)
    n = model.num_params()
    assert abs(n - 247e6) / 247e6 < 0.005, n


# ---------------------------------------------------------------------------------------------
# Bad configs


def test_d_model_not_divisible_by_n_head():
    with pytest.raises(ValueError, match="d_model=30 is not divisible by model.n_head=4"):
        LMConfig(d_model=30, n_head=4)


def test_rope_with_odd_head_dim():
    with pytest.raises(ConfigError, match="rope needs an even head dimension, got d_model/n_head = 3"):
        LMConfig(position="rope", d_model=12, n_head=4, n_layer=1, vocab_size=10)


def test_unknown_position_lists_known_ones():
    with pytest.raises(ConfigError, match="unknown position scheme 'no_such_scheme'") as err:
        LMConfig(position="no_such_scheme", d_model=16, n_head=2, n_layer=1, vocab_size=10)
    for name in POSITION_SCHEMES:
        assert f" {name}," in str(err.value) or f" {name} (" in str(err.value)


def test_bad_position_option_names_the_scheme():
    with pytest.raises(ConfigError, match="^position scheme 'alibi' has no option 'max_len'; its options: learn_slopes$"):
        LMConfig(position="alibi", position_options={"max_len": 3}, d_model=16, n_head=2, n_layer=1)


def test_position_options_are_validated_and_stored_with_their_defaults():
    assert LMConfig(position="t5").position_options == {"num_buckets": 32, "max_distance": 128}
    with pytest.raises(ConfigError, match="position.num_buckets >= 2"):
        LMConfig(position="t5", position_options={"num_buckets": 1})
    with pytest.raises(ConfigError, match="model.vocab_size is not set"):
        TransformerLM(LMConfig())  # configs leave it to the trainer (the tokenizer's)


@pytest.mark.parametrize("field, value", [("n_layer", 0), ("vocab_size", 0), ("attn_query_block", 0), ("dropout", 1.0),
                                          ("adaptive_cutoffs", [50, 20]), ("attention", "fast")])
def test_out_of_range_fields(field, value):
    with pytest.raises(ConfigError, match=field):
        LMConfig(**{field: value})


@pytest.mark.parametrize("cutoffs", [None, [20, 60]], ids=["tied", "adaptive"])
@pytest.mark.parametrize("scheme", list(POSITION_SCHEMES))
def test_training_and_scoring_run_under_bf16_autocast(scheme, cutoffs):
    """CUDA trains and evaluates under bf16 autocast (train.py, eval/evaluation.py); CPU autocast takes the same
    mixed-dtype paths (matmuls in bf16, buffers and parameters in float32), so they are checked here."""
    from alibi_lm.eval.scoring import score_stream

    model = make(scheme, adaptive_cutoffs=cutoffs).train()
    idx = tokens(2, 24)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(idx[:, :-1], targets=idx[:, 1:]).mean()  # (B, T) per-token nll, as the Trainer takes it
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    ppl = score_stream(model.eval(), tokens(1, 200)[0].numpy(), 32, autocast_dtype=torch.bfloat16).ppl
    fp32 = score_stream(model, tokens(1, 200)[0].numpy(), 32).ppl
    assert ppl == pytest.approx(fp32, rel=0.05)  # bf16 rounding only


@pytest.mark.parametrize("position", ["alibi", "rope", "nope"])
def test_qk_norm_normalises_each_heads_queries_and_keys_and_keeps_the_cache_exact(position):
    """model.qk_norm: queries and keys reach the scheme with unit RMS over the head dimension (times the learned
    scale); the output changes, and decoding with the KV cache still equals the full forward."""
    from alibi_lm.model import KVCache

    torch.manual_seed(0)
    model = TransformerLM(LMConfig(n_layer=2, n_head=4, d_model=32, vocab_size=V, position=position, qk_norm=True)).eval()
    seen = []
    rotate = model.position.rotate
    model.position.rotate = lambda qk, pos: seen.append(qk.detach()) or rotate(qk, pos)
    idx = tokens(2, 24)
    with torch.no_grad():
        full = model(idx)
        rms = seen[0].pow(2).mean(-1).sqrt()  # (2, B, H, T)
        torch.testing.assert_close(rms, torch.ones_like(rms), rtol=1e-3, atol=1e-3)
        cache = KVCache(2)
        steps = [model(idx[:, :10], cache=cache)] + [model(idx[:, t : t + 1], start_pos=t, cache=cache)
                                                     for t in range(10, 24)]
        torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
        plain = TransformerLM(LMConfig(n_layer=2, n_head=4, d_model=32, vocab_size=V, position=position)).eval()
        plain.load_state_dict({k: v for k, v in model.state_dict().items() if "qk_norm" not in k})
        assert not torch.allclose(plain(idx), full, atol=1e-4)
