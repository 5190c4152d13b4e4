"""Inference-time RoPE extension (position.scaling at evaluation) against Hugging Face transformers'
modeling_rope_utils.py (_compute_linear_scaling_rope_parameters, _compute_ntk_parameters,
_compute_dynamic_ntk_parameters, _compute_yarn_parameters and the dynamic update rule), written out
here in numpy; then what the evaluate app does with it: rows, labels, errors."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import write_run
from forked_app import run_python
from omegaconf import OmegaConf

from alibi_lm.errors import UserError
from alibi_lm.eval import evaluation
from alibi_lm.model import LMConfig, TransformerLM
from alibi_lm.positions import build_position_scheme
from alibi_lm.positions.rope import RotaryEmbedding, rope_frequencies
from alibi_lm.results import store
from alibi_lm.subjects import native as subject

# ---------------------------------------------------------------------------------------------
# transformers' formulas (dim = head dimension, L = max_position_embeddings = the training length)


def hf_default(dim, base):
    return 1.0 / base ** (np.arange(0, dim, 2) / dim)


def hf_linear(dim, base, factor, L, seq_len=None):
    return hf_default(dim, base) / factor, 1.0


def hf_ntk(dim, base, factor, L, seq_len=None):
    return hf_default(dim, base * factor ** (dim / (dim - 2))), 1.0


def hf_dynamic(dim, base, factor, L, seq_len=None):
    seq_len = seq_len if seq_len is not None and seq_len > L else L
    return hf_default(dim, base * ((factor * seq_len / L) - (factor - 1)) ** (dim / (dim - 2))), 1.0


def hf_yarn(dim, base, factor, L, seq_len=None, beta_fast=32, beta_slow=1):
    attention_factor = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0  # get_mscale(factor)

    def find_correction_dim(num_rotations):
        return (dim * math.log(L / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(find_correction_dim(beta_fast)), 0)
    high = min(math.ceil(find_correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2) - low) / (high - low), 0, 1)
    extrapolation_factor = 1 - ramp
    pos_freqs = base ** (np.arange(0, dim, 2) / dim)
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation_factor) + (1.0 / pos_freqs) * extrapolation_factor
    return inv_freq, attention_factor


def hf_llama3(dim, base, factor, L, seq_len=None, low_freq_factor=1.0, high_freq_factor=4.0):
    inv_freq = hf_default(dim, base)
    low_freq_wavelen, high_freq_wavelen = L / low_freq_factor, L / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (L / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return np.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama), 1.0


HF = {"linear": hf_linear, "ntk": hf_ntk, "dynamic": hf_dynamic, "yarn": hf_yarn, "llama3": hf_llama3}


@pytest.mark.parametrize("dim, base, factor, L", [(32, 10000.0, 4.0, 64), (128, 500000.0, 8.0, 8192), (16, 10000.0, 2.0, 16)])
def test_llama3_is_transformers_own_function(dim, base, factor, L):
    """Beside the formula written out above: transformers' own llama3 initialiser, where it is installed."""
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(hidden_size=dim * 2, num_attention_heads=2, head_dim=dim, max_position_embeddings=L,
                         rope_theta=base, rope_scaling=dict(rope_type="llama3", factor=factor, low_freq_factor=1.0,
                                                            high_freq_factor=4.0, original_max_position_embeddings=L))
    theirs, attention = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    ours, our_attention = rope_frequencies(dim, base, "llama3", factor, L)
    np.testing.assert_allclose(ours.numpy(), theirs.double().numpy(), rtol=1e-6, atol=0)  # theirs: float32
    assert our_attention == attention == 1.0


def test_p_rope_rotates_only_the_highest_frequency_pairs():
    """p-RoPE keeps theta_i of the first round(p Dh / 2) pairs (not re-spaced, as partial rotary would) and leaves the
    rest unrotated: those channels read the same at every position."""
    full = build_position_scheme("rope", n_head=2, d_model=64)  # head dim 32: 16 pairs
    part = build_position_scheme("rope", n_head=2, d_model=64, fraction=0.25)
    assert torch.equal(part.inv_freq[:4], full.inv_freq[:4]) and (part.inv_freq[4:] == 0).all()
    x = torch.randn(5, 32)
    for scheme in (full, part):
        scheme.check_positions(100)
    pos = torch.tensor([0, 3, 17, 50, 99])
    turned = part.rotate(x, pos)
    still = torch.cat([torch.arange(4, 16), torch.arange(20, 32)])  # pairs 4..15: (x_k, x_{k+16})
    assert torch.equal(turned[:, still], x[:, still])
    torch.testing.assert_close(turned[:, [0, 1, 2, 3, 16, 17, 18, 19]], full.rotate(x, pos)[:, [0, 1, 2, 3, 16, 17, 18, 19]])
    part.set_scaling("yarn", 4.0, 64)  # an extension keeps the unrotated pairs unrotated
    assert (part.inv_freq[4:] == 0).all()


