"""Position schemes against their formulas: ALiBi slopes and biases, T5 buckets, RoPE, sinusoidal."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from alibi_lm.positions import (
    POSITION_SCHEMES,
    PositionRangeError,
    alibi_bias,
    alibi_bias_matrix,
    alibi_slopes,
    build_position_scheme,
    t5_relative_bucket,
)
from alibi_lm.positions.registry import scheme_of

# ---------------------------------------------------------------------------------------------
# Independent references, written from the published descriptions (not imported from the package)


def official_get_slopes(n: int) -> list[float]:
    """The official ALiBi get_slopes (Press et al.), recursive form."""

    def get_slopes_power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return (
        get_slopes_power_of_2(closest_power_of_2)
        + official_get_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2]
    )


def hf_relative_position_bucket(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    """HF transformers' T5Attention._relative_position_bucket."""
    relative_buckets = 0
    if bidirectional:
        num_buckets //= 2
        relative_buckets += (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
    else:
        relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    relative_position_if_large = max_exact + (
        torch.log(relative_position.float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    relative_position_if_large = torch.min(
        relative_position_if_large, torch.full_like(relative_position_if_large, num_buckets - 1)
    )
    relative_buckets += torch.where(is_small, relative_position, relative_position_if_large)
    return relative_buckets


def pow2(*exponents) -> torch.Tensor:
    return torch.tensor([2.0**e for e in exponents])


# ---------------------------------------------------------------------------------------------
# ALiBi slopes


@pytest.mark.parametrize(
    "heads, exponents",
    [
        (8, [-1, -2, -3, -4, -5, -6, -7, -8]),
        (16, [-0.5 * (i + 1) for i in range(16)]),
        (12, [-1, -2, -3, -4, -5, -6, -7, -8, -0.5, -1.5, -2.5, -3.5]),
        (6, [-2, -4, -6, -8, -1, -3]),
        (1, [-8]),
        (2, [-4, -8]),
    ],
)
def test_alibi_slopes_exact(heads, exponents):
    slopes = alibi_slopes(heads)
    assert slopes.shape == (heads,)
    assert slopes.dtype == torch.float32
    torch.testing.assert_close(slopes, pow2(*exponents), rtol=0, atol=0)


def test_alibi_slopes_match_official_get_slopes_1_to_64():
    for n in range(1, 65):
        expected = torch.tensor(official_get_slopes(n), dtype=torch.float32)
        torch.testing.assert_close(alibi_slopes(n), expected, rtol=1e-6, atol=0, msg=f"{n} heads")


def test_alibi_slopes_rejects_zero_heads():
    with pytest.raises(ValueError, match="num_heads"):
        alibi_slopes(0)


# ---------------------------------------------------------------------------------------------
# alibi_bias_matrix: the flat numpy contract

NEG = -1e9


def test_alibi_bias_matrix_two_heads_three_positions():
    a, b = 0.0625, 0.00390625  # 2^-4, 2^-8
    expected = np.array(
        [
            [[0.0, NEG, NEG], [-a, 0.0, NEG], [-2 * a, -a, 0.0]],
            [[0.0, NEG, NEG], [-b, 0.0, NEG], [-2 * b, -b, 0.0]],
        ]
    ).reshape(-1)
    out = alibi_bias_matrix(0, 2, 3)
    assert isinstance(out, np.ndarray)
    assert out.ndim == 1 and out.shape == (2 * 3 * 3,)
    assert np.issubdtype(out.dtype, np.floating)
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=0)
    assert np.all(out.reshape(2, 3, 3)[:, np.triu_indices(3, 1)[0], np.triu_indices(3, 1)[1]] == NEG)


def test_alibi_bias_matrix_three_heads_two_positions_not_power_of_two():
    # slopes 2^(-8(h+1)/3): 2^(-8/3), 2^(-16/3), 2^-8 -- NOT alibi_slopes(3) = 2^-4, 2^-8, 2^-2
    expected = np.array(
        [
            0.0, NEG, -0.15749013123685915, 0.0,
            0.0, NEG, -0.024803141437003122, 0.0,
            0.0, NEG, -0.00390625, 0.0,
        ]
    )  # fmt: skip
    out = alibi_bias_matrix(123, 3, 2)
    assert out.shape == (12,)
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=0)
    # it keeps its own contract and so differs from the official interleaved slopes here
    official = -alibi_slopes(3).double().numpy()  # bias at distance 1 under alibi_slopes
    np.testing.assert_allclose(official, [-0.0625, -0.00390625, -0.25])
    assert not np.allclose(out.reshape(3, 2, 2)[:, 1, 0], official)


def test_alibi_bias_matrix_equals_alibi_bias_for_powers_of_two():
    for heads in (1, 2, 4, 8, 16):
        out = alibi_bias_matrix(0, heads, 5).reshape(heads, 5, 5)
        ref = alibi_bias(heads, torch.arange(5), torch.arange(5)).double().numpy()
        lower = np.tril(np.ones((5, 5), dtype=bool))
        np.testing.assert_allclose(out[:, lower], ref[:, lower], rtol=1e-6)
        assert np.all(out[:, ~lower] == NEG)


def test_alibi_bias_matrix_ignores_seed_and_casts_args():
    ref = alibi_bias_matrix(0, 2, 3)
    np.testing.assert_array_equal(alibi_bias_matrix(1234, 2, 3), ref)
    np.testing.assert_array_equal(alibi_bias_matrix(None, 2, 3), ref)
    cast = alibi_bias_matrix(7, 2.0, 3.0)
    assert cast.shape == (18,)
    np.testing.assert_array_equal(cast, ref)
    assert np.all(np.isfinite(ref))  # -1e9, never -inf


# ---------------------------------------------------------------------------------------------
# alibi_bias


def _formula(heads, q_pos, k_pos, causal=True):
    m = official_get_slopes(heads)
    out = torch.empty(heads, len(q_pos), len(k_pos))
    for h in range(heads):
        for a, i in enumerate(q_pos):
            for b, j in enumerate(k_pos):
                if causal:
                    out[h, a, b] = -m[h] * (i - j) if j <= i else float("-inf")
                else:
                    out[h, a, b] = -m[h] * abs(i - j)
    return out


def test_alibi_bias_causal_small():
    out = alibi_bias(4, torch.arange(3), torch.arange(3))
    assert out.shape == (4, 3, 3)
    m = 0.25  # head 0 of 4: 2^-2
    expected0 = torch.tensor([[0.0, -math.inf, -math.inf], [-m, 0.0, -math.inf], [-2 * m, -m, 0.0]])
    torch.testing.assert_close(out[0], expected0)
    assert torch.isneginf(out[:, 0, 1:]).all() and torch.isneginf(out[:, 1, 2]).all()
    torch.testing.assert_close(out, _formula(4, range(3), range(3)))


def test_alibi_bias_with_offset_positions():
    q_pos, k_pos = torch.arange(100, 104), torch.arange(98, 104)
    out = alibi_bias(8, q_pos, k_pos)
    assert out.shape == (8, 4, 6)
    torch.testing.assert_close(out, _formula(8, q_pos.tolist(), k_pos.tolist()))
    # the query at 100 sees keys 98, 99, 100 with distances 2, 1, 0 and not 101..103
    torch.testing.assert_close(out[0, 0, :3], torch.tensor([-1.0, -0.5, 0.0]))
    assert torch.isneginf(out[:, 0, 3:]).all()
    assert torch.isfinite(out[:, 3, :]).all()  # the last query sees every key


def test_alibi_bias_bidirectional():
    pos = torch.arange(5)
    out = alibi_bias(12, pos, pos, causal=False)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, out.transpose(1, 2))
    torch.testing.assert_close(out, _formula(12, range(5), range(5), causal=False))
    # with offsets too
    torch.testing.assert_close(
        alibi_bias(3, [10, 11], [7, 12, 13], causal=False), _formula(3, [10, 11], [7, 12, 13], causal=False)
    )


