"""The model under test, whichever kind it is: a run folder written by alibi_lm.train (NativeSubject) or a
Hugging Face causal LM (run=hf:<folder>, HFSubject in hf.py). Evaluation (evaluation.py) and the probes
(alibi_lm/probes/) see only the Subject protocol: a scorer, a text encoder, the token stream of a split,
the digits' ids, and the identity and provenance its rows carry. Tests hand in subjects of their own.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..checkpoint import CHECKPOINT, is_run_dir, load_checkpoint, read_status
from ..config import autocast_dtype, check_writable, resolve_device
from ..data import UNK, TokenData, load_tokenizer, prepare_data
from ..errors import UserError
from ..model import AttentionWindow, LMConfig, TemperatureTuning, TransformerLM, position_label
from ..positions import PositionRangeError
from ..provenance import device_name, git_commit, repo_relative, weights_digest

# A cell is "not applicable" on check_positions' PositionRangeError, or on the IndexError of a Hugging Face model
# past a learned position table that hf.LEARNED_TABLES does not name (CPU only: on CUDA a device-side assert).
NOT_APPLICABLE = (PositionRangeError, IndexError)
DIGITS = "0123456789"


def check_job(job, output_dir=None, needs_train_len: bool = True) -> None:
    """The preflight of a job that opens a Subject (a config.SubjectJob: an EvalJob, a ProbesJob): the device,
    the run folder (or run=hf:'s model and data; needs_train_len: its L must be known) and the results folder."""
    from . import hf  # hf.py builds on this module's Subject

    resolve_device(job.device)
    if hf.is_hf(job.run):
        hf.check(job, needs_train_len)
    elif job.run:
        check_run_dir(Path(job.run))
    check_writable(job.results_root(), "paths.results")


def check_run_dir(run_dir: Path) -> None:
    if not is_run_dir(run_dir):
        what = "does not exist" if not Path(run_dir).exists() else "is not a run folder"
        raise UserError(f"{run_dir} {what}: a run folder holds config.yaml and {CHECKPOINT} "
                        f"(written by python -m alibi_lm.train); pass run=<such a folder>")


def load_run(run_dir: Path, device="cpu") -> tuple[TransformerLM, DictConfig, dict]:
    """(model in eval mode on device, the run's resolved config, the checkpoint dict) with one-line errors."""
    run_dir = Path(run_dir)
    check_run_dir(run_dir)
    try:
        cfg = OmegaConf.load(run_dir / "config.yaml")
        for key in ("name", "seed", "train.seq_len", "data", "tokenizer"):
            if OmegaConf.select(cfg, key) is None:
                raise UserError(f"{run_dir}/config.yaml has no {key}; it was not written by alibi_lm.train")
    except (OmegaConfBaseException, OSError, ValueError) as e:
        raise UserError(f"{run_dir}/config.yaml is not a readable config ({type(e).__name__}); "
                        f"restore it from the checkpoint's 'config' entry or retrain") from None
    state = load_checkpoint(run_dir / CHECKPOINT, map_location="cpu")
    try:
        model = TransformerLM(LMConfig(**state["model_config"]))
        model.load_state_dict(state["model"])
    except (TypeError, ValueError, RuntimeError, KeyError) as e:
        reason = str(e).strip().splitlines()[0][:200]
        raise UserError(f"checkpoint {run_dir / CHECKPOINT} does not match the model config saved with it "
                        f"({reason}); retrain the run or restore its checkpoint") from None
    return model.to(device).eval(), cfg, state


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


class Scorer(Protocol):
    """What the evaluation and the probes call on a model (NativeScorer, hf.HFScorer, the tests' hand-made ones);
    max_positions (the longest input it can read, None for any) is optional."""

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """idx (B, T), targets (B, T) -> (B, T) per-token negative log-likelihood (also the scorer's __call__,
        as scoring.score_stream calls a model)."""

    def last_logprobs(self, idx: torch.Tensor, n: int) -> torch.Tensor:
        """idx (B, T) -> (B, n, V) log-probabilities of the next token at the last n positions."""

    def check_positions(self, end: int) -> None:
        """Raise PositionRangeError when the model cannot see position end - 1."""

    def set_scaling(self, method: str | None, factor: float, train_len: int) -> None:
        """The inference-time extension (evaluation.rope_scaling, called only when one is asked for): rope's,
        or a ValueError (every other scheme, a Hugging Face model)."""


class NativeScorer:
    """A trained TransformerLM (alibi_lm.model) as a scorer."""

    def __init__(self, model):
        self.model = model
        self.max_positions = model.position.max_positions  # a learned table's size; None: any length
        self.check_positions = model.position.check_positions
        self.set_scaling = model.position.set_scaling

    def set_attention_window(self, kind: str, size: int) -> None:
        """Restrict attention at evaluation: kind bca with blocks of `size` (model.AttentionWindow)."""
        if self.model.layer_window is not None:
            raise UserError(f"eval.attention={kind} cannot restrict a model trained with its own window "
                            f"({position_label(self.model.cfg)}); drop eval.attention")
        self.model.attention_window = AttentionWindow(kind, size)

    def set_temperature_tuning(self, floor_scale: int, attn_scale: float) -> None:
        """Llama 4's query temperature at evaluation (model.TemperatureTuning)."""
        self.model.temperature_tuning = TemperatureTuning(floor_scale, attn_scale)

    def loss(self, idx, targets):
        return self.model(idx, targets=targets)  # (B, T)

    __call__ = loss  # how scoring.score_stream calls a model

    def last_logprobs(self, idx, n: int):
        h = self.model.hidden(idx)[:, -n:]  # (B, n, D): only the last n positions reach the output layer
        return self.model.vocab.logits(h).float().log_softmax(-1)  # (B, n, V)


class Subject(Protocol):
    """A model under test. identity (position, train_len, seed: which model a row belongs to; train_len None: a
    Hugging Face model whose config names no L) and provenance (run, step, weights: provenance.weights_digest,
    rows are done for these only; data, commit, device) go into its rows; out_dir is results/<experiment>/."""

    scorer: Scorer
    identity: dict
    provenance: dict
    out_dir: Path
    device: torch.device
    dtype: torch.dtype | None  # what its forwards autocast to (config.autocast_dtype); None: float32
    completed: bool  # a trained run that finished (a Hugging Face model always has)

    def encode(self, text: str) -> list[int]:
        """Text in WikiText's tokenized form, as running text -> ids, no special tokens."""

    def tokens(self, split: str) -> np.ndarray:
        """The split's ids (N,)."""

    def split_sha(self, split: str) -> str:
        """The split's text's sha256, 16 hex digits (the rows' data_sha)."""

    def digit_ids(self) -> list[int]:
        """The ids of "0" .. "9", one token each, found (and checked) when the passkey probe first asks, so
        that a vocabulary without them still runs the context probe."""

    def word_count(self, split: str) -> int | None:
        """WikiText's word-level token count of the split (a Hugging Face model's word_ppl), None: not counted."""
        return None

    def autocast(self):  # the subject's precision, as score_stream
        return torch.autocast(self.device.type, dtype=self.dtype or torch.float32, enabled=self.dtype is not None)

    @property
    def name(self) -> str:
        seed, L = self.identity["seed"], self.identity["train_len"]
        return f"{self.identity['position']} L={'unknown' if L is None else L}" + ("" if seed is None else f" seed {seed}")


def digit_ids(encode, vocab_lookup=None, unk_id=None) -> list[int]:
    """One token id per digit 0-9: encode(d) when it is a single token, else vocab_lookup(d). A digit that
    is <unk> (unk_id: a word vocabulary cut by tokenizer.vocab_size) or shares its id with another would
    make keys that differ read the same: refused."""
    ids = []
    for d in DIGITS:
        found = encode(d)
        token = found[0] if len(found) == 1 else (vocab_lookup(d) if vocab_lookup else None)
        if token is None:
            raise UserError(f"the tokenizer has no single token for the digit {d} (it gives {found}); "
                            f"the passkey needs one token per digit")
        ids.append(int(token))
    missing = [d for d, i in zip(DIGITS, ids) if unk_id is not None and i == unk_id]
    if missing or len(set(ids)) < len(DIGITS):
        what = f"the digits {' '.join(missing)} are not in the vocabulary (<unk>)" if missing else f"digit ids {ids} repeat"
        raise UserError(f"{what}: the passkey probe needs ten distinct digit tokens, probe=context does not "
                        f"(a word vocabulary keeps the digits with a larger tokenizer.vocab_size, or null)")
    return ids


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

    def __init__(self, run_dir: Path, results_root: Path, device: torch.device, precision: str = "auto"):
        model, cfg, state = load_run(run_dir, device)
        self.dtype = autocast_dtype(device, trained_precision(run_dir, cfg) if precision == "auto" else precision)
        self.data = run_data(run_dir, cfg, state)  # the run's own tokenization
        self._encode = native_encoder(self.data.tokenizer)
        self.scorer, self.device, self._digits = NativeScorer(model), device, None
        self.identity = dict(position=position_label(state["model_config"]), train_len=int(cfg.train.seq_len),
                             seed=int(cfg.seed))
        self.provenance = dict(run=repo_relative(run_dir), step=state.get("step"), weights=weights_digest(model),
                               data=cfg.data.name, commit=git_commit(), device=device_name(device, self.dtype))
        self.out_dir = Path(results_root) / str(cfg.name)
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


def open_native(run_dir: Path, results_root: Path, device: torch.device, precision: str = "auto") -> NativeSubject:
    """A run folder written by alibi_lm.train as a Subject, computing at `precision` (auto: the run's own)."""
    return NativeSubject(Path(run_dir), results_root, device, precision)
