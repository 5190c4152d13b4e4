"""What a probe sees of a model, whichever kind it is: a scorer, a text encoder, the token stream of a
split, the digits' ids, and the identity and provenance its rows carry.

A scorer has three methods (the trained runs' NativeScorer, hf.HFScorer, and the tests' hand-made ones):
    loss(idx (B, T), targets (B, T)) -> (B, T) per-token negative log-likelihood
    last_logprobs(idx (B, T), n) -> (B, n, V) log-probabilities of the next token at the last n positions
    check_positions(end) -> raises PositionRangeError when the model cannot see position end - 1
    max_positions (optional) -> the longest input it can read, None for any
"""

from __future__ import annotations

import contextlib
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError

# A Hugging Face model past a learned position table that hf.LEARNED_TABLES does not name (CPU only: on CUDA it
# is a device-side assert). Ours, and the tables it names, raise PositionRangeError in check_positions first.
NOT_APPLICABLE = (IndexError,)


class NativeScorer:
    """A trained TransformerLM (alibi_lm.model) as a scorer."""

    def __init__(self, model):
        self.model = model

    @property
    def max_positions(self) -> int | None:
        return self.model.position.max_positions  # a learned table's size; None: any length

    def check_positions(self, end: int) -> None:
        self.model.position.check_positions(end)

    def __call__(self, idx, targets):  # how scoring.score_stream calls a model
        return self.loss(idx, targets)

    def loss(self, idx, targets):
        return self.model(idx, targets=targets)  # (B, T)

    def last_logprobs(self, idx, n: int):
        h = self.model.hidden(idx)[:, -n:]  # (B, n, D): only the last n positions reach the output layer
        return self.model.vocab.logits(h).float().log_softmax(-1)  # (B, n, V)


@dataclass
class Subject:
    scorer: object
    encode: Callable[[str], list[int]]  # text in WikiText's tokenized form -> ids, no special tokens
    split_tokens: Callable[[str], np.ndarray]  # split name -> the split's ids (N,)
    digits: list[int]  # the id of "0" .. "9", one token each
    identity: dict  # position, train_len, seed: which model a row belongs to
    provenance: dict  # run, step, data, commit, device
    out_dir: Path  # results/<experiment>/
    device: torch.device
    completed: bool = True
    _tokens: dict = field(default_factory=dict)

    def tokens(self, split: str) -> np.ndarray:
        if split not in self._tokens:
            self._tokens[split] = np.asarray(self.split_tokens(split))
        return self._tokens[split]

    def autocast(self):
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    @property
    def name(self) -> str:
        seed = self.identity["seed"]
        return f"{self.identity['position']} L={self.identity['train_len']}" + ("" if seed is None else f" seed {seed}")


def command_line() -> str:
    """The probes command as typed (for the rows' provenance)."""
    return shlex.join(["python", "-m", "alibi_lm.probes", *sys.argv[1:]])


def digit_ids(encode, vocab_lookup=None) -> list[int]:
    """One token id per digit 0-9: encode(d) when it is a single token, else vocab_lookup(d)."""
    ids = []
    for d in "0123456789":
        found = encode(d)
        token = found[0] if len(found) == 1 else (vocab_lookup(d) if vocab_lookup else None)
        if token is None:
            raise UserError(f"the tokenizer has no single token for the digit {d} (it gives {found}); "
                            f"the passkey needs one token per digit")
        ids.append(int(token))
    return ids


def _device_name(device: torch.device) -> str:
    from ..provenance import cpu_description

    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu: {cpu_description()}"


def open_native(run_dir: Path, results_root: Path, device: torch.device) -> Subject:
    """A run folder written by alibi_lm.train, with its own data and tokenizer."""
    from .. import evaluate
    from ..checkpoint import read_status
    from ..provenance import git_commit

    model, cfg, state = evaluate.load_run(run_dir, device)
    data = evaluate.run_data(run_dir, cfg, state)  # the run's own tokenization, checked against its checkpoint
    tokenizer = data.tokenizer

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False).ids

    identity = dict(position=state["model_config"]["position"], train_len=int(cfg.train.seq_len), seed=int(cfg.seed))
    provenance = dict(run=str(run_dir), step=state.get("step"), data=cfg.data.name, commit=git_commit(),
                      device=_device_name(device))
    return Subject(NativeScorer(model), encode, data.split, digit_ids(encode, tokenizer.token_to_id), identity,
                   provenance, Path(results_root) / str(cfg.name), device,
                   completed=read_status(run_dir)["status"] == "completed")


def open_hf(job, device: torch.device) -> Subject:
    """run=hf:<folder> (job: a ProbesJob): a Hugging Face causal LM on the text of job.data (alibi_lm/hf.py)."""
    from .. import hf
    from ..provenance import git_commit

    out_dir = hf.results_dir(job)  # before the model loads: its name may be taken
    model = hf.load(job.run, device, job.hf.train_len)
    encode = hf.encoder(model.tokenizer)

    def lookup(token: str):
        found = model.tokenizer.convert_tokens_to_ids(token)
        return None if found is None or found == model.tokenizer.unk_token_id else found

    identity = dict(position=model.position, train_len=model.train_len, seed=None)
    provenance = dict(run=str(job.run), step=None, data=job.data.name, commit=git_commit(), device=_device_name(device))
    return Subject(model.scorer, encode, lambda split: hf.token_stream(model.tokenizer, job.data, split)[0],
                   digit_ids(encode, lookup), identity, provenance, out_dir, device)


def sweep_runs(runs_root: Path, experiment: str) -> list[Path]:
    """Every run folder under runs_root/<experiment>/, in a stable order."""
    from ..checkpoint import CHECKPOINT, is_run_dir

    folder = Path(runs_root) / experiment
    if not folder.is_dir():
        raise UserError(f"sweep={experiment}: {folder} does not exist; train the experiment first "
                        f"(make sweep EXPERIMENT={experiment}) or set paths.runs=...")
    runs = sorted(p.parent for p in folder.glob(f"**/{CHECKPOINT}") if is_run_dir(p.parent))
    if not runs:
        raise UserError(f"sweep={experiment}: no run folder (config.yaml + {CHECKPOINT}) under {folder}")
    return runs
