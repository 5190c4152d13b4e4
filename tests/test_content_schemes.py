"""The content-aware schemes (CoPE, FoX) against loops written here from the papers' equations, through the model
(every layer's attention probabilities) and through the scheme's own hook; their KV cache, query blocks, position
maps and training; and parity with x-transformers' CoPE and DataDependentAlibi when it is installed.

The generic tests (causality, KV cache, shifts, long inputs, blocking, bf16) run both schemes from the registry."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import ATOL, V, make, tokens

from alibi_lm.attention import choose_backend
from alibi_lm.errors import ConfigError
from alibi_lm.model import KVCache, LMConfig, TransformerLM, position_label
from alibi_lm.positions import POSITION_SCHEMES, PositionScheme, ScoreBlock, build_position_scheme, cope

CONTENT = [name for name, cls in POSITION_SCHEMES.items() if cls.content_aware]


def layer_inputs(model, idx, **kwargs):
    """The attention probabilities of every layer (B, H, T, T) and each layer's normalised input x (B, T, D)."""
    inputs = []
    hooks = [block.attn.register_forward_pre_hook(lambda module, args: inputs.append(args[0]))
             for block in model.blocks]
    try:
        with torch.no_grad():
            _, probs = model(idx, return_attention=True, **kwargs)
    finally:
        for hook in hooks:
            hook.remove()
    return probs, inputs


def queries_and_keys(model, layer, x):
    """q, k (B, H, T, Dh) of layer `layer` for its input x, as float64 (no rotation: cope and fox have none)."""
    B, T, _ = x.shape
    attn = model.blocks[layer].attn
    with torch.no_grad():
        q, k, _ = attn.qkv(x).view(B, T, 3, attn.n_head, attn.head_dim).permute(2, 0, 3, 1, 4)
    return q.double(), k.double()


def softmax_rows(logits):
    """Row softmax of a dict (b, h, i) -> [logit of j for j <= i] into a (B, H, T, T) tensor."""
    B, H, T = max(key[0] for key in logits) + 1, max(key[1] for key in logits) + 1, max(key[2] for key in logits) + 1
    out = torch.zeros(B, H, T, T, dtype=torch.float64)
    for (b, h, i), row in logits.items():
        out[b, h, i, : i + 1] = torch.tensor(row, dtype=torch.float64).softmax(-1)
    return out


# ---------------------------------------------------------------------------------------------
# CoPE: g_ij = sigmoid(q_i . k_j / sqrt(d)), p_ij = sum_{t=j..i} g_it (clamped), e(p) interpolated


def cope_logits_loop(q, k, pos_emb):
    """{(b, h, i): [q_i . k_j / sqrt(d) + q_i . e(p_ij) / sqrt(d) for j <= i]} from the paper's equations, one
    scalar at a time: q, k (B, H, T, Dh) float64, pos_emb (npos, Dh)."""
    B, H, T, Dh = q.shape
    npos = pos_emb.shape[0]
    e = pos_emb.double()
    out = {}
    for b in range(B):
        for h in range(H):
            for i in range(T):
                qi = q[b, h, i]
                gates = [torch.sigmoid(qi @ k[b, h, t] / math.sqrt(Dh)).item() for t in range(i + 1)]
                row = []
                for j in range(i + 1):
                    p = min(sum(gates[j : i + 1]), npos - 1)
                    lo, hi = math.floor(p), math.ceil(p)
                    w = p - lo
                    embedded = (1 - w) * (qi @ e[lo]).item() + w * (qi @ e[hi]).item()
                    row.append(((qi @ k[b, h, j]).item() + embedded) / math.sqrt(Dh))
                out[b, h, i] = row
    return out


