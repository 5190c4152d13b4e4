"""Multi-query associative recall (Arora et al. 2023, Zoology), with the queries at the end:

    <bos> k1 v1 k2 v2 .. kK vK f f .. f q1 a1 q2 a2 .. qK aK

K key-value pairs open the sequence; each key is queried once, in a random order, in the last 2K positions,
and the answer a is the value it was paired with. Zoology puts its queries right after the pairs (most
query slots are drawn near them), so a longer sequence only adds filler after the last query and the
key-query distance stays put; here the distance grows with the length, which is what tests positions.
Keys, values and filler come from disjoint id ranges (Zoology's whole-vocabulary filler can repeat a key).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from .base import Task, TaskOptions, choose_without_replacement
from .registry import register


@dataclass
class MqarOptions(TaskOptions):
    pairs: int = 4  # K key-value pairs per sequence, each queried once (Zoology's T = 64 uses 4; with 8, many
    # schemes stay on the associative-recall plateau for 4,000 steps: results/tasks-probe/README.md)
    keys: int = 64  # key token types (>= pairs)
    values: int = 64  # value token types (>= pairs; per-token chance 1/values)
    filler: int = 16  # filler token types
    min_pairs: int | None = None  # training draws K per batch uniformly from min_pairs .. pairs (a mixture of
    # easier and full settings, as Zoology trains on several (T, K) at once); evaluation always asks `pairs`

    def __post_init__(self):
        for key in ("keys", "values"):
            if getattr(self, key) < 1:
                raise ConfigError(f"task.{key} must be >= 1, got {getattr(self, key)}")
        self.check_token_types("keys", "values", "filler")
        if not 1 <= self.pairs <= min(self.keys, self.values):
            raise ConfigError(f"task.pairs must be in [1, min(task.keys, task.values)], got {self.pairs}")
        if self.min_pairs is not None and not 1 <= self.min_pairs <= self.pairs:
            raise ConfigError(f"task.min_pairs must be in [1, task.pairs={self.pairs}] (or null: always task.pairs), "
                              f"got {self.min_pairs}")
        if self.filler < 1:
            raise ConfigError(f"task.filler must be >= 1, got {self.filler}")


@register("mqar")
class Mqar(Task):
    Options = MqarOptions
    description = "recall the values of K keys, each queried once at the end, far from where it was paired"
    mixed = False  # draw K per batch (for_training), not the fixed task.pairs

    def __init__(self, options: MqarOptions | None = None):
        super().__init__(options)
        o = self.options
        self.vocab += [*(f"k{i}" for i in range(o.keys)), *(f"v{i}" for i in range(o.values)),
                       *(f"f{i}" for i in range(o.filler))]
        self.key0, self.value0, self.filler0 = (self.vocab.index(t) for t in ("k0", "v0", "f0"))

    @property
    def min_length(self) -> int:
        return 4 * self.options.pairs  # the pairs and the queries, no filler

    def for_training(self) -> Mqar:
        """With task.min_pairs: a copy whose batches each hold K ~ U{min_pairs .. pairs} pairs (the same K for a
        whole batch, the first draw of the batch's generator)."""
        if self.options.min_pairs is None:
            return self
        mixed = Mqar(self.options)
        mixed.mixed = True
        return mixed

    def make(self, rng, batch: int, length: int):
        K = int(rng.integers(self.options.min_pairs, self.options.pairs + 1)) if self.mixed else self.options.pairs
        rows = np.arange(batch)[:, None]
        keys = self.key0 + choose_without_replacement(rng, batch, self.options.keys, K)  # (B, K)
        values = self.value0 + choose_without_replacement(rng, batch, self.options.values, K)  # (B, K)
        pairs = np.stack([keys, values], axis=2).reshape(batch, 2 * K)  # k1 v1 k2 v2 ...
        asked = np.argsort(rng.random((batch, K)), axis=1)  # a random order of the K pairs
        queries = np.stack([keys[rows, asked], values[rows, asked]], axis=2).reshape(batch, 2 * K)
        filler = self.filler0 + rng.integers(0, self.options.filler, (batch, length - 4 * K))
        tokens = np.concatenate([np.full((batch, 1), self.vocab.index("<bos>")), pairs, filler, queries], axis=1)
        answer = np.zeros((batch, length), dtype=bool)
        answer[:, length - 2 * K + 1 :: 2] = True  # the targets a1 .. aK: each predicted at its query
        return tokens, answer

    def sources(self, tokens, answer):
        """The answer to a query copies the value right after the same key among the pairs (k1 v1 k2 v2 ..)."""
        K, length = self.options.pairs, tokens.shape[1] - 1
        asked_at = np.arange(length - 2 * K + 1, length, 2)  # (K,): the query keys' positions, the answers'
        paired = tokens[:, 1 : 2 * K : 2]  # (B, K): the keys k1 .. kK
        match = tokens[:, asked_at][:, :, None] == paired[:, None, :]  # (B, K queries, K pairs)
        sources = np.full(answer.shape, -1, dtype=np.int64)
        sources[:, asked_at] = 2 + 2 * match.argmax(2)  # the value's index: 2 for v1, 4 for v2, ...
        return sources

    def chance(self, length: int) -> tuple[float, float]:
        p = 1 / self.options.values
        return p, p**self.options.pairs
