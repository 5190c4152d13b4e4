"""Fidelity to the paper's fairseq model: T5's untrained buckets, adaptive-input init, the NAG optimizer,
preset cutoffs on any vocabulary."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from alibi_lm.model import LMConfig, TransformerLM
from alibi_lm.optim import build_optimizer, build_scheduler
from alibi_lm.positions import t5_relative_bucket
from alibi_lm.vocab import AdaptiveVocabulary, fit_cutoffs

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def train_cfg(**over):
    base = dict(optimizer="adamw", lr=1e-2, betas=[0.9, 0.98], weight_decay=0.1, momentum=0.99, warmup_steps=2,
                warmup_init_lr=None, min_lr_ratio=0.1)
    return OmegaConf.create({**base, **over})


def test_t5_buckets_training_never_reaches_add_exactly_nothing():
    L, V = 16, 50
    torch.manual_seed(0)
    model = TransformerLM(LMConfig(vocab_size=V, n_layer=1, n_head=2, d_model=16, position="t5"))
    opt = build_optimizer(model, train_cfg())  # AdamW with weight decay 0.1 on matrices
    for _ in range(5):
        idx = torch.randint(0, V, (4, L + 1))
        model(idx[:, :-1], targets=idx[:, 1:]).mean().backward()
        opt.step()
        opt.zero_grad()
    table = model.position.bias_table.weight  # (32, H)
    reached = t5_relative_bucket(-torch.arange(L)).unique()  # distances 0..L-1 seen in training
    unreached = sorted(set(range(32)) - set(reached.tolist()))
    assert unreached and (table[unreached] == 0).all()  # zero init, no gradient, no decay: exactly 0
    assert (table[reached] != 0).all()  # the reached buckets did train
    # so at 8L every distance in an unreached bucket gets exactly the bias 0
    q = torch.arange(8 * L)
    bias = model.position.score_bias(q, q)  # (H, 8L, 8L)
    far = torch.isin(t5_relative_bucket(q[None, :] - q[:, None]), torch.tensor(unreached))  # (8L, 8L)
    assert far.any() and (bias[:, far] == 0).all()


def test_position_parameters_are_not_decayed():
    model = TransformerLM(LMConfig(vocab_size=50, n_layer=1, n_head=2, d_model=16, position="t5"))
    decayed = {id(p) for p in build_optimizer(model, train_cfg()).param_groups[0]["params"]}
    assert id(model.position.bias_table.weight) not in decayed
    assert id(model.blocks[0].attn.qkv.weight) in decayed


def test_adaptive_input_has_fairseq_per_band_scale():
    """After the model's sqrt(d) scale, band i's input has per-element std sqrt(2 d / (d + d_i)) (embedding
    N(0, d_i^-1/2) times xavier_uniform (d, d_i)); the projections are xavier_uniform."""
    d, factor = 256, 4
    torch.manual_seed(0)
    vocab = AdaptiveVocabulary(3000, d, [1000, 2000], factor)
    for i, (lo, hi) in enumerate(zip(vocab.edges, vocab.edges[1:])):
        d_i = d // factor**i
        bound = math.sqrt(6 / (d + d_i))
        proj = vocab.projections[i]
        assert proj.abs().max() <= bound and abs(proj.std().item() - bound / math.sqrt(3)) < 0.05 * bound
        assert abs(vocab.tables[i].std().item() - d_i**-0.5) < 0.05 * d_i**-0.5
        x = vocab.embed(torch.arange(lo, hi)) * math.sqrt(d)  # (V_i, D)
        expected = math.sqrt(2 * d / (d + d_i))
        assert abs(x.std().item() - expected) < 0.05 * expected, (i, x.std().item(), expected)


def test_nag_is_fairseqs_update_under_a_changing_lr():
    """torch SGD(nesterov) as built for train.optimizer=nag against fairseq's NAG formula, written out here."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3, bias=False)
    ref = model.weight.detach().clone()
    cfg = train_cfg(optimizer="nag", lr=0.5, weight_decay=0.0, warmup_steps=3, warmup_init_lr=1e-3)
    opt = build_optimizer(model, cfg)
    sched = build_scheduler(opt, cfg, total_steps=8)
    m, buf, lr_old = 0.99, torch.zeros_like(ref), None
    for _ in range(8):
        x = torch.randn(5, 4)
        lr = opt.param_groups[0]["lr"]
        model.zero_grad()
        (model(x) ** 2).sum().backward()
        g = model.weight.grad.detach().clone()
        opt.step()
        sched.step()
        # fairseq/optim/nag.py
        correct = lr / (lr_old if lr_old is not None else lr)
        ref = ref + buf * (m * m * correct) - (1 + m) * lr * g
        buf = buf * (m * correct) - lr * g
        lr_old = lr
        torch.testing.assert_close(model.weight.detach(), ref, rtol=1e-5, atol=1e-6)
        with torch.no_grad():  # keep both on the same point so that gradients agree
            model.weight.copy_(ref)


