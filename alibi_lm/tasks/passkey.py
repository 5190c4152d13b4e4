"""Passkey retrieval (Mohtashami & Jaggi 2023; RULER's multikey variant, Hsieh et al. 2024) as tokens:

    <bos> f f f <needle> K d1 .. dk f f ... f <query> K | d1 .. dk

A needle names a key K and its k digits at a depth of the filler (uniform, or task.depth); the query at the
end names K again and the digits are the answer. task.distractors adds needles with other keys, so the
query's key must be matched, not just any digits found. Filler tokens are random (a repeated block would
have a period an absolute scheme could latch onto); digits occur only in needles and in the answer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from .base import Task, TaskOptions, choose_without_replacement
from .registry import register

DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)  # the evaluation's depth grid (fractions of the filler before the needle)


@dataclass
class PasskeyOptions(TaskOptions):
    digits: int = 5  # k, the key's length (exact-match chance 10^-k)
    distractors: int = 0  # needles with other keys (RULER's multikey); 0: the original single needle
    filler: int = 32  # filler token types
    keys: int = 16  # key-name token types (> distractors)
    depth: float | None = None  # the target needle's depth in the filler, 0 (first) .. 1 (last); None: uniform

    def __post_init__(self):
        for key in ("digits", "filler", "keys"):
            if not getattr(self, key) >= 1:
                raise ConfigError(f"task.{key} must be >= 1, got {getattr(self, key)}")
        self.check_token_types("filler")
        if not 0 <= self.distractors < self.keys:
            raise ConfigError(f"task.distractors must be in [0, task.keys={self.keys}), got {self.distractors}")
        if self.depth is not None and not 0 <= self.depth <= 1:
            raise ConfigError(f"task.depth must be in [0, 1] (or null: uniform), got {self.depth}")


@register("passkey")
class Passkey(Task):
    Options = PasskeyOptions
    description = "retrieve a k-digit key stated once at a random depth of random filler (distractors: other keys)"
    greedy = True

    def __init__(self, options: PasskeyOptions | None = None):
        super().__init__(options)
        o = self.options
        self.vocab += ["<needle>", "<query>", *map(str, range(10)), *(f"f{i}" for i in range(o.filler)),
                       *(f"k{i}" for i in range(o.keys))]
        self.needle, self.query, self.digit0 = self.ids("<needle>", "<query>", "0")
        self.filler0, self.key0 = self.vocab.index("f0"), self.vocab.index("k0")

    @property
    def needle_len(self) -> int:
        return self.options.digits + 2  # <needle> K d1 .. dk

    @property
    def min_length(self) -> int:
        return (1 + self.options.distractors) * self.needle_len + self.options.digits + 2

    def make(self, rng, batch: int, length: int):
        o, n_needles, width = self.options, 1 + self.options.distractors, self.needle_len
        n_filler = length - self.min_length  # filler tokens between <bos> and <query>
        body = self.filler0 + rng.integers(0, o.filler, (batch, n_filler + n_needles * width))
        keys = self.key0 + choose_without_replacement(rng, batch, o.keys, n_needles)  # (B, N), column 0: the target
        digits = self.digit0 + rng.integers(0, 10, (batch, n_needles, o.digits))  # (B, N, k)
        # insertion points among the filler, 0 .. n_filler; the target's from task.depth when it is set
        gaps = rng.integers(0, n_filler + 1, (batch, n_needles))
        if o.depth is not None:
            gaps[:, 0] = round(o.depth * n_filler)
        order = np.argsort(gaps, axis=1, kind="stable")  # needles in the order they appear
        rank = np.argsort(order, axis=1)  # each needle's place in that order
        start = np.take_along_axis(gaps, order, 1)[np.arange(batch)[:, None], rank] + rank * width  # (B, N)
        needles = np.concatenate([np.full((batch, n_needles, 1), self.needle), keys[..., None], digits], axis=2)
        rows = np.arange(batch)[:, None, None]
        body[rows, start[..., None] + np.arange(width)] = needles  # (B, N, width) written in place
        query = np.concatenate([np.full((batch, 1), self.query), keys[:, :1], digits[:, 0]], axis=1)  # (B, k + 2)
        tokens = np.concatenate([np.full((batch, 1), self.vocab.index("<bos>")), body, query], axis=1)
        answer = np.zeros((batch, length), dtype=bool)
        answer[:, length - o.digits :] = True  # the targets d1 .. dk of the query
        return tokens, answer

    def sources(self, tokens, answer):
        """Digit j of the answer copies digit j of the needle that names the query's key (keys are distinct)."""
        k, length = self.options.digits, tokens.shape[1] - 1
        key = tokens[:, length - k]  # (B,): the query's K, just before the answer digits
        named = (tokens[:, :-1] == self.needle) & (tokens[:, 1:] == key[:, None])  # (B, length): <needle> K
        sources = np.full(answer.shape, -1, dtype=np.int64)
        sources[:, length - k :] = named.argmax(1)[:, None] + 2 + np.arange(k)  # <needle> K d1 .. dk
        return sources

    def chance(self, length: int) -> tuple[float, float]:
        return 0.1, 0.1**self.options.digits

    def variants(self) -> list[tuple[str, dict]]:
        return [(f"depth={d:.2f}", {"options": dataclasses.replace(self.options, depth=d)}) for d in DEPTHS]
