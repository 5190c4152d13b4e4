"""A run folder written by alibi_lm.train as a model under test (NativeSubject, with its NativeScorer): the model
from its checkpoint, its own data and tokenizer checked against the ones it was trained with."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..checkpoint import CHECKPOINT, check_usable_run, config_differences, is_run_dir, load_checkpoint, read_status
from ..config import autocast_dtype
from ..data import UNK, TokenData, load_tokenizer, prepare_data
from ..errors import UserError, check_name
from ..labels import label_number
from ..model import EXECUTION_FIELDS, AttentionWindow, LMConfig, TemperatureTuning, TransformerLM, position_label
from ..provenance import device_name, git_commit, model_digest, repo_relative, weights_digest
from .base import Subject, digit_ids


def check_run_dir(run_dir: Path) -> None:
    if not is_run_dir(run_dir):
        what = "does not exist" if not Path(run_dir).exists() else "is not a run folder"
        raise UserError(f"{run_dir} {what}: a run folder holds config.yaml and {CHECKPOINT} "
                        f"(written by python -m alibi_lm.train); pass run=<such a folder>")


ALLOW_FAILED = "allow_failed_run"  # the key (evaluate and probes apps) that scores a failed run on purpose
# what a run is, as its checkpoint records it and its config.yaml says: a checkpoint from another run folder (or a
# config.yaml edited since) differs in one of them, and its rows would carry the folder's labels
RECORDED_KEYS = ("name", "seed", "task_name", "task.", "model.", "data.name", "data.folder", "tokenizer.", "train.seq_len",
                 "train.positions", "train.max_position")


def check_recorded_config(run_dir: Path, cfg: DictConfig, state: dict) -> None:
    """The checkpoint's own model config (and, where it records it, its training config) equals config.yaml's, as a
    resume requires (how the model executes aside); else a one-line UserError."""
    written = OmegaConf.to_container(cfg, resolve=True)
    ignore = tuple(f"model.{name}" for name in (*EXECUTION_FIELDS, "vocab_size"))
    diff = config_differences({"model": state["model_config"]}, written, ("model.",), ignore)
    diff = diff or config_differences(state.get("config") or {}, written, RECORDED_KEYS, ignore)
    if diff:
        more = f" (and {len(diff) - 1} more)" if len(diff) > 1 else ""
        raise UserError(f"{run_dir}/{CHECKPOINT} does not belong to its run folder: {diff[0]}{more}; its rows would "
                        f"carry the folder's labels: put back the run's own checkpoint or config.yaml, or retrain")


def load_run(run_dir: Path, device="cpu", allow_failed: bool = False) -> tuple[TransformerLM, DictConfig, dict]:
    """(model in eval mode on device, the run's resolved config, the checkpoint dict) with one-line errors: a run
    that failed or whose weights are not finite is refused unless allow_failed (checkpoint.check_usable_run), and
    so is a checkpoint whose recorded config is not its config.yaml's (check_recorded_config)."""
    run_dir = Path(run_dir)
    check_run_dir(run_dir)
    try:
        cfg = OmegaConf.load(run_dir / "config.yaml")
        for key in ("name", "seed", "train.seq_len", "data", "tokenizer"):
            if OmegaConf.select(cfg, key) is None:
                raise UserError(f"{run_dir}/config.yaml has no {key}; it was not written by alibi_lm.train")
    except (OmegaConfBaseException, OSError, ValueError, yaml.YAMLError) as e:
        raise UserError(f"{run_dir}/config.yaml is not a readable config ({type(e).__name__}); "
                        f"restore it from the checkpoint's 'config' entry or retrain") from None
    state = load_checkpoint(run_dir / CHECKPOINT, map_location="cpu")
    check_usable_run(run_dir, state, ALLOW_FAILED, allow_failed)
    check_recorded_config(run_dir, cfg, state)
    try:
        model = checkpoint_model(state)
    except (TypeError, ValueError, RuntimeError, KeyError) as e:
        reason = str(e).strip().splitlines()[0][:200]
        raise UserError(f"checkpoint {run_dir / CHECKPOINT} does not match the model config saved with it "
                        f"({reason}); retrain the run or restore its checkpoint") from None
    set_trained_scaling(model, read_finetune_record(run_dir))  # a fine-tune's rescaling: the frequencies it trained with
    return model.to(device).eval(), cfg, state


def checkpoint_model(state: dict) -> TransformerLM:
    """The model of a checkpoint's state (a run's, or a kept step's) as it is scored: its weights, executed as
    evaluation_model_config says; a fine-tune's rescaling is the caller's (set_trained_scaling)."""
    model = TransformerLM(LMConfig(**evaluation_model_config(state["model_config"])))
    model.load_state_dict(state["model"])
    return model


def evaluation_model_config(model_config: dict) -> dict:
    """A checkpoint's model config as a loaded run executes it: model.attention=flex, the training machine's choice,
    becomes auto. Auto still takes FlexAttention wherever it runs right on the device that loads the run (CUDA, heads
    at least FLEX_MIN_HEAD_DIM wide) and SDPA elsewhere, so a run trained on CUDA with heads 16-31 wide is scored on a
    CPU, whose kernel refuses them, and on a torch without FlexAttention. The outputs are the same computation either
    way (an execution field: EXECUTION_FIELDS)."""
    if model_config.get("attention") != "flex":
        return model_config
    return {**model_config, "attention": "auto"}


def run_skeleton(run_dir: Path) -> tuple[NativeScorer, int] | None:
    """(a scorer of the run's model without weights, on the meta device; the L its rows and extensions use) from
    its config.yaml and finetune.json alone: what a preflight asks of a run's scheme without loading its
    checkpoint. None where the folder or its config cannot say (loading the run then reports why, in one line)."""
    try:
        cfg = OmegaConf.load(Path(run_dir) / "config.yaml")
        model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
        record = read_finetune_record(run_dir)
        train_len = evaluated_train_len(cfg.train.seq_len, record)
        model_cfg["vocab_size"] = model_cfg.get("vocab_size") or 2  # the tokenizer's, set by training; no weights here
        with torch.device("meta"):  # shapes only: nothing is allocated or initialised for real
            model = TransformerLM(LMConfig(**model_cfg))
        set_trained_scaling(model, record)
    except Exception:  # a damaged config, another version's keys, a scheme that cannot be built on meta: a preflight
        return None    # is never worse than none, and loading the run says what is wrong in one line
    return NativeScorer(model), train_len


def evaluated_train_len(seq_len, record: dict | None) -> int:
    """The L a run's rows sit at and its extensions scale with: its train.seq_len, a fine-tune's parent's."""
    return int(record["parent_train_len"]) if record is not None else int(seq_len)


def run_data(run_dir: Path, cfg: DictConfig, state: dict) -> TokenData:
    """A run's data tokenized as in training (load_run's cfg and checkpoint), checked against the vocabulary
    and tokenizer the run was trained with."""
    data, saved_vocab = prepare_data(cfg.data, cfg.tokenizer), int(state["model_config"]["vocab_size"])
    if int(data.vocab_size) != saved_vocab:
        raise UserError(f"the tokenizer gives {data.vocab_size} types but {run_dir}/{CHECKPOINT} was trained "
                        f"with vocab_size={saved_vocab}; the data/tokenizer config or its cache changed since training")
    saved = Path(run_dir) / "tokenizer.json"
    if saved.is_file() and load_tokenizer(saved).get_vocab() != data.tokenizer.get_vocab():
        raise UserError(f"{saved} differs from the tokenizer built from the run's data/tokenizer config; the "
                        f"data or its cache changed since training, so its token ids would be misread")
    return data


FINETUNE_JSON = "finetune.json"  # a fine-tune's record (training/finetune.py): its parent, scale and budget


def read_finetune_record(run_dir: Path) -> dict | None:
    """A fine-tune's finetune.json (training/finetune.py), or None for a run trained from scratch."""
    path = Path(run_dir) / FINETUNE_JSON
    try:
        record = json.loads(path.read_text()) if path.is_file() else None
    except (ValueError, OSError) as e:  # a JSONDecodeError is a ValueError
        raise UserError(f"{path} is not readable ({type(e).__name__}); the fine-tune's record is written with it: "
                        f"retrain the fine-tune (delete {run_dir}) or restore the file") from None
    if record is not None and not isinstance(record, dict):
        raise UserError(f"{path} is not a fine-tune's record (a JSON object); retrain the fine-tune or restore the file")
    return record


def set_trained_scaling(model: TransformerLM, record: dict | None) -> None:
    """A fine-tune trained with train.finetune_scaling: RoPE's rescaling at factor s (its record's scale) on the
    parent's L, set on the model's scheme as its training set it, so that its validation, a resume, the evaluation
    and the probes all run the frequencies it learned. model.finetune_scaling names it (None: no rescaling), which
    NativeScorer.set_scaling reads to refuse a second rescaling on top."""
    name = (record or {}).get("rescaling")
    if name is not None:
        model.position.set_scaling(name, float(record["scale"]), int(record["parent_train_len"]))
    model.finetune_scaling = name


def finetune_label(record: dict) -> str:
    """The position suffix of a fine-tune's rows: +ft<s>x<fraction>, and -<rescaling> for a rescaled RoPE one."""
    rescaling = f"-{record['rescaling']}" if record.get("rescaling") else ""
    return f"+ft{label_number(record['scale'])}x{label_number(record['fraction'])}{rescaling}"


class NativeScorer:
    """A trained TransformerLM (alibi_lm.model) as a scorer."""

    def __init__(self, model):
        self.model = model
        self.max_positions = model.position.max_positions  # a learned table's size; None: any length
        self.check_positions = model.position.check_positions

    def set_scaling(self, method: str | None, factor: float, train_len: int) -> None:
        """RoPE's rescaling at evaluation (the scheme's set_scaling); refused in one line on a fine-tune that trained
        with one (set_trained_scaling), whose frequencies are its own."""
        trained = getattr(self.model, "finetune_scaling", None)
        if trained is not None:
            raise UserError(f"this run was fine-tuned with train.finetune_scaling={trained} (its finetune.json), which "
                            f"every load applies; drop the rescaling {method} (extension=, position.scaling=) for it")
        self.model.position.set_scaling(method, factor, train_len)

    def set_attention_window(self, kind: str, size: int) -> None:
        """Restrict attention at evaluation: kind bca with blocks of `size` (model.AttentionWindow)."""
        if self.model.layer_window is not None:
            raise UserError(f"eval.attention={kind} cannot restrict a model trained with its own window "
                            f"({position_label(self.model.cfg)}); drop eval.attention")
        self.model.attention_window = AttentionWindow(kind, size)

    def set_temperature_tuning(self, floor_scale: int, attn_scale: float) -> None:
        """Llama 4's query temperature at evaluation (model.TemperatureTuning)."""
        self.model.temperature_tuning = TemperatureTuning(floor_scale, attn_scale)

    def set_extension(self, method) -> None:
        """A training-free extension's mask and distance remap in every layer (model.set_extension; one line if the
        scheme has no use for it)."""
        self.model.set_extension(method)

    def loss(self, idx, targets):
        return self.model(idx, targets=targets)  # (B, T)

    __call__ = loss  # how scoring.score_stream calls a model

    def last_logprobs(self, idx, n: int):
        h = self.model.hidden(idx)[:, -n:]  # (B, n, D): only the last n positions reach the output layer
        return self.model.vocab.logits(h).float().log_softmax(-1)  # (B, n, V)


def native_encoder(tokenizer) -> Callable[[str], list[int]]:
    """A trained run's encoder for prompt pieces: " " + the piece's words. A piece follows other text, and
    WikiText's lines open with a space, so every word is space-prefixed in running text; the pieces'
    ids then join into the ids of the whole prompt. A byte-level BPE (add_prefix_space=False) would
    otherwise read a piece's edge spaces as tokens of their own ("is " -> "Ġis", "Ġ") and a digit with no
    space ("3", never "Ġ3" as in running text). A word-level tokenizer splits on whitespace: the same ids."""

    def encode(text: str) -> list[int]:
        words = text.split()
        return tokenizer.encode(" " + " ".join(words), add_special_tokens=False).ids if words else []

    return encode


def trained_precision(run_dir: Path, cfg: DictConfig) -> str:
    """How a run trained, for precision=auto: its last training segment's precision (status.json), so that a run
    trained on CPUs is scored in float32 on a GPU too. A segment from before segments recorded it: float32 on a
    CPU, else the run's train.precision ("auto": the evaluating device decides)."""
    last = (read_status(run_dir).get("train_segments") or [{}])[-1]
    if last.get("precision"):
        return str(last["precision"])
    if str(last.get("device") or "").startswith("cpu"):
        return "fp32"
    return str(OmegaConf.select(cfg, "train.precision", default="auto"))


class NativeSubject(Subject):
    """A run folder written by alibi_lm.train, with its own data and tokenizer (checked against its checkpoint)."""

    def __init__(self, run_dir: Path, results_root: Path, device: torch.device, precision: str = "auto",
                 allow_failed: bool = False):
        model, cfg, state = load_run(run_dir, device, allow_failed)
        self.note = check_usable_run(run_dir, state, ALLOW_FAILED, allowed=True)  # "": a run fit to be scored
        self.dtype = autocast_dtype(device, trained_precision(run_dir, cfg) if precision == "auto" else precision)
        self.data = run_data(run_dir, cfg, state)  # the run's own tokenization
        self._encode = native_encoder(self.data.tokenizer)
        self.scorer, self.device, self._digits = NativeScorer(model), device, None
        said = state.get("config") or OmegaConf.to_container(cfg, resolve=True)  # rows say what the checkpoint is
        tuned = read_finetune_record(run_dir)  # a short fine-tune at s L: its rows sit at the parent's L
        self.identity = dict(position=position_label(state["model_config"]) + (finetune_label(tuned) if tuned else ""),
                             train_len=evaluated_train_len(said["train"]["seq_len"], tuned), seed=int(said["seed"]))
        self.provenance = dict(run=repo_relative(run_dir), step=state.get("step"), weights=weights_digest(model),
                               model=model_digest(state["model_config"]), data=cfg.data.name, commit=git_commit(),
                               device=device_name(device, self.dtype))
        check_name(f"{run_dir}/config.yaml's name", said["name"])  # results/<name>/: one folder
        self.out_dir = Path(results_root) / str(said["name"])
        self.completed = read_status(run_dir)["status"] == "completed"

    def encode(self, text: str) -> list[int]:
        return self._encode(text)

    def tokens(self, split: str) -> np.ndarray:
        return np.asarray(self.data.split(split))  # a memmap of the cache entry

    def split_sha(self, split: str) -> str:
        return self.data.meta["data"][split][:16]  # the cache entry's key: no second read of the text

    def digit_ids(self) -> list[int]:
        if self._digits is None:
            tokenizer = self.data.tokenizer  # a BPE has no <unk>: token_to_id gives None
            self._digits = digit_ids(self.encode, tokenizer.token_to_id, tokenizer.token_to_id(UNK))
        return list(self._digits)


def open_native(run_dir: Path, results_root: Path, device: torch.device, precision: str = "auto",
                allow_failed: bool = False) -> NativeSubject:
    """A run folder written by alibi_lm.train as a Subject, computing at `precision` (auto: the run's own); a failed
    run only with allow_failed (its rows say so: NativeSubject.note)."""
    return NativeSubject(Path(run_dir), results_root, device, precision, allow_failed)