def test_alibi_scheme_score_bias_matches_alibi_bias_on_visible_keys():
    scheme = build_position_scheme("alibi", n_head=6, d_model=48)
    q_pos, k_pos = torch.arange(50, 60), torch.arange(40, 60)
    got = scheme.score_bias(q_pos, k_pos)
    ref = alibi_bias(6, q_pos, k_pos)
    visible = torch.isfinite(ref)
    torch.testing.assert_close(got[visible], ref[visible])
    assert scheme.static_bias is True


# ---------------------------------------------------------------------------------------------
# T5 buckets


def test_t5_bucket_known_values_causal():
    # relative_position = key - query: past keys are negative
    rel = torch.tensor([0, -1, -5, -15, -16, -20, -32, -64, -127, -128, -1000, 1, 7, 1000])
    expected = torch.tensor([0, 1, 5, 15, 16, 17, 21, 26, 31, 31, 31, 0, 0, 0])
    out = t5_relative_bucket(rel)
    assert out.dtype == torch.long
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    # distances 0..15 are exact
    torch.testing.assert_close(t5_relative_bucket(-torch.arange(16)), torch.arange(16), rtol=0, atol=0)


def test_t5_bucket_matches_hf_causal_and_bidirectional():
    rel = torch.arange(-1200, 1201)
    for num_buckets, max_distance in [(32, 128), (16, 64), (64, 256), (32, 512)]:
        for bidirectional in (False, True):
            ref = hf_relative_position_bucket(rel, bidirectional, num_buckets, max_distance)
            got = t5_relative_bucket(
                rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
            )
            torch.testing.assert_close(got, ref, rtol=0, atol=0, msg=f"{num_buckets} {max_distance} {bidirectional}")


