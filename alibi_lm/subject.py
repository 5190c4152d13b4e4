"""The model under test, whichever kind it is: a run folder written by alibi_lm.train or a Hugging Face
causal LM (run=hf:<folder>, alibi_lm/hf.py). Evaluation (alibi_lm/evaluate.py) and the probes
(alibi_lm/probes/) see only a Subject: a scorer, a text encoder, the token stream of a split, the
digits' ids, and the identity and provenance its rows carry.

A scorer has these methods (the trained runs' NativeScorer, hf.HFScorer, and the tests' hand-made ones):
    loss(idx (B, T), targets (B, T)) -> (B, T) per-token negative log-likelihood (also its __call__, as
        scoring.score_stream calls a model)
    last_logprobs(idx (B, T), n) -> (B, n, V) log-probabilities of the next token at the last n positions
    check_positions(end) -> raises PositionRangeError when the model cannot see position end - 1
    max_positions (optional) -> the longest input it can read, None for any
    set_scaling(method, factor, train_len) -> the inference-time extension (evaluate.rope_scaling; called only when
        one is asked for): rope's, or a ValueError (every other scheme, a Hugging Face model)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from . import hf
from .checkpoint import CHECKPOINT, is_run_dir, load_checkpoint, read_status
from .config import check_writable, resolve_device
from .data import UNK, TokenData, load_tokenizer, prepare_data, split_checksum
from .errors import UserError
from .model import LMConfig, TransformerLM
from .positions import PositionRangeError
from .provenance import device_name, git_commit, repo_relative, weights_digest

# A cell is "not applicable" on check_positions' PositionRangeError, or on the IndexError of a Hugging Face model
# past a learned position table that hf.LEARNED_TABLES does not name (CPU only: on CUDA a device-side assert).
NOT_APPLICABLE = (PositionRangeError, IndexError)
DIGITS = "0123456789"


def check_job(job, output_dir=None) -> None:
    """The preflight of a job that opens a Subject (an EvalJob, a ProbesJob): the device, the run folder (or
    run=hf:'s model and data) and the results folder."""
    resolve_device(job.device)
    if hf.is_hf(job.run):
        hf.check(job)
    elif job.run:
        check_run_dir(Path(job.run))
    check_writable(job.paths.results, "paths.results")


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


class NativeScorer:
    """A trained TransformerLM (alibi_lm.model) as a scorer."""

    def __init__(self, model):
        self.model = model
        self.max_positions = model.position.max_positions  # a learned table's size; None: any length
        self.check_positions = model.position.check_positions
        self.set_scaling = model.position.set_scaling

    def loss(self, idx, targets):
        return self.model(idx, targets=targets)  # (B, T)

    __call__ = loss  # how scoring.score_stream calls a model

    def last_logprobs(self, idx, n: int):
        h = self.model.hidden(idx)[:, -n:]  # (B, n, D): only the last n positions reach the output layer
        return self.model.vocab.logits(h).float().log_softmax(-1)  # (B, n, V)


@dataclass
class Subject:
    scorer: object
    encode: Callable[[str], list[int]]  # text in WikiText's tokenized form, as running text -> ids, no special tokens
    split_tokens: Callable[[str], np.ndarray]  # split name -> the split's ids (N,), kept by its source (memmap, cache)
    split_sha: Callable[[str], str]  # split name -> its text's sha256, 16 hex digits (the rows' data_sha)
    digits: list[int] | Callable[[], list[int]]  # the id of "0" .. "9", one token each, or what gives them
    identity: dict  # position, train_len, seed: which model a row belongs to
    provenance: dict  # run, step, weights (provenance.weights_digest: rows are done for these only), data, commit, device
    out_dir: Path  # results/<experiment>/
    device: torch.device
    completed: bool = True
    word_count: Callable[[str], int] | None = None  # hf only: split -> WikiText's word-level token count (hf.py)

    def digit_ids(self) -> list[int]:
        """The ids of "0" .. "9", found (and checked) when the passkey probe first asks, so that a vocabulary
        without them still runs the context probe."""
        if callable(self.digits):
            self.digits = self.digits()
        return list(self.digits)

    def tokens(self, split: str) -> np.ndarray:
        return np.asarray(self.split_tokens(split))

    def autocast(self):  # bfloat16 on CUDA, as score_stream
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda")

    @property
    def name(self) -> str:
        seed = self.identity["seed"]
        return f"{self.identity['position']} L={self.identity['train_len']}" + ("" if seed is None else f" seed {seed}")


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


def open_native(run_dir: Path, results_root: Path, device: torch.device) -> Subject:
    """A run folder written by alibi_lm.train, with its own data and tokenizer."""
    model, cfg, state = load_run(run_dir, device)
    data = run_data(run_dir, cfg, state)  # the run's own tokenization, checked against its checkpoint
    tokenizer = data.tokenizer
    encode = native_encoder(tokenizer)
    digits = lambda: digit_ids(encode, tokenizer.token_to_id, tokenizer.token_to_id(UNK))  # noqa: E731 (BPE: no <unk>)
    identity = dict(position=state["model_config"]["position"], train_len=int(cfg.train.seq_len), seed=int(cfg.seed))
    provenance = dict(run=repo_relative(run_dir), step=state.get("step"), weights=weights_digest(model),
                      data=cfg.data.name, commit=git_commit(), device=device_name(device))
    split_sha = lambda split: data.meta["data"][split][:16]  # noqa: E731 (the cache entry's key: no second read)
    return Subject(NativeScorer(model), encode, data.split, split_sha, digits, identity,
                   provenance, Path(results_root) / str(cfg.name), device,
                   completed=read_status(run_dir)["status"] == "completed")


def open_hf(job, device: torch.device) -> Subject:
    """run=hf:<folder> (job: an EvalJob or a ProbesJob): a Hugging Face causal LM on the text of job.data (alibi_lm/hf.py)."""
    out_dir = hf.results_dir(job)  # before the model loads: its name may be taken
    model = hf.load(job.run, device, job.hf.train_len)
    encode = hf.encoder(model.tokenizer)

    def lookup(token: str):
        found = model.tokenizer.convert_tokens_to_ids(token)
        return None if found is None or found == model.tokenizer.unk_token_id else found

    stream = cache(partial(hf.token_stream, model.tokenizer, job.data))  # split -> (ids (N,), word count)
    identity = dict(position=model.position, train_len=model.train_len, seed=None)
    provenance = dict(run=str(job.run), step=None, weights=weights_digest(model.scorer.model), data=job.data.name,
                      commit=git_commit(), device=device_name(device))
    return Subject(model.scorer, encode, lambda split: stream(split)[0], lambda split: split_checksum(job.data, split)[:16],
                   partial(digit_ids, encode, lookup, model.tokenizer.unk_token_id), identity, provenance, out_dir, device,
                   word_count=lambda split: stream(split)[1])
