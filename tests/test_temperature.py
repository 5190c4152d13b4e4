"""Attention temperature: Scalable-Softmax (model.ssmax, trained) and Llama 4's temperature tuning
(eval.temperature_tuning, at evaluation); and the labels that give variants of a scheme rows of their own."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import V, compose_config, tokens

from alibi_lm.attention import AttentionWindow, TemperatureTuning
from alibi_lm.config import EvalConfig
from alibi_lm.errors import ConfigError, UserError
from alibi_lm.model import KVCache, LMConfig, TransformerLM, position_label
from alibi_lm.positions.alibi import alibi_slopes


def one_layer(position: str, **overrides) -> TransformerLM:
    torch.manual_seed(0)
    model = TransformerLM(LMConfig(n_layer=1, n_head=4, d_model=32, vocab_size=V, position=position, **overrides))
    return model.eval()


def queries_and_keys(model: TransformerLM, x: torch.Tensor):
    """(q, k) (B, H, T, Dh) of the model's first layer, recomputed from its weights (a scheme without rotation)."""
    h = model.blocks[0].ln_attn(model.vocab.embed(x) * model.embed_scale)  # (B, T, D)
    B, T, D = h.shape
    qkv = model.blocks[0].attn.qkv(h).view(B, T, 3, 4, D // 4).permute(2, 0, 3, 1, 4)  # (3, B, H, T, Dh)
    return qkv[0], qkv[1]


@pytest.mark.parametrize("position", ["alibi", "nope"])
def test_ssmax_multiplies_every_logit_by_s_log_n(position):
    """softmax(s_h log(i + 1) (q k^T / sqrt(Dh) - m_h (i - j))) over the keys j <= i, from the layer's own q and k
    and the published slopes: the model's attention probabilities, and its SDPA path's output, agree with it."""
    model = one_layer(position, ssmax=True)
    s = torch.tensor([0.2, 0.43, 1.0, -0.3])
    model.blocks[0].attn.ssmax.data.copy_(s)
    x, T = tokens(2, 12), 12
    with torch.no_grad():
        _, probs = model(x, return_attention=True)
        q, k = queries_and_keys(model, x)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    logits = q @ k.transpose(-2, -1) / math.sqrt(8)  # (B, H, T, T)
    if position == "alibi":
        logits = logits - alibi_slopes(4)[:, None, None] * (i - j)
    logits = logits * (s[:, None] * torch.log(torch.arange(1, T + 1).float()))[:, :, None]  # (H, T, 1)
    expected = logits.masked_fill(j > i, float("-inf")).softmax(-1)
    torch.testing.assert_close(probs[0], expected, rtol=1e-5, atol=1e-6)
    assert torch.allclose(probs[0][:, :, 0, 0], torch.ones(1))  # n = 1: log 1 = 0, one key, no 0 * inf


@pytest.mark.parametrize("position", ["alibi", "rope", "t5", "fox", "cope"])
def test_ssmax_paths_and_kv_cache_agree(position):
    """The fused SDPA path (query blocks of 4), the explicit path and token-by-token decoding with the KV cache
    give the same logits; log n counts the keys in the cache."""
    model = TransformerLM(LMConfig(n_layer=2, n_head=4, d_model=32, vocab_size=V, position=position, ssmax=True,
                                   attn_query_block=4)).eval()
    for block in model.blocks:
        block.attn.ssmax.data.normal_(0.5, 0.5)
    x = tokens(2, 11)
    with torch.no_grad():
        fused = model(x)
        explicit, _ = model(x, return_attention=True)
        cache = KVCache(2)
        steps = [model(x[:, :5], cache=cache)] + [model(x[:, t : t + 1], start_pos=t, cache=cache) for t in range(5, 11)]
    torch.testing.assert_close(fused, explicit, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused, torch.cat(steps, 1), rtol=1e-5, atol=1e-5)


def test_ssmax_log_n_counts_the_keys_inside_a_window():
    """With a sliding window of 4, query i attends min(i + 1, 4) keys: n stops growing at the window."""
    from alibi_lm.attention import AttentionContext, MaskCache
    from alibi_lm.positions import build_position_scheme

    ctx = AttentionContext(build_position_scheme("nope", 2, 8), MaskCache(), 0, 0, 7, "cpu", 128,
                           window=AttentionWindow("sliding", 4))
    assert torch.allclose(ctx.log_keys_seen, torch.log(torch.tensor([1.0, 2, 3, 4, 4, 4, 4])))
    chunked = AttentionContext(build_position_scheme("nope", 2, 8), MaskCache(), 0, 0, 7, "cpu", 128,
                               window=AttentionWindow("chunk", 3))
    assert torch.allclose(chunked.log_keys_seen, torch.log(torch.tensor([1.0, 2, 3, 1, 2, 3, 1])))


def test_ssmax_scales_are_learned_and_recorded():
    model = TransformerLM(LMConfig(n_layer=2, n_head=4, d_model=32, vocab_size=V, position="alibi", ssmax=True,
                                   position_options={"learn_slopes": True}))
    values = model.learned_values()
    assert values["ssmax_s_1_3"] == pytest.approx(0.43) and len([k for k in values if k.startswith("ssmax")]) == 8
    assert values["alibi_slope_0"] == pytest.approx(float(alibi_slopes(4)[0]))
    loss = model(tokens(2, 9), targets=tokens(2, 9, seed=2)).mean()
    loss.backward()
    assert model.blocks[0].attn.ssmax.grad.abs().sum() > 0


def test_temperature_tuning_is_llama4s_formula():
    """Hugging Face's Llama 4: 1 + attn_scale * log(floor((p + 1) / floor_scale) + 1), written out at a few p."""
    tt = TemperatureTuning(floor_scale=8192, attn_scale=0.1)
    p = torch.tensor([0, 8190, 8191, 16383, 100_000])
    expected = [1.0, 1.0, 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(3), 1 + 0.1 * math.log(100_001 // 8192 + 1)]
    assert tt.scale(p).tolist() == pytest.approx(expected, rel=1e-6)


def test_temperature_tuning_scales_the_queries_of_the_nope_layers_of_a_mix_only():
    """rope with NoPE every 2nd layer: layer 0 (rope) attends as without tuning, layer 1 (NoPE) attends with its
    queries scaled past floor_scale; a one-scheme model has every layer tuned."""
    torch.manual_seed(0)
    model = TransformerLM(LMConfig(n_layer=2, n_head=4, d_model=32, vocab_size=V, position="rope", nope_every=2)).eval()
    x = tokens(1, 24)
    with torch.no_grad():
        _, plain = model(x, return_attention=True)
        model.temperature_tuning = TemperatureTuning(floor_scale=8, attn_scale=2.0)
        _, tuned = model(x, return_attention=True)
    torch.testing.assert_close(tuned[0], plain[0])
    torch.testing.assert_close(tuned[1][:, :, :7], plain[1][:, :, :7])  # positions < floor_scale - 1: scale 1
    assert not torch.allclose(tuned[1][:, :, 7:], plain[1][:, :, 7:], atol=1e-4)
    single = one_layer("nope")
    with torch.no_grad():
        _, before = single(x, return_attention=True)
        single.temperature_tuning = TemperatureTuning(floor_scale=8, attn_scale=2.0)
        _, after = single(x, return_attention=True)
    assert not torch.allclose(before[0][:, :, 7:], after[0][:, :, 7:], atol=1e-4)


def test_temperature_tuning_rows_carry_their_settings():
    from types import SimpleNamespace

    from alibi_lm.eval import evaluation

    calls = []
    scorer = SimpleNamespace(set_temperature_tuning=lambda f, a: calls.append((f, a)))
    assert evaluation.temperature_tuning(scorer, EvalConfig(), 64) == ""
    assert evaluation.temperature_tuning(scorer, EvalConfig(temperature_tuning=True), 64) == "temperature"
    assert evaluation.temperature_tuning(scorer, EvalConfig(temperature_tuning=True, attn_scale=0.3, floor_scale=32),
                                         64) == "temperature-a0.3-f32"
    assert calls == [(64, 0.1), (32, 0.3)]
    assert evaluation.attention_label("bca", "temperature") == "bca+temperature"
    assert evaluation.attention_label("full", "") == "full"
    with pytest.raises(UserError, match="eval.temperature_tuning needs a model trained by alibi_lm"):
        evaluation.temperature_tuning(SimpleNamespace(), EvalConfig(temperature_tuning=True), 64)
    with pytest.raises(ConfigError, match="eval.floor_scale must be >= 1"):
        EvalConfig(floor_scale=0)


def test_variants_have_labels_run_folders_and_stay_in_their_experiment():
    """A labeled option (alibi's learn_slopes, fox's rope, rope's fraction) or model setting (qk_norm, ssmax, a
    mix) names the run folder and rows; the experiment keeps its name. Another model setting makes it custom."""
    from alibi_lm.naming import custom_name
    from alibi_lm.train import NOT_MODEL_KEYS

    assert position_label(LMConfig(position="alibi", position_options={"learn_slopes": True}, vocab_size=V,
                                   ssmax=True)) == "alibi+learn_slopes+ssmax"
    assert position_label({"position": "fox", "position_options": {"rope": True}}) == "fox+rope"
    assert position_label({"position": "rope", "position_options": {"fraction": 0.25}, "qk_norm": True}) \
        == "rope+fraction0.25+qk_norm"
    assert position_label({"position": "alibi", "position_options": {}}) == "alibi"  # a checkpoint without the keys
    cfg = compose_config("train", "experiment=cpu-wt2", "position=alibi", "position.learn_slopes=true")
    assert cfg.hydra.run.dir.endswith("cpu-wt2/alibi+learn_slopes-L128-seed0")
    for variant in (["position=alibi", "position.learn_slopes=true"], ["position=nope", "model.ssmax=true"],
                    ["position=rope", "model.nope_every=4", "model.local_window=64"]):
        args = ["experiment=cpu-wt2", *variant]
        assert custom_name(args, NOT_MODEL_KEYS) == args
    renamed = custom_name(["experiment=cpu-wt2", "position=nope", "model.ssmax=true", "model.ssmax_init=0.3"],
                          NOT_MODEL_KEYS)
    assert any(a.startswith("name=cpu-wt2-custom-") for a in renamed)


def test_task_evaluation_refuses_evaluation_time_attention_changes(tmp_path):
    from alibi_lm.eval.task_evaluation import TaskEvaluation

    for change in ({"attention": "bca"}, {"temperature_tuning": True}):
        with pytest.raises(UserError, match="a synthetic task is scored with the attention it was trained with"):
            TaskEvaluation(tmp_path, EvalConfig(**change), tmp_path, "cpu")


def test_ssmax_refuses_flex_attention_in_one_line():
    with pytest.raises(ConfigError, match="model.ssmax scales every logit per query"):
        LMConfig(vocab_size=V, position="alibi", ssmax=True, attention="flex")
    assert one_layer("alibi", ssmax=True).attention_backend("cpu") == "sdpa"
