"""What evaluation (alibi_lm/eval/) and the probes (alibi_lm/probes/) see of a model under test, whichever kind it
is: the Subject protocol (a scorer, a text encoder, the token stream of a split, the digits' ids, and the identity
and provenance its rows carry) and the Scorer protocol. native.py is a trained run folder as one, hf.py a Hugging
Face causal LM; tests hand in subjects of their own."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from ..errors import UserError
from ..positions import PositionRangeError

# A cell is "not applicable" on check_positions' PositionRangeError, or on the IndexError of a Hugging Face model
# past a learned position table that hf.LEARNED_TABLES does not name (CPU only: on CUDA a device-side assert).
NOT_APPLICABLE = (PositionRangeError, IndexError)
DIGITS = "0123456789"



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
    note: str = ""  # what every row of it must say (a failed run scored on purpose: subjects.native.ALLOW_FAILED)

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
