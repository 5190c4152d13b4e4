"""Every position and model preset in configs/ composes with `train` and builds a working model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from alibi_lm.model import LMConfig, TransformerLM
from alibi_lm.positions import POSITION_SCHEMES

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
POSITIONS = sorted(p.stem for p in (CONFIGS / "position").glob("*.yaml"))
MODELS = sorted(p.stem for p in (CONFIGS / "model").glob("*.yaml"))
TINY = ["model=tiny", "model.n_layer=1", "model.n_head=2", "model.d_model=16", "model.d_ff=32"]
TINY += ["model.adaptive_cutoffs=null"]  # vocab_size 100 is below any preset's cutoffs


def compose_train(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


def lm_config(cfg, vocab_size: int) -> LMConfig:
    model = OmegaConf.to_container(cfg.model, resolve=True)
    position = OmegaConf.to_container(cfg.position, resolve=True)
    return LMConfig(
        vocab_size=vocab_size,
        position=cfg.position.name,
        position_options={k: v for k, v in position.items() if k != "name"},
        **{k: v for k, v in model.items() if k != "name"},
    )


def test_config_folders_match_the_registry():
    assert set(POSITIONS) == set(POSITION_SCHEMES)
    assert {"paper", "small", "tiny"} <= set(MODELS)


@pytest.mark.parametrize("position", POSITIONS)
def test_position_config_builds_a_model(position):
    cfg = compose_train([f"position={position}", *TINY])
    assert cfg.position.name == position
    lm = lm_config(cfg, vocab_size=100)
    assert lm.position == position and "name" not in lm.position_options
    torch.manual_seed(0)
    model = TransformerLM(lm).eval()
    assert type(model.position) is POSITION_SCHEMES[position]
    idx = torch.randint(0, 100, (2, 16))
    with torch.no_grad():
        logits = model(idx)
    assert logits.shape == (2, 16, 100) and torch.isfinite(logits).all()


def test_learned_max_len_follows_train_seq_len():
    cfg = compose_train(["position=learned", *TINY])
    assert lm_config(cfg, 100).position_options == {"max_len": cfg.train.seq_len}
    cfg = compose_train(["position=learned", "train.seq_len=48", *TINY])
    model = TransformerLM(lm_config(cfg, 100))
    assert model.position.max_positions == 48
    cfg = compose_train(["position=learned", "train.seq_len=48", "position.max_len=96", *TINY])
    assert TransformerLM(lm_config(cfg, 100)).position.max_positions == 96


def test_position_options_reach_the_scheme():
    cfg = compose_train(["position=t5", "position.num_buckets=16", "position.max_distance=64", *TINY])
    t5 = TransformerLM(lm_config(cfg, 100)).position
    assert (t5.num_buckets, t5.max_distance, t5.bias_table.weight.shape[0]) == (16, 64, 16)
    cfg = compose_train(["position=rope", "position.base=500.0", *TINY])
    assert TransformerLM(lm_config(cfg, 100)).position.base == 500.0


@pytest.mark.parametrize("preset", MODELS)
def test_model_preset_composes_and_builds(preset):
    cfg = compose_train([f"model={preset}"])
    assert cfg.model.name == preset
    lm = lm_config(cfg, vocab_size=267735)  # WikiText-103's word vocabulary fits every preset's cutoffs
    with torch.device("meta"):  # shapes only: the paper model is 247M parameters
        model = TransformerLM(lm)
    assert len(model.blocks) == cfg.model.n_layer
    if preset == "tiny":  # the CPU default, as it is: run it for real on a vocabulary its cutoffs fit
        vocab = max(lm.adaptive_cutoffs or [0]) + 100
        torch.manual_seed(0)
        model = TransformerLM(lm_config(cfg, vocab_size=vocab)).eval()
        idx = torch.randint(0, vocab, (1, 16))
        with torch.no_grad():
            assert torch.isfinite(model.loss(idx[:, :-1], idx[:, 1:])).all()
    if preset == "paper":
        assert abs(model.num_params() - 247e6) / 247e6 < 0.005
        assert cfg.model.adaptive_cutoffs == [20000, 60000]