def test_t5_bucket_bidirectional_known_values():
    rel = torch.tensor([0, -5, 5, -7, 7, -8, 8, -1000, 1000])
    expected = torch.tensor([0, 5, 21, 7, 23, 8, 24, 15, 31])
    torch.testing.assert_close(t5_relative_bucket(rel, bidirectional=True), expected, rtol=0, atol=0)


def test_t5_scheme_bias_is_table_at_bucket_for_any_distance():
    torch.manual_seed(0)
    scheme = build_position_scheme("t5", n_head=3, d_model=24)
    q_pos, k_pos = torch.arange(290, 300), torch.arange(0, 300)
    got = scheme.score_bias(q_pos, k_pos)  # (H, Tq, Tk)
    buckets = t5_relative_bucket(k_pos[None, :] - q_pos[:, None])  # (Tq, Tk)
    ref = scheme.bias_table.weight[buckets].permute(2, 0, 1)
    torch.testing.assert_close(got, ref)
    assert scheme.static_bias is False  # learned: the model must not cache it


# ---------------------------------------------------------------------------------------------
# RoPE and sinusoidal


def test_rope_preserves_norms_and_matches_formula():
    torch.manual_seed(0)
    rope = build_position_scheme("rope", n_head=2, d_model=8)  # head_dim 4
    x = torch.randn(2, 2, 5, 4)
    pos = torch.tensor([0, 1, 7, 300, 1000])  # beyond the initial 256-row table
    rope.check_positions(int(pos.max()) + 1)
    y = rope.rotate(x, pos)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(rope.rotate(x, torch.zeros(5, dtype=torch.long)), x)
    # theta_i = 10000^(-2i/4): pairs (x0, x2) at angle p, (x1, x3) at angle p / 100
    for t, p in enumerate(pos.tolist()):
        for i, theta in enumerate([1.0, 0.01]):
            a, b = x[..., t, i], x[..., t, i + 2]
            c, s = math.cos(p * theta), math.sin(p * theta)
            torch.testing.assert_close(y[..., t, i], a * c - b * s, atol=2e-5, rtol=1e-4)
            torch.testing.assert_close(y[..., t, i + 2], a * s + b * c, atol=2e-5, rtol=1e-4)


