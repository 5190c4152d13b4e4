"""Copy (Kazemnejad et al. 2023; Jelassi et al. 2024), or reverse with task.reverse=true:

    <bos> s1 .. sn <sep> | s1 .. sn <eos> [<pad>]

The answer is the second string, n = (length - 2) // 2 symbols; <eos> ends the sequence and is not scored
(greedy decoding produces exactly n symbols), a <pad> fills an odd length. An absolute scheme can learn
"the symbol at p repeats the one at p - n - 1" only for the p it was trained at; copying past L needs
attention that finds the previous occurrence, or counts, at distances never seen.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from .base import Task, TaskOptions
from .registry import register


@dataclass
class CopyOptions(TaskOptions):
    alphabet: int = 16  # symbol types (per-token chance 1 / alphabet)
    reverse: bool = False  # the string backwards (Kazemnejad's "reverse")

    def __post_init__(self):
        if self.alphabet < 2:
            raise ConfigError(f"task.alphabet must be >= 2, got {self.alphabet}")


@register("copy")
class Copy(Task):
    Options = CopyOptions
    description = "repeat a random string after a separator (task.reverse: backwards)"
    greedy = True

    def __init__(self, options: CopyOptions | None = None):
        super().__init__(options)
        self.vocab += ["<sep>", "<eos>", *(f"s{i}" for i in range(self.options.alphabet))]
        self.symbol0 = self.vocab.index("s0")

    @property
    def min_length(self) -> int:
        return 4  # one symbol: <bos> s <sep> s <eos>

    def make(self, rng, batch: int, length: int):
        n = (length - 2) // 2
        s = self.symbol0 + rng.integers(0, self.options.alphabet, (batch, n))
        second = s[:, ::-1] if self.options.reverse else s
        sep, eos, bos, pad = self.ids("<sep>", "<eos>", "<bos>", "<pad>")
        parts = [np.full((batch, 1), bos), s, np.full((batch, 1), sep), second, np.full((batch, 1), eos)]
        parts += [np.full((batch, length + 1 - (2 * n + 3)), pad)]  # 0 or 1
        answer = np.zeros((batch, length), dtype=bool)
        answer[:, n + 1 : 2 * n + 1] = True  # targets n+1 .. 2n: the tokens after <sep>
        return np.concatenate(parts, axis=1), answer

    def sources(self, tokens, answer):
        """Answer t (n+1 .. 2n) copies symbol t - n of the string, or, reversed, symbol 2n + 1 - t."""
        n = (tokens.shape[1] - 3) // 2
        t = np.arange(n + 1, 2 * n + 1)  # (n,): the answer positions
        sources = np.full(answer.shape, -1, dtype=np.int64)
        sources[:, t] = 2 * n + 1 - t if self.options.reverse else t - n
        return sources

    def chance(self, length: int) -> tuple[float, float]:
        p = 1 / self.options.alphabet
        return p, p ** ((length - 2) // 2)