@pytest.mark.parametrize("npos_max", [4, 64], ids=["clamped", "unclamped"])
def test_cope_attention_matches_a_loop_over_the_papers_equations(npos_max):
    """Every layer's probabilities, from the model's own q, k and that layer's position vectors; with npos_max = 4
    most counts over 12 tokens pass npos_max - 1 and are clamped."""
    model = make("cope", position_options={"npos_max": npos_max})
    idx = tokens(2, 12)
    probs, inputs = layer_inputs(model, idx)
    for layer, x in enumerate(inputs):
        q, k = queries_and_keys(model, layer, x)
        logits = cope_logits_loop(q, k, model.position.pos_emb[layer].detach())
        torch.testing.assert_close(probs[layer].double(), softmax_rows(logits), rtol=0, atol=ATOL)
        # the hook's logits themselves, to 1e-5: scores + content_bias over the visible keys
        T = idx.shape[1]
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        scores = (q @ k.transpose(-2, -1)).float() / math.sqrt(q.shape[-1])
        block = ScoreBlock(q=q.float(), k=k.float(), scores=scores, future=future, q_pos=torch.arange(T),
                           k_pos=torch.arange(T), query_index=slice(0, T), layer=layer, state=None)
        with torch.no_grad():
            mine = scores + model.position.content_bias(block)  # (B, H, T, T)
        for (b, h, i), row in logits.items():
            torch.testing.assert_close(mine[b, h, i, : i + 1].double(), torch.tensor(row, dtype=torch.float64),
                                       rtol=0, atol=ATOL)
    if npos_max == 4:
        gates = torch.sigmoid(scores).masked_fill(future, 0)
        assert (gates.flip(-1).cumsum(-1).flip(-1) > npos_max - 1).any()  # the clamp was exercised


def test_cope_position_vectors_are_per_layer_shared_by_heads_and_start_at_zero():
    model = TransformerLM(LMConfig(n_layer=3, n_head=4, d_model=32, vocab_size=V, position="cope",
                                   position_options={"npos_max": 16}))
    assert model.position.pos_emb.shape == (3, 16, 8)  # (n_layer, npos_max, Dh): no head axis
    assert not model.position.pos_emb.any()  # the authors' zeros: the model starts as nope
    nope = TransformerLM(LMConfig(n_layer=3, n_head=4, d_model=32, vocab_size=V, position="nope"))
    nope.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("position.")})
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(tokens(1, 10)), nope.eval()(tokens(1, 10)), rtol=0, atol=ATOL)


@pytest.mark.parametrize("shape", [(2, 3, 7, 37), (1, 4, 33, 65)], ids=["7x37", "33x65"])
def test_cope_bias_over_row_slices_is_the_whole_blocks_bit_for_bit(shape, monkeypatch):
    """In CPU inference cope_bias works over slices of 3 query rows (the last one shorter); its bias equals the whole
    block's, the training path's, exactly. Odd widths put a vectorized kernel's scalar tail (whose sigmoid differs in
    the last bit) at other elements in a slice than in the block: the sigmoid must run over the whole block."""
    B, H, tq, tk = shape
    g = torch.Generator().manual_seed(0)
    q, pos_emb = torch.randn(B, H, tq, 4, generator=g), torch.randn(6, 4, generator=g)  # npos 6: clamped and not
    scores = 4 * torch.randn(B, H, tq, tk, generator=g)  # (B, H, tq, tk)
    future = torch.arange(tk)[None, :] > torch.arange(tk - tq, tk)[:, None]  # (tq, tk): the block of the last queries
    monkeypatch.setattr(cope, "ROW_SLICE_VALUES", 3 * B * H * tk)
    assert cope.row_slices(scores) == [(0, tq)]  # grad enabled: one slice (autograd keeps the sigmoids unchanged)
    whole = cope.cope_bias(q, scores, future, pos_emb)
    with torch.no_grad():
        assert cope.row_slices(scores) == [(r0, min(r0 + 3, tq)) for r0 in range(0, tq, 3)]
        assert cope.row_slices(scores.to("meta")) == [(0, tq)]  # off the CPU a slice is one more kernel launch
        sliced = cope.cope_bias(q, scores, future, pos_emb)
    assert torch.equal(sliced, whole)


def test_cope_row_slices_hold_about_row_slice_values_each():
    """The task suite's 16L passkey block, 16 sequences x 4 heads x 128 queries x 1,024 keys: 32 slices of 4 rows."""
    with torch.no_grad():
        slices = cope.row_slices(torch.empty(16, 4, 128, 1024))
    assert slices == [(r0, r0 + 4) for r0 in range(0, 128, 4)]
    assert 16 * 4 * 4 * 1024 == cope.ROW_SLICE_VALUES


def test_a_cope_forward_over_one_row_slices_equals_the_training_paths_exactly(monkeypatch):
    """A model's inference forward with one query row per slice gives the logits of its forward with autograd on
    (whole blocks) bit for bit, through two layers and three query blocks."""
    model = make("cope", position_options={"npos_max": 8}, attn_query_block=16)
    idx = tokens(2, 40)
    expected = model(idx)  # (B, T, V) grad enabled
    rows, interpolated_bias = [], cope.interpolated_bias
    monkeypatch.setattr(cope, "ROW_SLICE_VALUES", 1)
    monkeypatch.setattr(cope, "interpolated_bias", lambda sig, *rest: rows.append(sig.shape[2]) or interpolated_bias(sig, *rest))
    with torch.no_grad():
        logits = model(idx)
    assert rows == [1] * (2 * 40)  # every query of both layers, alone
    assert torch.equal(logits, expected.detach())


