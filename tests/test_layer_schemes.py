"""One position scheme per layer (model.nope_every, model.nope_position) and attention windows on the main
scheme's layers (model.local_window, model.chunk): which layer uses which scheme, what each query sees, the
KV cache and query blocks, the refusals, the unchanged default, and the names of runs and rows."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import compose_config, make, tokens
from forked_app import run_python

from alibi_lm.attention import AttentionContext, AttentionWindow
from alibi_lm.errors import ConfigError
from alibi_lm.model import KVCache, LMConfig, TransformerLM, layer_schemes, position_label

ROOT = Path(__file__).resolve().parents[1]


def test_layers_alternate_between_the_schemes(monkeypatch):
    """nope_every=2 on 4 layers: layers 1 and 3 (the 2nd and 4th, HF's 1-based interval) rotate nothing."""
    model = make("rope", n_layer=4, nope_every=2)
    assert layer_schemes(model.cfg) == ["rope", "nope", "rope", "nope"]
    assert list(model.schemes()) == ["rope", "nope"] and list(model.state_dict()) == list(make("rope", n_layer=4).state_dict())
    calls = []
    for name, scheme in model.schemes().items():
        rotate = scheme.rotate
        monkeypatch.setattr(scheme, "rotate", lambda qk, pos, name=name, rotate=rotate: calls.append(name) or rotate(qk, pos))
    with torch.no_grad():
        mixed = model(tokens(2, 12))
    assert calls == ["rope", "nope", "rope", "nope"]
    rope, nope = make("rope", n_layer=4), make("nope", n_layer=4)  # the same weights (seed 0), one scheme each
    with torch.no_grad():
        assert not torch.allclose(mixed, rope(tokens(2, 12))) and not torch.allclose(mixed, nope(tokens(2, 12)))


def test_a_nope_layer_is_a_nope_models_layer():
    """With nope_every=2 on 2 layers, layer 1 of the mix computes what a NoPE model's layer 1 computes on the same input."""
    mixed, nope = make("alibi", nope_every=2), make("nope")
    nope.load_state_dict(mixed.state_dict())  # neither scheme has parameters
    x = torch.randn(2, 10, 32)
    with torch.no_grad():
        ctx = mixed._contexts(x.device, 0, 0, 10, False, None)
        ours = mixed.blocks[1](x, ctx["nope"], None, 1, None)
        theirs = nope.blocks[1](x, nope._contexts(x.device, 0, 0, 10, False, None)["nope"], None, 1, None)
        assert torch.equal(ours, theirs)
        assert not torch.allclose(mixed.blocks[0](x, ctx["alibi"], None, 0, None), nope.blocks[0](x, ctx["nope"], None, 0, None))


def old_hidden(model: TransformerLM, idx):
    """TransformerLM.hidden as it was with one scheme for every layer: one AttentionContext for the whole forward."""
    ctx = AttentionContext(model.position, model.masks, 0, 0, idx.shape[1], idx.device, model.cfg.attn_query_block)
    x = model.vocab.embed(idx) * model.embed_scale  # (B, T, D)
    pos_emb = model.position.embedding(ctx.q_pos)
    x = x if pos_emb is None else x + pos_emb.to(x.dtype)
    for layer, block in enumerate(model.blocks):
        x = block(x, ctx, None, layer, None)
    return model.ln_f(x)


@pytest.mark.parametrize("position", ["alibi", "rope", "learned", "t5"])
def test_the_default_is_one_scheme_for_every_layer(position):
    model = make(position, attn_query_block=8)
    assert model.cfg.nope_every is None and model.cfg.local_window is None and model.cfg.chunk is None
    assert model.layer_window is None and len(model.other_positions) == 0 and position_label(model.cfg) == position
    assert not any(key.startswith("other_positions") for key in model.state_dict())
    idx = tokens(2, 20)
    with torch.no_grad():
        assert torch.equal(model.hidden(idx), old_hidden(model, idx))
    old = {k: v for k, v in vars(model.cfg).items() if k not in ("nope_every", "nope_position", "local_window", "chunk")}
    assert LMConfig(**old) == model.cfg  # an older checkpoint's model_config


def decode(model, idx, prefix: int):
    cache = KVCache(model.cfg.n_layer)
    out = [model(idx[:, :prefix], cache=cache)]
    out += [model(idx[:, i : i + 1], start_pos=i, cache=cache) for i in range(prefix, idx.shape[1])]
    return torch.cat(out, dim=1)  # (B, T, V)


@pytest.mark.parametrize("position,window", [("alibi", {}), ("rope", {"local_window": 5}), ("alibi", {"chunk": 4}),
                                             ("fox", {"local_window": 3}), ("t5", {"chunk": 6})])
def test_kv_cache_and_query_blocks_match_the_full_forward(position, window):
    model = make(position, n_layer=4, nope_every=2, **window)
    blocked = make(position, n_layer=4, nope_every=2, attn_query_block=4, **window)
    idx = tokens(2, 19)
    with torch.no_grad():
        full = model(idx)
        again = model(idx)  # the masks' caches, one per scheme, reused
        assert torch.allclose(decode(model, idx, 6), full, atol=1e-5)
        assert torch.allclose(blocked(idx), full, atol=1e-5)
        assert torch.equal(again, full)
        probs = model(idx, return_attention=True)[1]  # the explicit path, windows and all
        assert torch.allclose(model(idx, return_attention=True)[0], full, atol=1e-5)
    if window:  # the main scheme's layers (0, 2) see no key outside the window; the NoPE ones (1, 3) see all
        size = window.get("local_window") or window["chunk"]
        assert (probs[0][..., -1, : 19 - size - 1] == 0).all() and (probs[1][..., -1, :2] > 0).all()


def changed_at(model, idx, query: int, where: int) -> bool:
    """Whether query `query`'s logits change when token `where` does."""
    other = idx.clone()
    other[:, where] = (other[:, where] + 1) % model.cfg.vocab_size
    with torch.no_grad():
        return not torch.allclose(model(idx)[:, query], model(other)[:, query])


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_a_sliding_window_sees_the_last_w_tokens(position):
    model, idx = make(position, n_layer=1, local_window=4), tokens(1, 16)
    assert not changed_at(model, idx, 10, 6) and not changed_at(model, idx, 10, 0)  # keys 7..10 only
    assert changed_at(model, idx, 10, 7) and changed_at(model, idx, 10, 10)
    assert not changed_at(model, idx, 2, 3)  # still causal


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_chunked_attention_sees_its_own_chunk(position):
    model, idx = make(position, n_layer=1, chunk=4), tokens(1, 16)
    assert not changed_at(model, idx, 10, 7) and changed_at(model, idx, 10, 8)  # query 10's chunk: 8..11
    assert not changed_at(model, idx, 8, 7) and changed_at(model, idx, 11, 8) and not changed_at(model, idx, 9, 10)


def test_nope_layers_are_not_windowed():
    """nope_every=2 on 2 layers with a window of 2: layer 1 (NoPE) still reaches the first token."""
    model, idx = make("rope", nope_every=2, local_window=2), tokens(1, 12)
    assert changed_at(model, idx, 11, 0)
    assert not changed_at(make("rope", local_window=2), idx, 11, 0)  # rope in both layers: at most 2 back per layer


def test_windows_by_index():
    q, k = torch.arange(8, 12), torch.arange(12)
    sliding, chunk = AttentionWindow("sliding", 3).outside(q, k), AttentionWindow("chunk", 4).outside(q, k)
    assert (~sliding).sum(-1).tolist() == [6, 5, 4, 3]  # keys >= i - 2, future ones included (causality is apart)
    assert (~sliding[0, 6:]).all() and sliding[0, :6].all()
    assert chunk[:, :8].all() and (~chunk[:, 8:]).all()
    with pytest.raises(ValueError):
        AttentionWindow("slide", 3)


@pytest.mark.parametrize("fields,needle", [
    ({"position": "sinusoidal", "nope_every": 4}, "model.nope_every cannot mix position=sinusoidal"),
    ({"position": "learned", "nope_every": 2}, "model.nope_every cannot mix position=learned"),
    ({"position": "rope", "nope_every": 2, "nope_position": "learned"}, "cannot mix position=learned"),
    ({"position": "rope", "nope_every": 1}, "model.nope_every must be >= 2"),
    ({"position": "rope", "local_window": 8, "chunk": 8}, "model.local_window and model.chunk"),
    ({"position": "rope", "local_window": 0}, "model.local_window must be >= 1"),
    ({"position": "rope", "nope_every": 2, "nope_position": "nopos"}, "unknown position scheme 'nopos'"),
])  # fmt: skip
def test_refusals_are_one_line(fields, needle):
    with pytest.raises(ConfigError) as e:
        LMConfig(vocab_size=10, **fields)
    assert needle in str(e.value) and "\n" not in str(e.value)
    LMConfig(vocab_size=10, position="sinusoidal", local_window=8)  # a window is per layer whatever the scheme


def test_evaluation_window_and_a_trained_window_are_refused_together():
    from alibi_lm.errors import UserError
    from alibi_lm.subjects import NativeScorer

    scorer = NativeScorer(make("rope", chunk=8))
    with pytest.raises(UserError, match="rope-c8"):
        scorer.set_attention_window("bca", 16)
    mixed = NativeScorer(make("rope", nope_every=2))  # no trained window: bca restricts every layer
    mixed.set_attention_window("bca", 4)  # two layers, each from the previous block's start: 15 <- 8 <- 4
    assert changed_at(mixed.model, tokens(1, 16), 15, 4) and not changed_at(mixed.model, tokens(1, 16), 15, 3)


def test_labels_and_run_folders_name_the_mix():
    assert position_label(LMConfig(vocab_size=10, position="rope", nope_every=4)) == "rope+nope4"
    assert position_label(LMConfig(vocab_size=10, position="rope", nope_every=4, local_window=64)) == "rope+nope4-w64"
    assert position_label(LMConfig(vocab_size=10, position="alibi", chunk=64)) == "alibi-c64"
    assert position_label({"position": "alibi", "vocab_size": 10}) == "alibi"  # an older checkpoint's model_config
    cfg = compose_config("train", "experiment=tasks", "task=passkey", "position=rope", "model.nope_every=4",
                         "model.chunk=16")
    assert cfg.hydra.run.dir.endswith("/passkey-rope+nope4-c16-L64-seed0")
    assert compose_config("train", "position=rope").hydra.run.dir.endswith("/rope-L128-seed0")


def test_naming_treats_the_new_fields_as_model_changing():
    from alibi_lm.train import NOT_MODEL_KEYS

    for key in ("model.nope_every", "model.nope_position", "model.local_window", "model.chunk"):
        assert not key.startswith(NOT_MODEL_KEYS)


@pytest.mark.slow
def test_training_from_the_command_line_names_the_mix(tmp_path):
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    args = ["experiment=tasks", "name=tasks", "task=passkey", "position=rope", "model.nope_every=2", "model.n_layer=2",
            "model.local_window=16", "model.d_model=32", "train.seq_len=32", "train.max_steps=4", "train.eval_every=2",
            "train.checkpoint_every=2", "eval.multipliers=[1]", "eval.examples=8", f"paths.runs={tmp_path / 'runs'}",
            f"paths.results={tmp_path / 'results'}"]
    done = run_python(["-m", "alibi_lm.train", *args], env, ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "runs" / "tasks" / "passkey-rope+nope2-w16-L32-seed0" / "config.yaml").exists()
    rows = pd.read_csv(tmp_path / "results" / "tasks" / "tasks.csv", keep_default_na=False)
    assert len(rows) and set(rows["position"]) == {"rope+nope2-w16"}
    report = run_python(["-m", "alibi_lm.results", tmp_path / "results" / "tasks"], env, ROOT, timeout=600)
    assert report.returncode == 0, report.stderr[-2000:]
    assert "rope+nope2-w16" in (tmp_path / "results" / "tasks" / "tasks.md").read_text()
