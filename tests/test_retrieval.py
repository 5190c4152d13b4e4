"""Where answers come from (eval/retrieval.py, results/retrieval_store.py): each task's sources, attention on them against ALiBi's
closed form, distance bins and reach."""

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import make

from alibi_lm.eval.retrieval import head_slopes, measure, rows_of
from alibi_lm.positions.alibi import alibi_slopes
from alibi_lm.results.retrieval_store import SOURCE_WINDOW, attention_curves, distance_bin, reach, reach_by_seed
from alibi_lm.tasks import build_task
from alibi_lm.tasks.stream import PositionPolicy

COPYING = [("passkey", {}), ("passkey", {"distractors": 3}), ("mqar", {}), ("copy", {}), ("copy", {"reverse": True}),
           ("flipflop", {})]


@pytest.mark.parametrize("name,options", COPYING, ids=[f"{n}{o}" for n, o in COPYING])
def test_each_answer_has_one_source_earlier_holding_the_answer(name, options):
    task = build_task(name, options)
    for length in (task.min_length, 64, 201):
        batch = task.batch(3, "test", 0, 32, length)
        tokens, answer = batch.tokens.numpy(), batch.answer.numpy()
        sources = task.sources(tokens, answer)
        assert sources.shape == answer.shape and ((sources >= 0) == answer).all()
        b, t = np.nonzero(answer)
        assert (sources[b, t] < t).all() and (sources[b, t] >= 1).all()  # after <bos>, before the answer
        assert (tokens[b, sources[b, t]] == tokens[b, t + 1]).all()  # the source holds the answer's token


def test_the_passkey_source_is_the_needle_of_the_asked_key_not_a_distractor():
    task = build_task("passkey", {"distractors": 5, "digits": 3})
    batch = task.batch(0, "test", 0, 64, 96)
    tokens = batch.tokens.numpy()
    sources = task.sources(tokens, batch.answer.numpy())
    first = sources[:, 96 - 3]  # the source of the first digit
    assert (tokens[np.arange(64), first - 2] == task.needle).all()
    assert (tokens[np.arange(64), first - 1] == tokens[:, 96 - 3]).all()  # the needle names the query's key
    assert (sources[:, 96 - 3 :] == first[:, None] + np.arange(3)).all()


@pytest.mark.parametrize("reverse,expected", [(False, [1, 2, 3, 4]), (True, [4, 3, 2, 1])])
def test_copy_sources_by_hand(reverse, expected):
    task = build_task("copy", {"reverse": reverse, "symbols": 4})
    batch = task.batch(0, "test", 0, 2, 10)  # n = 4: <bos> s1 s2 s3 s4 <sep> s1 s2 s3 s4 <eos> (or s4 s3 s2 s1)
    sources = task.sources(batch.tokens.numpy(), batch.answer.numpy())
    assert sources[0].tolist() == [-1] * 5 + expected + [-1]  # answers at 5..8: the targets after <sep>


def test_a_flipflop_read_copies_the_last_write_by_hand():
    task = build_task("flipflop")
    w, r, i, zero = task.w, task.r, task.i, task.zero
    tokens = np.array([[1, w, zero + 1, i, zero, r, zero + 1, w, zero, i, zero + 1, r, zero, 0]])  # <bos> .. <pad>
    answer = np.zeros((1, 13), dtype=bool)
    answer[0, [5, 11]] = True  # the two reads
    assert task.sources(tokens, answer)[0].tolist() == [-1] * 5 + [2] + [-1] * 5 + [8, -1]


def test_distance_bins_are_powers_of_two():
    assert distance_bin(np.array([1, 2, 3, 4, 7, 8, 1000, 1024])).tolist() == [1, 2, 2, 4, 4, 8, 512, 1024]