# ---------------------------------------------------------------------------------------------
# FoX: f_t = sigmoid(w_h . x_t + b_h), bias_ij = sum_{t=j+1..i} log f_t



def fox_logits_loop(q, k, x, weight, bias):
    """{(b, h, i): [q_i . k_j / sqrt(d) + sum_{t=j+1..i} log f_t for j <= i]}: the O(T^2) sum itself (no cumulative
    sums), with f_t = sigmoid(w_h . x_t + b_h) for x (B, T, D), weight (H, D), bias (H,)."""
    B, H, T, Dh = q.shape
    log_f = [[[math.log(torch.sigmoid(weight[h].double() @ x[b, t].double() + bias[h].double()).item())
               for t in range(T)] for h in range(H)] for b in range(B)]
    out = {}
    for b in range(B):
        for h in range(H):
            for i in range(T):
                out[b, h, i] = [(q[b, h, i] @ k[b, h, j]).item() / math.sqrt(Dh) + sum(log_f[b][h][j + 1 : i + 1])
                                for j in range(i + 1)]
    return out


def test_fox_attention_matches_a_loop_over_the_papers_equations():
    model = make("fox")
    idx = tokens(2, 12)
    probs, inputs = layer_inputs(model, idx)
    for layer, x in enumerate(inputs):
        q, k = queries_and_keys(model, layer, x)
        weight, bias = model.position.gate_weight[layer].detach(), model.position.gate_bias[layer].detach()
        logits = fox_logits_loop(q, k, x, weight, bias)
        torch.testing.assert_close(probs[layer].double(), softmax_rows(logits), rtol=0, atol=ATOL)
        with torch.no_grad():  # the hook's bias alone: c_i - c_j from the cumulative sums
            state = model.position.prepare(x, layer, None)  # (B, H, T)
            T = idx.shape[1]
            block = ScoreBlock(q=q.float(), k=k.float(), scores=torch.zeros(2, 4, T, T), future=None,
                               q_pos=torch.arange(T), k_pos=torch.arange(T), query_index=slice(0, T), layer=layer,
                               state=state)
            mine = model.position.content_bias(block)  # (B, H, T, T)
        for (b, h, i), row in logits.items():
            scaled = [(q[b, h, i] @ k[b, h, j]).item() / math.sqrt(q.shape[-1]) for j in range(i + 1)]
            expected = torch.tensor(row, dtype=torch.float64) - torch.tensor(scaled, dtype=torch.float64)
            torch.testing.assert_close(mine[b, h, i, : i + 1].double(), expected, rtol=0, atol=ATOL)


def test_fox_gate_follows_the_authors_init_and_is_per_layer():
    torch.manual_seed(0)
    fox = build_position_scheme("fox", n_head=4, d_model=256, n_layer=3)
    assert fox.gate_weight.shape == (3, 4, 256) and fox.gate_bias.shape == (3, 4)
    assert not fox.gate_bias.any()  # zero bias: f ~ 1/2 at first
    assert fox.gate_weight.std().item() == pytest.approx(0.02, rel=0.05)  # N(0, 0.02)
    assert build_position_scheme("alibi", n_head=4, d_model=256, n_layer=3).slopes.shape == (4,)  # shared: no n_layer


def test_fox_gate_bias_init_opens_the_gate_and_labels_the_variant():
    fox = build_position_scheme("fox", n_head=2, d_model=8, n_layer=2, gate_bias_init=5.0)
    assert fox.gate_bias.tolist() == [[5.0, 5.0], [5.0, 5.0]]
    x = torch.zeros(1, 3, 8)  # zero input: f = sigmoid(5) for every token, so c grows by log sigmoid(5) per token
    step = math.log(1 / (1 + math.exp(-5.0)))
    torch.testing.assert_close(fox.prepare(x, 0, None), torch.tensor([[[step, 2 * step, 3 * step]] * 2]))
    assert position_label(LMConfig(position="fox", position_options={"gate_bias_init": 5.0})) == "fox+gate_bias_init5"
    assert position_label(LMConfig(position="fox")) == "fox"  # the authors' zero start is the scheme itself


# ---------------------------------------------------------------------------------------------
# Both: the KV cache, query blocks, position maps, training


