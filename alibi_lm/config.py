"""From a composed Hydra config to the objects the code needs, and the checks that run before any
work starts (data loading, tokenizing, training): each failure is a one-line UserError."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from .errors import UserError
from .model import LMConfig
from .positions import POSITION_SCHEMES


def position_options(cfg: DictConfig) -> dict:
    return {k: v for k, v in OmegaConf.to_container(cfg.position, resolve=True).items() if k != "name"}


def model_config(cfg: DictConfig, vocab_size: int) -> LMConfig:
    model = {k: v for k, v in OmegaConf.to_container(cfg.model, resolve=True).items() if k != "name"}
    try:
        return LMConfig(vocab_size=vocab_size, position=cfg.position.name, position_options=position_options(cfg), **model)
    except (TypeError, ValueError) as e:
        raise UserError(f"bad model config: {e}") from None


def _positive(cfg: DictConfig, *keys: str) -> None:
    for key in keys:
        value = OmegaConf.select(cfg, key)
        if value is not None and not value > 0:
            raise UserError(f"{key} must be > 0, got {value}; set {key}=<positive number>")


def validate_train_config(cfg: DictConfig) -> None:
    """Everything that can be checked from the config alone, before data or tokenizing."""
    name = cfg.position.name
    if name not in POSITION_SCHEMES:
        raise UserError(f"unknown position scheme {name!r}; choose one of {', '.join(sorted(POSITION_SCHEMES))}")
    _positive(cfg, "train.seq_len", "train.batch_size", "train.grad_accum", "train.max_steps", "train.max_tokens",
              "train.lr", "train.eval_every", "train.checkpoint_every", "train.eval_tokens")
    if cfg.train.warmup_steps < 0:
        raise UserError(f"train.warmup_steps must be >= 0, got {cfg.train.warmup_steps}")
    m = cfg.model
    _positive(cfg, "model.n_layer", "model.n_head", "model.d_model", "model.attn_query_block")
    if m.d_model % m.n_head:
        raise UserError(f"model.d_model={m.d_model} is not divisible by model.n_head={m.n_head}; "
                        f"make d_model a multiple of n_head")
    if name == "rope" and (m.d_model // m.n_head) % 2:
        raise UserError(f"rope needs an even head dimension, got model.d_model/model.n_head = {m.d_model // m.n_head}; "
                        f"change d_model or n_head")
    max_len = position_options(cfg).get("max_len")
    if max_len is not None and max_len < cfg.train.seq_len:
        raise UserError(f"position.max_len={max_len} is shorter than train.seq_len={cfg.train.seq_len}; "
                        f"set position.max_len>={cfg.train.seq_len}")
    if cfg.logger.wandb.mode not in ("offline", "online", "disabled"):
        raise UserError(f"logger.wandb.mode must be offline, online or disabled, got {cfg.logger.wandb.mode!r}")
    if cfg.train.device not in ("auto", "cpu", "cuda"):
        raise UserError(f"train.device must be auto, cpu or cuda, got {cfg.train.device!r}")
    if cfg.train.evaluate_after:
        validate_eval_config(cfg)
    try:  # building the model on the meta device checks options without allocating anything
        import torch

        from .model import TransformerLM

        with torch.device("meta"):
            TransformerLM(model_config(cfg, vocab_size=max(8, (m.adaptive_cutoffs or [0])[-1] + 1)))
    except ValueError as e:
        raise UserError(str(e)) from None


def validate_eval_config(cfg: DictConfig) -> None:
    ev = cfg.eval
    if ev.mode not in ("nonoverlapping", "sliding"):
        raise UserError(f"eval.mode must be nonoverlapping or sliding, got {ev.mode!r}")
    lengths = list(ev.lengths or []) + list(ev.multipliers or [])
    if not lengths:
        raise UserError("no evaluation lengths: set eval.multipliers=[1,2,4,8] or eval.lengths=[...]")
    if any(x < 1 for x in lengths):
        raise UserError(f"eval lengths and multipliers must be >= 1, got {lengths}")
    if ev.mode == "sliding" and (ev.stride is None or ev.stride < 1):
        raise UserError(f"eval.stride must be >= 1 with eval.mode=sliding, got {ev.stride}")
    if ev.split not in ("valid", "test"):
        raise UserError(f"eval.split must be valid or test, got {ev.split!r}")
