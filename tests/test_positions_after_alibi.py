"""Schemes published after ALiBi against their formulas, each written out here from the paper and the
reference code (explicit loops in float64, never the package's own code): KERPLE-log and -power,
Sandwich, FIRE and xPos; the interface's declarations of every registered scheme."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import ATOL, make, tokens

from alibi_lm.positions import POSITION_SCHEMES, PositionRangeError, PositionScheme, build_position_scheme

H, D = 4, 32  # heads, d_model: head dimension 8
Q_POS, K_POS = torch.arange(50, 62), torch.arange(40, 62)  # an offset block of queries and its keys


def visible(q_pos, k_pos):
    """(i, j, a, b) for every key j <= i: the entries a scheme's bias must get right."""
    return [(i, j, a, b) for a, i in enumerate(q_pos.tolist()) for b, j in enumerate(k_pos.tolist()) if j <= i]


def assert_bias(got, expected_fn, q_pos=Q_POS, k_pos=K_POS, atol=1e-5, rtol=1e-5):
    assert got.shape == (H, len(q_pos), len(k_pos)) and got.dtype == torch.float32
    for i, j, a, b in visible(q_pos, k_pos):
        for h in range(H):
            expected = expected_fn(h, i, j)
            assert math.isclose(got[h, a, b].item(), expected, rel_tol=rtol, abs_tol=atol), (h, i, j)


# ---------------------------------------------------------------------------------------------
# KERPLE


def test_kerple_log_formula():
    scheme = build_position_scheme("kerple_log", n_head=H, d_model=D)
    r1, r2 = [1.7, 0.3, 0.05, 1.0], [0.9, 0.02, 0.5, 0.25]
    with torch.no_grad():
        scheme.r1.copy_(torch.tensor(r1))
        scheme.r2.copy_(torch.tensor(r2))
    got = scheme.score_bias(Q_POS, K_POS)
    assert_bias(got, lambda h, i, j: -r1[h] * math.log(1 + r2[h] * (i - j)))
    assert (scheme.relative_bias, scheme.static_bias, scheme.shift_invariant) == (True, False, True)


def test_kerple_power_formula():
    scheme = build_position_scheme("kerple_power", n_head=H, d_model=D)
    a, p = [0.5, 0.1, 1.3, 0.02], [1.0, 0.5, 2.0, 0.1]
    with torch.no_grad():
        scheme.a.copy_(torch.tensor(a))
        scheme.p.copy_(torch.tensor(p))
    got = scheme.score_bias(Q_POS, K_POS)
    assert_bias(got, lambda h, i, j: -a[h] * float(i - j) ** p[h])
    assert got[:, 2, 12].abs().max() == 0  # i = j: 0^p = 0 for every head


def test_kerple_init_follows_the_reference():
    torch.manual_seed(0)
    log = build_position_scheme("kerple_log", n_head=64, d_model=128)
    power = build_position_scheme("kerple_power", n_head=64, d_model=128)
    for value, high in ((log.r1, 2), (log.r2, 1), (power.a, 1), (power.p, 2)):  # U(0, high)
        assert value.shape == (64,) and value.min() >= 0 and value.max() <= high and value.max() > high / 2


def test_kerple_parameters_are_projected_into_their_domain():
    log = build_position_scheme("kerple_log", n_head=H, d_model=D)
    power = build_position_scheme("kerple_power", n_head=H, d_model=D)
    with torch.no_grad():
        log.r1.copy_(torch.tensor([-1.0, 0.0, 0.5, 3.0]))
        log.r2.copy_(torch.tensor([0.3, -0.2, 0.001, 0.5]))
        power.a.copy_(torch.tensor([-0.5, 0.2, 0.3, 0.4]))
        power.p.copy_(torch.tensor([0.5, 2.7, -1.0, 1.0]))
    bias_log = log.score_bias(Q_POS, K_POS)
    bias_power = power.score_bias(Q_POS, K_POS)
    # the reference clamps the stored values (>= 0.01; p <= 2) before use, and keeps them clamped
    torch.testing.assert_close(log.r1.data, torch.tensor([0.01, 0.01, 0.5, 3.0]))
    torch.testing.assert_close(log.r2.data, torch.tensor([0.3, 0.01, 0.01, 0.5]))
    torch.testing.assert_close(power.a.data, torch.tensor([0.01, 0.2, 0.3, 0.4]))
    torch.testing.assert_close(power.p.data, torch.tensor([0.5, 2.0, 0.01, 1.0]))
    r1, r2 = [0.01, 0.01, 0.5, 3.0], [0.3, 0.01, 0.01, 0.5]
    assert_bias(bias_log, lambda h, i, j: -r1[h] * math.log(1 + r2[h] * (i - j)))
    a, p = [0.01, 0.2, 0.3, 0.4], [0.5, 2.0, 0.01, 1.0]
    assert_bias(bias_power, lambda h, i, j: -a[h] * float(i - j) ** p[h])