def fox_rope():
    return make("fox", position_options={"rope": True})


MODELS = {"cope": lambda: make("cope", position_options={"npos_max": 8}), "fox": lambda: make("fox"),
          "fox+rope": fox_rope}


@pytest.mark.parametrize("name", list(MODELS))
def test_prefill_then_token_by_token_matches_the_full_forward(name):
    model = MODELS[name]()
    idx = tokens(2, 30)
    with torch.no_grad():
        full = model(idx)
        cache = KVCache(model.cfg.n_layer)
        parts = [model(idx[:, :9], cache=cache)]
        parts += [model(idx[:, t : t + 1], start_pos=t, cache=cache) for t in range(9, 30)]
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=0, atol=ATOL)
    if name.startswith("fox"):  # the cache holds the running sums of every key, as one forward computes them
        _, inputs = layer_inputs(model, idx)
        for layer, x in enumerate(inputs):
            torch.testing.assert_close(cache.state[layer], model.position.prepare(x, layer, None), rtol=0, atol=ATOL)
            assert cache.state[layer].shape == (2, 4, 30)
    else:
        assert cache.state == [None, None]  # CoPE needs nothing beyond the cached keys


@pytest.mark.parametrize("name", list(MODELS))
def test_query_blocks_give_what_one_block_gives(name):
    blocked = MODELS[name]()
    blocked.cfg.attn_query_block = 5  # read per forward: 61 tokens in 13 blocks, the last of 1
    whole = MODELS[name]()
    whole.cfg.attn_query_block = 100_000
    idx = tokens(1, 61)
    with torch.no_grad():
        ref = whole(idx)
        torch.testing.assert_close(blocked(idx), ref, rtol=0, atol=ATOL)
        cache = KVCache(blocked.cfg.n_layer)  # blocks after a cached prefix: offsets not aligned with the blocks
        head = blocked(idx[:, :17], cache=cache)
        tail = blocked(idx[:, 17:], start_pos=17, cache=cache)
    torch.testing.assert_close(torch.cat([head, tail], 1), ref, rtol=0, atol=ATOL)


@pytest.mark.parametrize("name", list(MODELS))
def test_a_position_map_reaches_only_the_rotation(name):
    """Randomized positions (model.hidden(positions=...)): cope and fox see no position, so a map changes nothing;
    fox with RoPE rotates by the mapped positions. A KV cache under the map continues it exactly."""
    model = MODELS[name]()
    with torch.no_grad():  # scores of order 1 rather than 0.01 (the init's), so that a rotation shows
        for block in model.blocks:
            block.attn.qkv.weight.mul_(10)
    idx = tokens(2, 20)
    positions = torch.sort(torch.randperm(200, generator=torch.Generator().manual_seed(3))[:20]).values  # (20,)
    with torch.no_grad():
        plain, mapped = model.hidden(idx), model.hidden(idx, positions=positions)
        cache = KVCache(model.cfg.n_layer)
        steps = [model.hidden(idx[:, :6], cache=cache, positions=positions)]
        steps += [model.hidden(idx[:, t : t + 1], start_pos=t, cache=cache, positions=positions) for t in range(6, 20)]
        shifted = model.hidden(idx, positions=torch.arange(20) + 1000)
    torch.testing.assert_close(torch.cat(steps, 1), mapped, rtol=0, atol=ATOL)
    torch.testing.assert_close(shifted, plain, rtol=0, atol=ATOL)  # shift invariant, with or without RoPE
    if name == "fox+rope":
        assert (mapped - plain).abs().max() > 1e-3
    else:
        torch.testing.assert_close(mapped, plain, rtol=0, atol=ATOL)


@pytest.mark.parametrize("name", CONTENT)
def test_training_steps_lower_the_loss_and_reach_every_layers_parameters(name):
    torch.manual_seed(0)
    model = TransformerLM(LMConfig(n_layer=2, n_head=4, d_model=32, vocab_size=V, position=name)).train()  # own init
    idx = tokens(4, 33)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(30):
        loss = model(idx[:, :-1], targets=idx[:, 1:]).mean()
        optimizer.zero_grad()
        loss.backward()
        if step == 0:  # every layer's slice of the scheme's parameters has a gradient, CoPE's zeros included
            for param in model.position.parameters():
                for layer in range(2):
                    assert param.grad[layer].abs().sum() > 0, (name, layer)
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses


# ---------------------------------------------------------------------------------------------
# The interface: backends, options, declarations