def test_attention_on_the_source_is_alibis_softmax_when_queries_and_keys_are_zero():
    """With q = k = 0 every logit is ALiBi's bias alone: a query at t puts exp(-m (t - j)) / sum_{j' <= t}
    exp(-m (t - j')) on key j, whatever the tokens. The measured attention (keys s - 1 .. s + 1, pooled by distance
    bin) must equal that, computed here from the slopes alone."""
    task = build_task("passkey", {"digits": 3})
    model = make("alibi", vocab_size=task.vocab_size, n_layer=2)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight[: 2 * 32] = 0  # q and k rows (d_model = 32); v keeps its weights
            block.attn.qkv.bias[: 2 * 32] = 0
    length, examples = 48, 6
    sums = measure(model, task, PositionPolicy(), length, examples, torch.device("cpu"))
    from alibi_lm.tasks.stream import EVAL_SEED

    batch = task.batch(EVAL_SEED, "test", 0, examples, length)  # measure's batch (all 6 fit in one)
    sources = task.sources(batch.tokens.numpy(), batch.answer.numpy())
    m = alibi_slopes(4).double().numpy()  # (H,)
    expected: dict[int, np.ndarray] = {}
    counts: dict[int, int] = {}
    for b, t in zip(*np.nonzero(sources >= 0)):
        s = sources[b, t]
        weights = np.exp(-m[:, None] * (t - np.arange(t + 1))[None])  # (H, t + 1)
        # the source, and each neighbour that is neither the query t nor the key t - 1 before it
        counted = [j for j in range(s - SOURCE_WINDOW, s + SOURCE_WINDOW + 1) if j == s or j < t - 1]
        p = weights[:, counted].sum(1) / weights.sum(1)  # (H,)
        key = int(distance_bin(np.array([t - s]))[0])
        expected[key] = expected.get(key, 0) + p
        counts[key] = counts.get(key, 0) + 1
    assert sorted(sums.answers) == sorted(counts) and sums.answers == counts
    for key, total in expected.items():
        for layer in range(2):  # every layer's logits are the bias alone
            np.testing.assert_allclose(sums.attention[key][layer], total, rtol=1e-5)


def test_rows_record_each_heads_slope_and_reach_reads_the_curve():
    task = build_task("passkey", {"digits": 3})
    model = make("alibi", vocab_size=task.vocab_size)
    assert head_slopes(model) == [alibi_slopes(4).tolist()] * 2
    assert head_slopes(make("rope", vocab_size=task.vocab_size)) == [[None] * 4] * 2
    sums = measure(model, task, PositionPolicy(), 40, 4, torch.device("cpu"))
    rows = pd.DataFrame(rows_of(sums, dict(task="passkey", eval_len=40, seed=0), head_slopes(model), {}, 0.0, "x"))
    assert len(rows) == len(sums.answers) * 2 * 4 and rows["answers"].sum() == 4 * 3 * 8  # 4 seqs x 3 digits x 8 heads
    assert (rows.loc[rows["head"] == 3, "slope"] == 2.0**-8).all()
    # reach: the largest distance bin whose attention is >= 0.5, 0 for none; per seed
    hand = pd.DataFrame(dict(layer=0, head=[0, 0, 0, 1, 1, 1] * 2, distance=[4, 8, 16] * 4, answers=10,
                             attention=[0.9, 0.6, 0.4, 0.1, 0.2, 0.3, 0.9, 0.9, 0.7, 0.1, 0.2, 0.3],
                             seed=[0] * 6 + [1] * 6))
    assert reach(attention_curves(hand[hand.seed == 0])).tolist() == [8, 0]
    assert reach_by_seed(hand).loc[(0, 0)].tolist() == [8, 16]
    assert attention_curves(hand).loc[(0, 0), 8] == pytest.approx(0.75)



def test_each_seed_has_its_own_best_head_and_a_mix_keeps_the_table_of_its_sloped_heads():
    """Seed 0 retrieves with head 1.0, seed 1 with head 1.1: the best-head curve is theirs (0.9), not the mean of
    one head index over seeds (0.5). In a mix, the layer without slopes is left out of the slope table."""
    from alibi_lm.results.retrieval_store import best_heads, sloped_heads

    rows = []
    for seed, retriever in ((0, 0), (1, 1)):
        for layer, slope in ((0, None), (1, 0.25)):
            for head in (0, 1):
                strong = layer == 1 and head == retriever
                rows += [dict(seed=seed, layer=layer, head=head, distance=d, answers=5, slope=slope,
                              attention=0.9 if strong else 0.1) for d in (4, 8)]
    part = pd.DataFrame(rows)
    best = best_heads(part)
    assert best["head"].tolist() == ["1.0", "1.1"] and best[8].tolist() == pytest.approx([0.9, 0.9])
    assert best["reach"].tolist() == [8, 8]
    heads = sloped_heads(part)
    assert list(heads.index) == [(1, 0), (1, 1)]
    assert heads.loc[(1, 0), ("curve", 8)] == pytest.approx(0.5)  # one head index pooled over seeds
    assert heads.loc[(1, 0), "reach"].tolist() == [8, 0] and heads.loc[(1, 0), "slope_x_reach"].tolist() == [2, 0]


def test_sequences_per_length_halve_past_4L_down_to_a_quarter():
    from alibi_lm.eval.retrieval import sequences_at

    assert [sequences_at(64, 64, lv) for lv in (64, 128, 256, 512, 1024, 2048)] == [64, 64, 64, 32, 16, 16]
    assert sequences_at(2, 32, 1024) == 1