@pytest.mark.parametrize("name", ["kerple_log", "kerple_power"])
def test_kerple_gradients_are_finite_everywhere(name):
    """Distance 0 (d^p log d) and future keys (counted as d = 0, masked by the model) give no NaN."""
    scheme = build_position_scheme(name, n_head=H, d_model=D)
    q_pos = k_pos = torch.arange(6)
    bias = scheme.score_bias(q_pos, k_pos)
    future = k_pos[None, :] > q_pos[:, None]
    bias.masked_fill(future, float("-inf")).softmax(-1).sum().backward()
    bias2 = scheme.score_bias(q_pos, k_pos)
    (bias2 * torch.randn_like(bias2)).sum().backward()
    for param in scheme.parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all() and param.grad.abs().sum() > 0


# ---------------------------------------------------------------------------------------------
# Sandwich


def sandwich_reference(h, i, j, heads=H, head_dim=D // H):
    """NeMo's SandwichRelativePositionEmbedding, one entry: heads counted from 1, hidden_size = head dim."""
    d = i - j
    total = sum(math.cos(d / 10000 ** (2 * k / head_dim)) for k in range(1, head_dim // 2 + 1))
    return (total - head_dim / 2) / ((h + 1) * 8 / heads)


def test_sandwich_formula():
    scheme = build_position_scheme("sandwich", n_head=H, d_model=D)
    assert_bias(scheme.score_bias(Q_POS, K_POS), sandwich_reference)
    assert (scheme.relative_bias, scheme.static_bias, scheme.shift_invariant) == (True, True, True)
    assert not list(scheme.parameters())
    # long distances (the table grows past its first 256 rows), with another head count and size
    scheme = build_position_scheme("sandwich", n_head=3, d_model=48)
    q_pos, k_pos = torch.tensor([5000, 5001]), torch.tensor([0, 1, 700, 4999, 5000])
    got = scheme.score_bias(q_pos, k_pos)
    for i, j, a, b in visible(q_pos, k_pos):
        for h in range(3):
            assert math.isclose(got[h, a, b].item(), sandwich_reference(h, i, j, 3, 16), abs_tol=1e-5), (h, i, j)
    assert got[:, 0, 4].abs().max() < 1e-6  # d = 0 gives 0
    assert (got[:, 0, :4] < 0).all()  # and a penalty elsewhere


def test_sandwich_rejects_odd_head_dim():
    with pytest.raises(ValueError, match="sandwich needs an even head dimension"):
        build_position_scheme("sandwich", n_head=4, d_model=12)


# ---------------------------------------------------------------------------------------------
# FIRE


def fire_reference(scheme):
    """bias(h, i, j) from the paper's formula with the module's current parameters read as numbers."""
    c = abs(scheme.c.item())
    threshold = abs(scheme.threshold_multiplier.item() * scheme.init_threshold.item())
    w1 = scheme.mlp.fc_in.weight.detach().double().numpy()[:, 0]  # (W,)
    b1 = scheme.mlp.fc_in.bias.detach().double().numpy()
    w2 = scheme.mlp.fc_out.weight.detach().double().numpy()  # (H, W)
    b2 = scheme.mlp.fc_out.bias.detach().double().numpy()

    def bias(h, i, j):
        x = math.log(c * (i - j) + 1) / (math.log(c * max(i, threshold) + 1) + 1e-6)
        hidden = np.maximum(x * w1 + b1, 0.0)
        return float(w2[h] @ hidden + b2[h])

    return bias


def test_fire_formula_below_and_above_the_threshold():
    torch.manual_seed(3)
    scheme = build_position_scheme("fire", n_head=H, d_model=D, init_threshold=40.0)
    with torch.no_grad():
        scheme.c.fill_(0.3)
        scheme.threshold_multiplier.fill_(1.25)  # L_thr = 50: queries 50..61 are at and past it
    q_pos, k_pos = torch.tensor([0, 3, 49, 50, 51, 61, 200]), torch.arange(0, 201, 7)
    assert_bias(scheme.score_bias(q_pos, k_pos), fire_reference(scheme), q_pos, k_pos)
    below = torch.tensor([0, 3, 17, 49, 50])  # every query at or below L_thr: the per-distance table path
    assert_bias(scheme.score_bias(below, torch.arange(0, 51, 3)), fire_reference(scheme), below, torch.arange(0, 51, 3))
    torch.testing.assert_close(scheme.score_bias(below, k_pos), scheme.mlp(scheme.normalised_distance(below, k_pos)[..., None])
                               .permute(2, 0, 1))  # the same values as the pairwise MLP
    assert (scheme.relative_bias, scheme.static_bias, scheme.shift_invariant) == (False, False, False)
    assert scheme.relative_below() == 51  # relative for queries 0..50
    with torch.no_grad():
        scheme.threshold_multiplier.fill_(1.2375)  # L_thr = 49.5: query 50 is past it
    assert scheme.relative_below() == 50


def fire_pairwise_mlp(scheme, q_pos, k_pos):
    """The MLP run on every (i, j) pair: the definition the piecewise-linear path must reproduce."""
    return scheme.mlp(scheme.normalised_distance(q_pos, k_pos)[..., None]).permute(2, 0, 1)  # (H, Tq, Tk)


def test_fire_piecewise_linear_path_has_the_pairwise_values_and_gradients():
    torch.manual_seed(7)
    scheme = build_position_scheme("fire", n_head=H, d_model=D, init_threshold=10.0)
    with torch.no_grad():  # breakpoints inside [0, 1], far outside it, doubled, and a unit with w_in = 0
        scheme.mlp.fc_in.weight[:, 0].normal_(0.0, 3.0)
        scheme.mlp.fc_in.bias.normal_(0.0, 1.0)
        scheme.mlp.fc_in.weight[0, 0], scheme.mlp.fc_in.weight[1:3, 0] = 0.0, torch.tensor([2.0, 4.0])
        scheme.mlp.fc_in.bias[1:3] = torch.tensor([-1.0, -2.0])  # two units break at x = 0.5
        scheme.mlp.fc_out.weight.normal_(0.0, 1.0)
    q_pos, k_pos = torch.arange(30, 90), torch.arange(0, 90)  # past L_thr = 10
    weights = torch.randn(H, 60, 90)
    grads = []
    for bias_fn in (scheme.score_bias, lambda q, k: fire_pairwise_mlp(scheme, q, k)):
        scheme.zero_grad()
        bias = bias_fn(q_pos, k_pos)
        (bias * weights).sum().backward()
        grads.append((bias.detach(), {n: p.grad.clone() for n, p in scheme.named_parameters()}))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-5, atol=1e-5)
    for name in grads[0][1]:
        torch.testing.assert_close(grads[0][1][name], grads[1][1][name], rtol=1e-4, atol=1e-4)


def test_fire_is_relative_per_forward_while_every_query_is_below_the_threshold(monkeypatch):
    from alibi_lm.attention import AttentionContext
    from alibi_lm.model import KVCache

    torch.manual_seed(2)
    model = make("fire", attn_query_block=8, position_options={"init_threshold": 40.0})
    with torch.no_grad():
        model.position.threshold_multiplier.fill_(1.0)  # L_thr = 40: 40 tokens are below it, 41 are not
    contexts = [AttentionContext(model.position, model.masks, 0, 0, end, "cpu", query_block=8) for end in (40, 41)]
    assert [ctx.relative for ctx in contexts] == [True, False]  # 41 tokens: a last block of rows 40..47
    idx = tokens(2, 40)
    with torch.no_grad():
        relative = model(idx)
        head = model(idx[:, :16], cache=(cache := KVCache(model.cfg.n_layer)))
        tail_ctx = AttentionContext(model.position, model.masks, 16, 0, 40, "cpu", query_block=8)
        assert tail_ctx.relative  # queries 16..39 against keys 0..39, three blocks: below L_thr
        tail = model(idx[:, 16:], start_pos=16, cache=cache)
        monkeypatch.setattr(type(model.position), "relative_below", lambda self: 0)  # force per-block biases
        torch.testing.assert_close(model(idx), relative, rtol=0, atol=ATOL)
        torch.testing.assert_close(torch.cat([head, tail], 1), relative, rtol=0, atol=ATOL)


def test_fire_defaults_follow_the_reference():
    scheme = build_position_scheme("fire", n_head=H, d_model=D)
    assert scheme.c.item() == pytest.approx(0.1) and scheme.threshold_multiplier.item() == 1.0
    assert scheme.init_threshold.item() == 512.0 and not scheme.init_threshold.requires_grad
    assert scheme.mlp.fc_in.weight.shape == (32, 1) and scheme.mlp.fc_out.weight.shape == (H, 32)
    # below L_thr the normaliser is psi(L_thr) for every query: a relative bias there
    a = scheme.score_bias(torch.arange(10, 20), torch.arange(0, 20))
    b = scheme.score_bias(torch.arange(110, 120), torch.arange(100, 120))
    torch.testing.assert_close(a, b)
    c = scheme.score_bias(torch.arange(1010, 1020), torch.arange(1000, 1020))  # past it: not any more
    assert (c - a).abs().max() > 1e-3


@pytest.mark.parametrize("init_threshold", [4.0, 16.0])  # queries past L_thr (pairwise MLP) / below it (per distance)
def test_fire_gradients_reach_every_parameter(init_threshold):
    scheme = build_position_scheme("fire", n_head=H, d_model=D, init_threshold=init_threshold)
    scheme.score_bias(torch.arange(8), torch.arange(8)).sum().backward()
    for name, param in scheme.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name


def test_fire_per_distance_path_has_the_pairwise_gradients():
    torch.manual_seed(5)
    scheme = build_position_scheme("fire", n_head=H, d_model=D, init_threshold=64.0)
    q_pos, k_pos = torch.arange(20, 40), torch.arange(0, 40)
    weights = torch.randn(H, 20, 40)
    grads = []
    for bias in (lambda: scheme.score_bias(q_pos, k_pos),
                 lambda: scheme.mlp(scheme.normalised_distance(q_pos, k_pos)[..., None]).permute(2, 0, 1)):
        scheme.zero_grad()
        (bias() * weights).sum().backward()
        grads.append({n: p.grad.clone() for n, p in scheme.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("key", ["mlp_width", "init_c", "init_threshold"])
def test_fire_rejects_bad_options(key):
    with pytest.raises(ValueError, match=f"position.{key} > 0"):
        build_position_scheme("fire", n_head=H, d_model=D, **{key: 0})


# ---------------------------------------------------------------------------------------------
# xPos


def xpos_reference(x, i, head_dim, sign, gamma=512.0, base=10000.0):
    """torchscale's XPOS on one vector at position i, in rope's layout (pair k = columns k, k + Dh/2):
    rotate pair k by i * theta_k and scale it by zeta_k^(sign * i / gamma); sign +1 for q, -1 for k."""
    half = head_dim // 2
    out = np.empty(head_dim)
    for k in range(half):
        theta = base ** (-2 * k / head_dim)
        zeta = (2 * k + 0.4 * head_dim) / (1.4 * head_dim)
        scale = zeta ** (sign * i / gamma)
        a, b = x[k], x[k + half]
        out[k] = (a * math.cos(i * theta) - b * math.sin(i * theta)) * scale
        out[k + half] = (b * math.cos(i * theta) + a * math.sin(i * theta)) * scale
    return out


def test_xpos_rotates_and_scales_queries_and_keys_oppositely():
    torch.manual_seed(0)
    scheme = build_position_scheme("xpos", n_head=H, d_model=D)  # head_dim 8
    pos = torch.tensor([0, 1, 7, 300, 1000, 5000])
    scheme.check_positions(int(pos.max()) + 1)
    qk = torch.randn(2, 1, 2, len(pos), 8)  # (2, B, H, T, Dh): queries, keys
    out = scheme.rotate(qk, pos)
    assert out.shape == qk.shape
    for which, sign in ((0, 1), (1, -1)):
        for h in range(2):
            for t, i in enumerate(pos.tolist()):
                expected = xpos_reference(qk[which, 0, h, t].double().numpy(), i, 8, sign)
                np.testing.assert_allclose(out[which, 0, h, t].double().numpy(), expected, rtol=2e-4, atol=1e-6)
    # zeta_k = (2k + 0.4 Dh) / (1.4 Dh) for Dh = 8: 3.2/11.2, 5.2/11.2, 7.2/11.2, 9.2/11.2
    torch.testing.assert_close(scheme.zeta, torch.tensor([3.2, 5.2, 7.2, 9.2], dtype=torch.float64) / 11.2)


def test_xpos_score_depends_on_distance_only_and_decays():
    torch.manual_seed(1)
    scheme = build_position_scheme("xpos", n_head=H, d_model=64)  # head_dim 16
    scheme.check_positions(4000)
    q, k = torch.randn(1, 1, 16), torch.randn(1, 1, 16)

    def score(i, j):
        qq = scheme.rotate(torch.stack((q, q))[:, :, :, :].expand(2, 1, 1, 16), torch.tensor([i]))[0]
        kk = scheme.rotate(torch.stack((k, k)).expand(2, 1, 1, 16), torch.tensor([j]))[1]
        return (qq * kk).sum().item()

    def reference(i, j):  # sum over pairs of zeta_k^((i - j)/gamma) times RoPE's pair score
        qr, kr = xpos_reference(q[0, 0].double().numpy(), i, 16, 1), xpos_reference(k[0, 0].double().numpy(), j, 16, -1)
        return float(qr @ kr)

    for i, j in ((10, 3), (1000, 993), (3000, 2993), (700, 0)):
        assert score(i, j) == pytest.approx(reference(i, j), rel=1e-4, abs=1e-5)
    assert score(1000, 993) == pytest.approx(score(10, 3), rel=1e-4, abs=1e-5)


def test_xpos_range_and_options():
    scheme = build_position_scheme("xpos", n_head=H, d_model=D)
    limit = int(512 * math.log(1e30) / math.log(3.5))  # zeta_0 = 0.4 / 1.4: keys scaled by 3.5^(j/512)
    assert scheme.max_positions == limit
    scheme.check_positions(limit)
    with pytest.raises(PositionRangeError, match="beyond xpos's range"):
        scheme.check_positions(limit + 1)
    usable = scheme._cos_full[:, :limit]  # (2, positions, Dh): the key rows reach 1e30 at the limit
    assert torch.isfinite(usable).all() and 1e29 < usable.abs().max() <= 1e30
    with pytest.raises(ValueError, match="position.gamma > 0"):
        build_position_scheme("xpos", n_head=H, d_model=D, gamma=0)
    with pytest.raises(ValueError, match="xpos needs an even head dimension"):
        build_position_scheme("xpos", n_head=4, d_model=12)
    with pytest.raises(ValueError, match=r"\(extension=yarn, or position.scaling=yarn\) applies to runs trained with "
                                         r"position=rope"):
        scheme.set_scaling("yarn", 2.0, 64)


# ---------------------------------------------------------------------------------------------
# What every registered scheme declares


@pytest.mark.parametrize("name", sorted(POSITION_SCHEMES))
def test_declarations_match_what_the_scheme_does(name):
    cls = POSITION_SCHEMES[name]
    assert issubclass(cls, PositionScheme) and cls.name == name
    scheme = build_position_scheme(name, n_head=H, d_model=D)
    has_bias = cls.score_bias is not PositionScheme.score_bias
    if cls.static_bias:  # cached by the model: nothing learned may change it
        assert has_bias and not [p for p in scheme.parameters()]
    if cls.relative_bias:  # a function of i - j: the same for shifted positions
        assert has_bias
        scheme.check_positions(400)
        torch.testing.assert_close(scheme.score_bias(Q_POS, K_POS), scheme.score_bias(Q_POS + 300, K_POS + 300))
    if cls.flex_score_mod is PositionScheme.flex_score_mod:  # optional: without it a bias runs through SDPA
        assert scheme.flex_score_mod(0, 0) is None
        if has_bias:
            assert make(name).attention_backend("cuda") == "sdpa"  # what auto picks on CUDA
    # content-aware: implements the bias hook and never runs FlexAttention; otherwise overrides no content hook
    has_content_hooks = (cls.content_bias is not PositionScheme.content_bias, cls.prepare is not PositionScheme.prepare)
    if cls.content_aware:
        assert has_content_hooks[0] and make(name).attention_backend("cuda") == "sdpa"
    else:
        assert not any(has_content_hooks)


@pytest.mark.parametrize("name", sorted(POSITION_SCHEMES))
def test_scheme_parameters_keep_their_own_init_and_are_never_decayed(name):
    from alibi_lm.model import LMConfig, TransformerLM
    from alibi_lm.optim import parameter_groups

    torch.manual_seed(7)
    alone = build_position_scheme(name, n_head=H, d_model=D)
    for init in ("gpt2", "fairseq"):
        torch.manual_seed(7)  # the model builds its scheme first: the same random stream
        model = TransformerLM(LMConfig(vocab_size=50, n_layer=1, n_head=H, d_model=D, position=name, init=init))
        for (key, mine), theirs in zip(model.position.state_dict().items(), alone.state_dict().values()):
            assert torch.equal(mine, theirs), (init, key)
    decayed = {id(p) for p in parameter_groups(model, 0.1)[0]["params"]}
    assert not any(id(p) in decayed for p in model.position.parameters())
