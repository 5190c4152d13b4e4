"""Flip-flop language (Liu et al. 2023): instruction-bit pairs

    <bos> w 1 i 0 r 1 i 1 w 0 r 0 ...

w writes its bit, i ignores it, r must be followed by the most recently written bit: the answers. The first
instruction writes, so every read is defined. Each instruction ignores with probability task.p_ignore (the
paper's FFL(0.8)) and writes or reads otherwise. The write-read gap is geometric and does not grow with the
length, so this tests holding one bit across unseen positions and resisting distraction, where recency helps:
published results rank schemes differently here than on retrieval.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from .base import Task, TaskOptions
from .registry import register


@dataclass
class FlipFlopOptions(TaskOptions):
    p_ignore: float = 0.8  # FFL(p): probability of an ignore instruction

    def __post_init__(self):
        if not 0 <= self.p_ignore < 1:
            raise ConfigError(f"task.p_ignore must be in [0, 1), got {self.p_ignore}")


@register("flipflop")
class FlipFlop(Task):
    Options = FlipFlopOptions
    description = "after each read instruction, the bit of the last write (FFL(0.8)): memory across a gap"
    answers_grow = True  # a read in every ~10 instructions: 3 at L = 64, 51 at 16L

    def __init__(self, options: FlipFlopOptions | None = None):
        super().__init__(options)
        self.vocab += ["w", "r", "i", "0", "1"]
        self.w, self.r, self.i, self.zero = self.ids("w", "r", "i", "0")

    @property
    def min_length(self) -> int:
        return 4  # <bos> w b r b

    def make(self, rng, batch: int, length: int):
        n_pairs = length // 2  # tokens: <bos> + 2 n_pairs, + <pad> when length is odd
        p_rw = (1 - self.options.p_ignore) / 2
        instr = rng.choice([self.w, self.r, self.i], size=(batch, n_pairs), p=[p_rw, p_rw, self.options.p_ignore])
        instr[:, 0] = self.w
        bits = rng.integers(0, 2, (batch, n_pairs))
        # the bit of each pair's most recent write (the pair's own when it writes): forward-fill write indices
        last_write = np.maximum.accumulate(np.where(instr == self.w, np.arange(n_pairs), 0), axis=1)
        reads = instr == self.r
        bits = np.where(reads, np.take_along_axis(bits, last_write, 1), bits)
        pairs = np.stack([instr, self.zero + bits], axis=2).reshape(batch, 2 * n_pairs)
        pad = np.full((batch, length + 1 - (1 + 2 * n_pairs)), self.vocab.index("<pad>"))
        tokens = np.concatenate([np.full((batch, 1), self.vocab.index("<bos>")), pairs, pad], axis=1)
        answer = np.zeros((batch, length), dtype=bool)
        answer[:, 1 : 2 * n_pairs : 2] = reads  # target 2j + 1 is pair j's bit
        return tokens, answer

    def sources(self, tokens, answer):
        """A read's answer copies the bit of the most recent write: pair j sits at tokens 1 + 2j (instruction) and
        2 + 2j (bit)."""
        n_pairs = (tokens.shape[1] - 1) // 2
        instr = tokens[:, 1 : 1 + 2 * n_pairs : 2]  # (B, n_pairs)
        last_write = np.maximum.accumulate(np.where(instr == self.w, np.arange(n_pairs), 0), axis=1)  # (B, n_pairs)
        sources = np.full(answer.shape, -1, dtype=np.int64)
        reads = answer[:, 1 : 2 * n_pairs : 2]  # (B, n_pairs): pair j's bit is answered at target 2j + 1
        sources[:, 1 : 2 * n_pairs : 2] = np.where(reads, 2 + 2 * last_write, -1)
        return sources

    def chance(self, length: int) -> tuple[float, float]:
        """Per bit 1/2; per sequence E[2^-R | R >= 1] for R ~ Binomial(pairs - 1, P(read))."""
        n, q = length // 2 - 1, (1 - self.options.p_ignore) / 2
        none = (1 - q) ** n
        return 0.5, ((1 - q / 2) ** n - none) / (1 - none) if none < 1 else 0.0