@pytest.mark.parametrize("method", sorted(HF))
@pytest.mark.parametrize("dim, base, factor, L", [(32, 10000.0, 4.0, 64), (8, 10000.0, 2.0, 16), (64, 500000.0, 16.0, 2048),
                                                  (16, 10000.0, 1.0, 128), (32, 10000.0, 2.5, 512)])
def test_frequencies_are_transformers(method, dim, base, factor, L):
    for seq_len in (None, L // 2, L, 3 * L):
        inv_freq, attention = rope_frequencies(dim, base, method, factor, L, seq_len)
        ref_inv, ref_attention = HF[method](dim, base, factor, L, seq_len)
        assert inv_freq.dtype == torch.float64 and inv_freq.shape == (dim // 2,)
        np.testing.assert_allclose(inv_freq.numpy(), ref_inv, rtol=1e-12, atol=0)
        assert attention == pytest.approx(ref_attention, rel=1e-12)


def test_yarn_known_values():
    # dim 32, base 1e4, L 64: pairs turning more than 32 times over L are pairs < 0, fewer than once
    # pairs > 4.03, so the ramp runs from pair 0 (kept) to pair 5 (interpolated)
    plain, _ = rope_frequencies(32, 10000.0)
    inv_freq, attention = rope_frequencies(32, 10000.0, "yarn", 4.0, 64)
    assert attention == pytest.approx(0.1 * math.log(4) + 1)  # 1.1386
    assert inv_freq[0] == plain[0]
    torch.testing.assert_close(inv_freq[5:], plain[5:] / 4, rtol=1e-15, atol=0)
    ramp = torch.tensor([0.2, 0.4, 0.6, 0.8], dtype=torch.float64)
    torch.testing.assert_close(inv_freq[1:5], plain[1:5] / 4 * ramp + plain[1:5] * (1 - ramp), rtol=1e-15, atol=0)
    # a Llama-like head (dim 128, L 4096): the ramp spans pairs 20..46 (low = floor(20.9), high = ceil(45.0))
    inv_freq, _ = rope_frequencies(128, 10000.0, "yarn", 8.0, 4096)
    plain, _ = rope_frequencies(128, 10000.0)
    assert torch.equal(inv_freq[:21], plain[:21]) and not torch.equal(inv_freq[21], plain[21])
    torch.testing.assert_close(inv_freq[46:], plain[46:] / 8, rtol=1e-15, atol=0)


def test_factor_one_is_plain_rope():
    plain, _ = rope_frequencies(32, 10000.0)
    for method in HF:
        inv_freq, attention = rope_frequencies(32, 10000.0, method, 1.0, 64, seq_len=64)
        torch.testing.assert_close(inv_freq, plain, rtol=1e-15, atol=0)
        assert attention == 1.0


def rotate_reference(x, positions, inv_freq, attention):
    """RoPE on one (T, Dh) array: pair k = (x_k, x_{k+Dh/2}) turned by p * inv_freq[k], times attention."""
    half = x.shape[-1] // 2
    out = np.empty_like(x)
    for t, p in enumerate(positions):
        for k in range(half):
            c, s = math.cos(p * inv_freq[k]), math.sin(p * inv_freq[k])
            out[t, k] = (x[t, k] * c - x[t, k + half] * s) * attention
            out[t, k + half] = (x[t, k + half] * c + x[t, k] * s) * attention
    return out


@pytest.mark.parametrize("method", sorted(HF))
def test_scaled_rotation_applies_the_frequencies_and_the_attention_factor(method):
    torch.manual_seed(0)
    rope = build_position_scheme("rope", n_head=2, d_model=64)  # head dim 32
    rope.set_scaling(method, 4.0, 64)
    positions = [0, 1, 63, 200, 255]
    rope.check_positions(256)
    x = torch.randn(len(positions), 32)
    got = rope.rotate(x, torch.tensor(positions)).double().numpy()
    inv_freq, attention = HF[method](32, 10000.0, 4.0, 64, 256)
    np.testing.assert_allclose(got, rotate_reference(x.double().numpy(), positions, inv_freq, attention), rtol=1e-4,
                               atol=2e-5)
    rope.set_scaling(None, 1.0, 64)  # back to the trained model, bit for bit
    rope.check_positions(256)
    fresh = build_position_scheme("rope", n_head=2, d_model=64)
    fresh.check_positions(256)
    assert torch.equal(rope.rotate(x, torch.tensor(positions)), fresh.rotate(x, torch.tensor(positions)))


def test_dynamic_follows_transformers_update_rule():
    """Recompute when a longer input arrives (growth only), back to the original below L."""
    rope = build_position_scheme("rope", n_head=2, d_model=64)
    rope.set_scaling("dynamic", 2.0, 64)

    def assert_at(seq_len):
        np.testing.assert_allclose(rope.inv_freq.numpy(), hf_dynamic(32, 10000.0, 2.0, 64, seq_len)[0], rtol=1e-12)

    for end, used in ((64, 64), (40, 64), (200, 200), (100, 200), (300, 300), (63, 64), (65, 65)):
        rope.check_positions(end)
        assert_at(used)
        assert rope.table_len >= end


def test_bad_scaling_values_and_schemes():
    rope = build_position_scheme("rope", n_head=2, d_model=16)
    with pytest.raises(ValueError, match="position.scaling must be one of linear, ntk, dynamic, yarn"):
        rope.set_scaling("longrope", 2.0, 64)
    for factor in (0.5, math.inf, math.nan, 1e300):  # 1e300 overflowed ntk's base; inf wrote NaN perplexities
        with pytest.raises(ValueError, match=r"position.scaling_factor must be (a finite number )?in \[1.0, 1000000000.0\], got"):
            rope.set_scaling("yarn", factor, 64)
    for name in ("alibi", "learned", "xpos", "fire"):
        scheme = build_position_scheme(name, n_head=2, d_model=16)
        scheme.set_scaling(None, 1.0, 64)  # no scaling: fine for every scheme
        with pytest.raises(ValueError, match=f"^the RoPE rescaling linear \\(extension=linear, or position.scaling=linear\\) "
                                             f"applies to runs trained with position=rope, not position={name}; drop it$"):
            scheme.set_scaling("linear", 2.0, 64)


# ---------------------------------------------------------------------------------------------
# The evaluate app

V = 61


def make_run(tmp_path, position="rope", L=16, name="exp"):
    torch.manual_seed(0)
    model = TransformerLM(LMConfig(vocab_size=V, n_layer=2, n_head=2, d_model=16, position=position))
    return write_run(tmp_path, model, L, name=name)


@pytest.fixture
def fake_data(monkeypatch):
    tokens = np.random.default_rng(5).integers(0, V, 16 * 8 + 1)
    data = SimpleNamespace(split=lambda name: tokens, vocab_size=V, tokenizer=None,
                           meta={"data": {"valid": "0123456789abcdef" * 4}})  # a cache entry's split checksums
    monkeypatch.setattr(subject, "prepare_data", lambda data_cfg, tokenizer_cfg: data)


EVAL = OmegaConf.create(dict(split="valid", mode="nonoverlapping", stride=None, multipliers=[1, 2, 4], lengths=[],
                             tokens_per_batch=256, max_tokens=None))


def test_evaluate_with_scaling_adds_its_own_rows(tmp_path, fake_data, monkeypatch):
    run, out = make_run(tmp_path), tmp_path / "results"
    calls = []
    original = RotaryEmbedding.set_scaling
    monkeypatch.setattr(RotaryEmbedding, "set_scaling",
                        lambda self, m, f, L: calls.append((m, f, L)) or original(self, m, f, L))
    plain = evaluation.evaluate_run(run, EVAL, out, device="cpu", progress=False)
    assert [r["rope_scaling"] for r in plain] == ["", "", ""]
    calls.clear()
    yarn = evaluation.evaluate_run(run, EVAL, out, device="cpu", progress=False, position_cfg={"scaling": "yarn"})
    assert calls == [("yarn", 1.0, 16), ("yarn", 1.0, 16), ("yarn", 2.0, 16), ("yarn", 4.0, 16)]  # s = Lv / L
    assert [r["rope_scaling"] for r in yarn] == ["yarn"] * 3
    assert yarn[0]["ppl"] == pytest.approx(plain[0]["ppl"], rel=1e-6)  # Lv = L: s = 1, the trained model
    assert yarn[2]["ppl"] != plain[2]["ppl"]
    fixed = evaluation.evaluate_run(run, EVAL, out, device="cpu", progress=False,
                                  position_cfg=OmegaConf.create({"scaling": "linear", "scaling_factor": 4}))
    assert {r["rope_scaling"] for r in fixed} == {"linear-x4"}
    df = pd.read_csv(out / "exp" / "extrapolation.csv", keep_default_na=False)
    assert len(df) == 9 and sorted(set(df["rope_scaling"])) == ["", "linear-x4", "yarn"]
    # re-evaluating a cell replaces only its own row
    evaluation.evaluate_run(run, EVAL, out, device="cpu", progress=False, position_cfg={"scaling": "yarn"})
    assert len(pd.read_csv(out / "exp" / "extrapolation.csv")) == 9
    report = (out / "exp" / "extrapolation.md").read_text()
    rows = [[c.strip() for c in line.split("|")] for line in report.splitlines() if line.startswith("| rope")]
    names = [r[1] for r in rows if not r[2].endswith("L")]  # the perplexity table, not the ratio table after it
    assert names == ["rope", "rope+linear-x4", "rope+yarn"]
    per_position = {p.name for p in (out / "exp" / "per_position").glob("*.csv")}
    assert "rope-L16-seed0-nonoverlapping-yarn-Lv32.csv" in per_position
    assert "rope-L16-seed0-nonoverlapping-Lv32.csv" in per_position
    # skip_done looks for rows of the same method only
    assert evaluation.evaluate_run(run, EVAL, out, device="cpu", progress=False, skip_done=True,
                                 position_cfg={"scaling": "yarn"}) == []
    rows = evaluation.evaluate_run(run, EVAL, out, device="cpu", progress=False, skip_done=True,
                                 position_cfg={"scaling": "ntk"})
    assert len(rows) == 3


def test_evaluate_refuses_scaling_for_other_schemes(tmp_path, fake_data):
    run, out = make_run(tmp_path, "alibi"), tmp_path / "results"
    with pytest.raises(UserError, match="applies to runs trained with position=rope, not position=alibi") as e:
        evaluation.evaluate_run(run, EVAL, out, device="cpu", progress=False, position_cfg={"scaling": "yarn"})
    assert "\n" not in str(e.value) and not out.exists()
    with pytest.raises(UserError, match="needs position.scaling"):
        evaluation.evaluate_run(make_run(tmp_path, "rope"), EVAL, out, device="cpu", position_cfg={"scaling_factor": 2})


def test_cli_rejects_an_unknown_method_in_one_line(tmp_path):
    proc = run_python(["-m", "alibi_lm.eval", f"run={tmp_path}", "position.scaling=longrope"],
                      cwd=Path(__file__).resolve().parents[1], timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("error: position.scaling must be one of linear, ntk, dynamic, yarn")


def test_a_csv_from_before_the_rope_scaling_column_still_reads(tmp_path):
    csv = tmp_path / store.CSV_NAME
    csv.write_text("position,train_len,eval_len,mode,stride,seed,split,ppl\nrope,16,32,nonoverlapping,,0,valid,30.5\n")
    key = dict(position="rope", train_len=16, eval_len=32, mode="nonoverlapping", stride=None, seed=0, split="valid")
    assert store.read_results(csv)["rope_scaling"].tolist() == [""]
    assert not store.has_row(csv, key, "0123456789abcdef", "")  # no weights column: done for no model
    row = dict(position="rope", train_len=16, eval_len=32, mode="nonoverlapping", stride=None, seed=0, split="valid",
               ppl=25.0)
    store.upsert_rows(csv, [{**row, "rope_scaling": "yarn"}, {**row, "ppl": 30.0}])
    df = store.read_results(csv)
    assert sorted(zip(df["rope_scaling"], df["ppl"])) == [("", 30.0), ("yarn", 25.0)]
