"""The interface of a synthetic task: a vocabulary, a generator of batches with their answer positions, a
chance level. Length generalization is measured by training at lengths up to L and scoring at Lv > L.

A batch of `length` is tokens (B, length + 1): the model reads tokens[:, :-1] (`length` positions) and
predicts tokens[:, 1:]; answer (B, length) marks the targets that are scored (and trained on). Every batch is
a pure function of (seed, split, index, length): generated on the fly, vectorised, the same on every machine
and after a resume. One length per batch (as Ruoss et al. 2023 sample): pad tokens, where a task needs them,
go at the end and are never answers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..errors import ConfigError

SPLITS = {"train": 0, "valid": 1, "test": 2}  # disjoint random streams: no test batch is a training batch
PAD, BOS = "<pad>", "<bos>"


@dataclass
class TaskOptions:
    """A task with options subclasses this as a dataclass in its own module (the task.* keys), with one-line
    ConfigErrors in __post_init__ for a value bad on its own and in check() for one that does not fit L."""

    def check_token_types(self, *keys: str) -> None:
        """The task.* keys that count token types of one kind, each at most MAX_TOKEN_TYPES: a larger one builds a
        vocabulary and an embedding that fill the memory (task.filler=100000000 was killed for it)."""
        for key in keys:
            if getattr(self, key) > MAX_TOKEN_TYPES:
                raise ConfigError(f"task.{key} must be <= {MAX_TOKEN_TYPES:,} (token types of one kind; more would "
                                  f"not fit in memory as a vocabulary), got {getattr(self, key)}")

    def check(self, seq_len: int, min_len: int) -> None:
        """Raise ConfigError when the task cannot make sequences of lengths min_len .. seq_len."""


MAX_TOKEN_TYPES = 65_536  # far above what any task here needs (tens), far below a vocabulary that fills the memory


@dataclass
class Batch:
    tokens: torch.Tensor  # (B, T + 1) int64
    answer: torch.Tensor  # (B, T) bool: the targets tokens[:, 1:] that are scored

    @property
    def inputs(self) -> torch.Tensor:
        return self.tokens[:, :-1]  # (B, T)

    @property
    def targets(self) -> torch.Tensor:
        return self.tokens[:, 1:]  # (B, T)


def batch_rng(seed: int, split: str, index: int, length: int) -> np.random.Generator:
    """The generator of one batch: a SeedSequence of integers (never Python's salted hash())."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), SPLITS[split], int(index), int(length)]))


class Task:
    """One synthetic task. A subclass sets `description` (one line), builds `vocab` (token names; ids are
    their indices, PAD first, BOS second) in __init__, and implements make(); `greedy` says whether
    every sequence's answers form one span at the same place (evaluation then also decodes it greedily),
    `min_length` is the shortest length make() accepts."""

    Options: type[TaskOptions] = TaskOptions
    name: str = ""
    description: str = ""
    greedy: bool = False  # answers form one span at the end of every sequence: evaluation scores greedy decoding too
    synthetic: bool = True  # generated batches; lm (language modelling) reads its data set instead
    # whether the number of answers grows with the length (flip-flop's reads): exact match per sequence then falls
    # with the count alone, so the suite's tables past L use answer-token accuracy (each answer a trial)
    answers_grow: bool = False

    def __init__(self, options: TaskOptions | None = None):
        self.options = self.Options() if options is None else options
        self.vocab: list[str] = [PAD, BOS]

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def ids(self, *names: str) -> list[int]:
        return [self.vocab.index(n) for n in names]

    @property
    def min_length(self) -> int:
        raise NotImplementedError

    def make(self, rng: np.random.Generator, batch: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens (B, length + 1) ints, answer (B, length) bool) from rng; vectorised over the batch."""
        raise NotImplementedError

    def chance(self, length: int) -> tuple[float, float]:
        """(per answer token, per sequence): the accuracy of guessing uniformly among the answer's values."""
        raise NotImplementedError

    def sources(self, tokens: np.ndarray, answer: np.ndarray) -> np.ndarray | None:
        """(B, T) ints: for each answer position of make()'s (tokens, answer), the input index of the earlier token
        that its answer copies (the needle's digit, the value paired with the queried key, the last written bit), -1
        elsewhere; a task whose answers copy no single token does not override this. What retrieval.py measures attention
        to."""
        return None

    def for_training(self) -> Task:
        """The task whose batches training draws: itself, or (MQAR's task.min_pairs) a mixture of easier settings;
        validation and evaluation always use the task itself."""
        return self

    def variants(self) -> list[tuple[str, dict]]:
        """Extra evaluation settings (label, {attribute: value} set on a copy of the task), e.g. the passkey's
        depths; the task as trained is always scored too, as variant ''."""
        return []

    def batch(self, seed: int, split: str, index: int, size: int, length: int) -> Batch:
        """The batch `index` of `split`: `size` sequences of `length` positions."""
        if length < self.min_length:
            raise ConfigError(f"task {self.name} needs sequences of at least {self.min_length} positions, got {length}")
        tokens, answer = self.make(batch_rng(seed, split, index, length), size, length)
        return Batch(torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64)), torch.from_numpy(answer))


def choose_without_replacement(rng: np.random.Generator, batch: int, n: int, k: int) -> np.ndarray:
    """(batch, k) distinct integers of [0, n) per row, vectorised: the first k of a random permutation."""
    return np.argsort(rng.random((batch, n)), axis=1)[:, :k]


def random_positions(rng: np.random.Generator, n: int, max_position: int) -> np.ndarray:
    """Randomized positions (Ruoss et al. 2023): n distinct integers of [0, max_position), sorted: the positions
    of tokens 0 .. n-1 (order kept, gaps random)."""
    if n > max_position:
        raise ConfigError(f"train.max_position={max_position} is smaller than a sequence of {n} positions; "
                          f"set train.max_position >= the longest evaluation length")
    return np.sort(rng.choice(max_position, size=n, replace=False))
