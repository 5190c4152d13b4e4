"""From a composed Hydra config to the objects the code needs, and the checks that run before any
work starts (data loading, tokenizing, training): each failure is a one-line UserError."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

from .errors import UserError
from .model import EXECUTION_FIELDS, LMConfig
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
    tc = cfg.train
    if (tc.max_steps is None) == (tc.max_tokens is None):
        raise UserError(f"set exactly one training budget, got train.max_steps={tc.max_steps} and train.max_tokens="
                        f"{tc.max_tokens}; to train by steps add train.max_tokens=null (experiments set max_tokens), "
                        f"to train by tokens add train.max_steps=null")
    if tc.optimizer not in ("adamw", "nag"):
        raise UserError(f"train.optimizer must be adamw or nag, got {tc.optimizer!r}")
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
    _check_data(json.dumps(OmegaConf.to_container(cfg.data, resolve=True), sort_keys=True),
                json.dumps(OmegaConf.to_container(cfg.tokenizer, resolve=True), sort_keys=True))
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
    if not list(ev.lengths or []) + list(ev.multipliers or []):
        raise UserError("no evaluation lengths: set eval.multipliers=[1,2,4,8] or eval.lengths=[...]")
    for key in ("multipliers", "lengths"):
        values = list(ev[key] or [])
        if any(not isinstance(x, (int, float)) or x < 1 for x in values):
            raise UserError(f"eval.{key} must hold numbers >= 1, got {values}; "
                            f"e.g. eval.{key}={'[1,2,4,8]' if key == 'multipliers' else '[64,128]'}")
    if ev.mode == "sliding" and (ev.stride is None or ev.stride < 1):
        raise UserError(f"eval.stride must be >= 1 with eval.mode=sliding, got {ev.stride}")
    if ev.split not in ("valid", "test"):
        raise UserError(f"eval.split must be valid or test, got {ev.split!r}")


@functools.lru_cache(maxsize=16)
def _check_data(data_json: str, tokenizer_json: str) -> None:
    # Once per distinct data/tokenizer config: a sweep's preflight validates many configs that share them.
    from .data import check_data

    check_data(json.loads(data_json), json.loads(tokenizer_json))


def check_writable(path, key: str) -> None:
    """`path` is a writable folder or can be created: its nearest existing ancestor is a writable folder."""
    path = Path(path).expanduser().absolute()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{key}={path} cannot be created: {existing} is a file, not a folder; set {key}=<a folder>")
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "is not writable" if existing == path else f"cannot be created ({existing} is not writable)"
        raise UserError(f"{key}={path} {what}; fix the permissions or set {key}=<a writable folder>")


# Run folder entries that must match the request for a resumed run to continue the same training.
RESUME_KEYS = ("model", "position", "data.name", "data.folder", "data.raw", "tokenizer", "train.seq_len", "seed")


def validate_train_run(cfg: DictConfig, run_dir: Path) -> None:
    """Checks of the run folder the train app is about to use, before Hydra writes into it: writable,
    train.resume consistent with what is there, and a resumed run's config unchanged."""
    from .checkpoint import CHECKPOINT, read_status

    check_writable(cfg.paths.runs, "paths.runs")
    check_writable(run_dir, "hydra.run.dir")
    if cfg.train.evaluate_after:
        check_writable(cfg.paths.results, "paths.results")
    resume, has_checkpoint = cfg.train.resume, (run_dir / CHECKPOINT).is_file()
    if resume not in (True, False, "auto"):
        raise UserError(f"train.resume must be true, false or auto, got {resume!r}")
    if resume is True and not has_checkpoint:
        raise UserError(f"train.resume=true but there is no checkpoint to resume: {run_dir / CHECKPOINT} does not "
                        f"exist; drop train.resume (or use train.resume=auto) to start the run from scratch")
    status = read_status(run_dir)["status"]
    if has_checkpoint and resume is False and status != "completed":
        raise UserError(f"{run_dir} already holds a checkpoint (status: {status}); add train.resume=true to continue "
                        f"it, or change name=/seed= (or delete the folder) for a new run")
    saved = run_dir / "config.yaml"
    if has_checkpoint and resume is not False and saved.is_file():
        try:
            old = OmegaConf.load(saved)
        except Exception:  # noqa: BLE001 - an unreadable config.yaml is reported by the resume itself
            return
        for key in RESUME_KEYS:
            before, now = OmegaConf.select(old, key, default=_MISSING), OmegaConf.select(cfg, key)
            if before is _MISSING:  # not in a config.yaml written before the key existed
                continue
            before, now = _plain(before), _plain(now)
            if key == "model":  # how the model computes (attention kernel, query blocks) may change on resume
                before, now = ({k: v for k, v in d.items() if k not in EXECUTION_FIELDS} for d in (before, now))
            diff = _difference(key, before, now)
            if diff:
                raise UserError(f"cannot resume {run_dir}: {diff} differs from its config.yaml; resume with the "
                                f"run's own settings, or change name=/seed= for a new run")


_MISSING = object()


def _plain(value):
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


def _difference(key: str, before, now) -> str | None:
    """The first key whose value differs, as 'key (old there, new now)'; keys absent from `before` are skipped."""
    if isinstance(before, dict) and isinstance(now, dict):
        for k in sorted(before):
            diff = _difference(f"{key}.{k}", before[k], now.get(k))
            if diff:
                return diff
        return None
    return None if before == now else f"{key} ({before!r} there, {now!r} now)"