def test_rope_dot_product_depends_only_on_distance():
    torch.manual_seed(1)
    rope = build_position_scheme("rope", n_head=4, d_model=64)
    rope.check_positions(2000)
    q, k = torch.randn(1, 4, 1, 16), torch.randn(1, 4, 1, 16)

    def score(i, j):
        return (rope.rotate(q, torch.tensor([i])) * rope.rotate(k, torch.tensor([j]))).sum(-1)

    base = score(10, 3)
    for shift in (1, 37, 500, 1500):
        torch.testing.assert_close(score(10 + shift, 3 + shift), base, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(score(10, 4), base, atol=1e-3)  # a different distance does change it


def test_rope_table_grows_to_cover_every_position():
    rope = build_position_scheme("rope", n_head=1, d_model=4)
    x = torch.ones(1, 1, 1, 4)
    for end in (256, 257, 513, 1025):
        rope.check_positions(end)
        assert rope.table_len >= end
        p = end - 1
        y = rope.rotate(x, torch.tensor([p]))[0, 0, 0]
        expected = [math.cos(p) - math.sin(p), math.cos(p / 100) - math.sin(p / 100)]
        expected += [math.sin(p) + math.cos(p), math.sin(p / 100) + math.cos(p / 100)]
        torch.testing.assert_close(y, torch.tensor(expected), atol=1e-5, rtol=1e-5)


def test_rope_rejects_odd_head_dim():
    with pytest.raises(ValueError, match="even head dimension"):
        build_position_scheme("rope", n_head=4, d_model=12)


def test_sinusoidal_values():
    sin = build_position_scheme("sinusoidal", n_head=2, d_model=8)
    emb = sin.embedding(torch.tensor([0, 1, 50]))
    assert emb.shape == (3, 8) and emb.dtype == torch.float32
    torch.testing.assert_close(emb[0], torch.tensor([0.0, 0, 0, 0, 1, 1, 1, 1]))
    inv_freq = [10000 ** (-i / 3) for i in range(4)]  # fairseq: half = 4, spacing log(10000)/(half-1)
    for row, p in ((1, 1), (2, 50)):
        expected = [math.sin(p * f) for f in inv_freq] + [math.cos(p * f) for f in inv_freq]
        torch.testing.assert_close(emb[row], torch.tensor(expected), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(emb[1, 0], torch.tensor(0.8414709848078965))  # sin(1)
    odd = build_position_scheme("sinusoidal", n_head=1, d_model=7).embedding(torch.tensor([3]))
    assert odd.shape == (1, 7) and odd[0, -1] == 0


def test_learned_raises_past_table():
    learned = build_position_scheme("learned", n_head=2, d_model=8, max_len=16)
    learned.check_positions(16)  # exactly the table: fine
    with pytest.raises(PositionRangeError, match="max_len"):
        learned.check_positions(17)


def test_every_scheme_has_its_own_options_class_which_names_it():
    options = [scheme.Options for scheme in POSITION_SCHEMES.values()]
    assert len(set(options)) == len(options)  # alibi and nope declare none: each gets its own empty one
    assert [scheme_of(cls()) for cls in options] == list(POSITION_SCHEMES)
    assert POSITION_SCHEMES["nope"].Options.__name__ == "NoPositionOptions"


def test_learned_alibi_slopes_start_at_the_official_ones_and_learn():
    """position.learn_slopes: the slopes are parameters (kept positive), start at alibi_slopes, get gradients, are
    reported by learned_values, and the bias is rebuilt every forward (no cached static fold)."""
    from alibi_lm.positions import alibi_slopes, build_position_scheme

    fixed = build_position_scheme("alibi", n_head=8, d_model=64)
    learned = build_position_scheme("alibi", n_head=8, d_model=64, learn_slopes=True)
    torch.testing.assert_close(learned.slopes, alibi_slopes(8), rtol=1e-6, atol=0)
    assert fixed.learned_values() == {} and list(fixed.parameters()) == []
    assert fixed.static_bias and not learned.static_bias
    q, k = torch.arange(10), torch.arange(10)
    torch.testing.assert_close(learned.score_bias(q, k), fixed.score_bias(q, k))
    learned.score_bias(q, k).tril().sum().backward()  # the visible keys: i - j >= 0
    assert learned.log_slopes.grad is not None and (learned.log_slopes.grad != 0).all()
    with torch.no_grad():
        learned.log_slopes[0] = math.log(0.25)
    assert learned.learned_values()["alibi_slope_0"] == pytest.approx(0.25)
    assert learned.score_bias(q, k)[0, 9, 0].item() == pytest.approx(-0.25 * 9)