def test_warmup_starts_at_warmup_init_lr_and_peaks_at_lr():
    model = torch.nn.Linear(2, 2)
    cfg = train_cfg(optimizer="nag", lr=1.0, warmup_steps=4, warmup_init_lr=1e-7, min_lr_ratio=1e-4, weight_decay=0.0)
    opt = build_optimizer(model, cfg)
    sched = build_scheduler(opt, cfg, total_steps=10)
    lrs = []
    for _ in range(10):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(1e-7) and lrs[4] == pytest.approx(1.0)
    assert lrs[2] == pytest.approx(1e-7 + (1 - 1e-7) * 2 / 4)
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-4)  # the cosine floor after the last step


@pytest.mark.parametrize(("cutoffs", "vocab", "expected"), [
    ([20000, 60000], 267735, [20000, 60000]),  # the paper's preset on WikiText-103
    ([20000, 60000], 33278, [20000]),  # on WikiText-2: the 60000 band is past the end
    ([2000, 10000], 97, []),  # nothing fits: plain tied softmax
    (None, 1000, []),
])
def test_preset_cutoffs_fit_any_vocabulary(cutoffs, vocab, expected):
    assert fit_cutoffs(cutoffs, vocab) == expected
    model = TransformerLM(LMConfig(vocab_size=vocab, n_layer=1, n_head=2, d_model=16, adaptive_cutoffs=cutoffs))
    edges = getattr(model.vocab, "edges", [0, vocab])
    assert edges == [0, *expected, vocab]
    assert model(torch.zeros(1, 3, dtype=torch.long)).shape == (1, 3, vocab)


def paper_settings_table() -> list[tuple[str, str, str]]:
    """(setting, keys, values) of every row of the paper table (docs/paper-model.md) that names alibi-lm keys."""
    readme = (Path(__file__).resolve().parents[1] / "docs" / "paper-model.md").read_text()
    table = readme.split("<!-- paper-settings:start -->")[1].split("<!-- paper-settings:end -->")[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in table.strip().splitlines()[2:]]
    return [(r[0], r[3], r[4]) for r in rows if r[3].startswith("`")]


def test_experiment_paper_matches_the_readme_table_of_official_settings():
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["experiment=paper"])
    rows = paper_settings_table()
    assert len(rows) >= 25
    for setting, keys, values in rows:
        keys = keys.replace("`", "").split(", ")
        values = values.replace("`", "").split(", ") if len(keys) > 1 else [values.replace("`", "")]
        for key, value in zip(keys, values, strict=True):
            expected = yaml.safe_load(value)
            assert OmegaConf.select(cfg, key, default="<missing>") == expected, (setting, key)


def test_paper_preset_builds_on_wikitext2_vocabulary_size():
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["experiment=paper", "model.n_layer=1"])
    model_cfg = {k: v for k, v in OmegaConf.to_container(cfg.model, resolve=True).items()
                 if k not in ("vocab_size", "position", "position_options")}
    with torch.device("meta"):
        model = TransformerLM(LMConfig(vocab_size=33278, position="alibi", **model_cfg))
    assert model.vocab.edges == [0, 20000, 33278]
    assert isinstance(model.blocks[0].mlp.act, torch.nn.ReLU) and isinstance(model.ln_f, torch.nn.Identity)