@pytest.mark.parametrize("name", CONTENT)
def test_content_schemes_take_the_explicit_path_unless_they_have_a_flex_score_mod(name):
    """CoPE's bias needs (B, H, tq, tk) tensors: never FlexAttention; FoX's is c_i - c_j of per-token sums, which its
    flex_state_score_mod reads (tests/test_flex_gradients.py)."""
    scheme = make(name).position
    assert type(scheme).content_bias is not PositionScheme.content_bias
    if type(scheme).flex_state_score_mod is not PositionScheme.flex_state_score_mod:
        with torch.no_grad():
            assert choose_backend("auto", scheme, "cuda", 0.0) == choose_backend("flex", scheme, "cuda", 0.0) == "flex"
        return
    assert choose_backend("auto", scheme, "cuda", 0.0) == "sdpa"  # attend's explicit path
    with pytest.raises(ValueError, match=f"model.attention=flex cannot run position={name}"):
        choose_backend("flex", scheme, "cuda", 0.0)


def test_positions_only_schemes_never_reach_the_content_hooks(monkeypatch):
    def refuse(*args):
        raise AssertionError("a positions-only scheme reached a content hook")

    monkeypatch.setattr(PositionScheme, "prepare", refuse)
    monkeypatch.setattr(PositionScheme, "content_bias", refuse)
    for name in ("alibi", "rope", "t5"):
        model = make(name)
        with torch.no_grad():
            model(tokens(1, 9))
            model(tokens(1, 9), return_attention=True)
            model(tokens(1, 1), start_pos=0, cache=KVCache(2))


def test_bad_options_are_one_line_config_errors():
    with pytest.raises(ConfigError, match="position.npos_max >= 2"):
        LMConfig(position="cope", position_options={"npos_max": 1})
    with pytest.raises(ConfigError, match="even head dimension.*position.rope=false"):
        LMConfig(position="fox", position_options={"rope": True}, d_model=12, n_head=4)
    assert LMConfig(position="fox", d_model=12, n_head=4).position_options["rope"] is False  # odd Dh: no rotation


# ---------------------------------------------------------------------------------------------
# x-transformers (lucidrains), when installed: its CoPE and DataDependentAlibi with the same weights


def test_cope_matches_x_transformers():
    xt = pytest.importorskip("x_transformers.x_transformers")
    model = make("cope", position_options={"npos_max": 6})
    idx = tokens(2, 14)
    _, inputs = layer_inputs(model, idx)
    q, k = queries_and_keys(model, 1, inputs[1])
    q, k = q.float(), k.float()
    T, Dh = idx.shape[1], q.shape[-1]
    theirs = xt.CoPE(dim=Dh, heads=4, max_pos=6)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(Dh)  # (B, H, T, T)
    with torch.no_grad():
        theirs.pos_emb.copy_(model.position.pos_emb[1])
        # theirs: gates from the scaled logits after the causal mask, position logits not divided by sqrt(Dh)
        expected = theirs(q, scores.masked_fill(future, -torch.finfo(scores.dtype).max)) / math.sqrt(Dh)
        block = ScoreBlock(q=q, k=k, scores=scores, future=future, q_pos=torch.arange(T), k_pos=torch.arange(T),
                           query_index=slice(0, T), layer=1, state=None)
        mine = model.position.content_bias(block)
    torch.testing.assert_close(mine.masked_fill(future, 0), expected.masked_fill(future, 0), rtol=0, atol=ATOL)


def test_fox_matches_x_transformers_data_dependent_alibi():
    xt = pytest.importorskip("x_transformers.x_transformers")
    model = make("fox")
    idx = tokens(2, 14)
    _, inputs = layer_inputs(model, idx)
    T = idx.shape[1]
    theirs = xt.DataDependentAlibi(dim=32, heads=4)
    linear = theirs.to_forget_gates[0]
    with torch.no_grad():
        linear.weight.copy_(model.position.gate_weight[1])
        linear.bias.copy_(model.position.gate_bias[1])
        expected = theirs(inputs[1])  # (B, H, T, T) c_i - c_j
        block = ScoreBlock(q=torch.zeros(2, 4, T, 8), k=torch.zeros(2, 4, T, 8), scores=None, future=None,
                           q_pos=torch.arange(T), k_pos=torch.arange(T), query_index=slice(0, T), layer=1,
                           state=model.position.prepare(inputs[1], 1, None))
        mine = model.position.content_bias(block)
    visible = torch.ones(T, T, dtype=torch.bool).tril()
    torch.testing.assert_close(mine[..., visible], expected[..., visible], rtol=0, atol=ATOL)
