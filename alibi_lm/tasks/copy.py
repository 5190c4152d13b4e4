"""Copy a short string of distinct symbols across filler (distinct as in Zhou et al. 2024's "unique copy": no repeated
symbol, so no repeated n-gram; unlike theirs, whose string grows past the trained lengths, the string is fixed and
the filler grows: this project's own setup; with task.reverse=true, backwards as Kazemnejad et al. 2023's reverse):

    <bos> s1 .. sn f f .. f <sep> | s1 .. sn <eos>

n = task.symbols distinct symbols (drawn without replacement from task.alphabet types) open the sequence; filler
(its own token types) fills the rest up to the sequence length, then <sep> asks for the string, which is the
answer. <eos> ends it and is not scored (greedy decoding produces exactly n symbols). The string's length stays
put and the filler grows with the sequence, so a longer sequence moves the string further from where it is copied
(from about L to about 16L positions back), as the passkey moves its needle; the copy itself is an induction chain
(each symbol is the one that followed the previous one in the string), unambiguous because no symbol repeats.
With repeated symbols (task.unique=false: Kazemnejad's random strings) a model that copies by "find the previous
occurrence" meets ambiguity that has nothing to do with length.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from .base import Task, TaskOptions, choose_without_replacement
from .registry import register


@dataclass
class CopyOptions(TaskOptions):
    symbols: int = 16  # n, the string's length (the same at every sequence length)
    alphabet: int = 32  # symbol types (per-token chance about 1 / alphabet)
    unique: bool = True  # no symbol repeats within a string (Zhou et al.'s unique copy); false: drawn with repeats
    filler: int = 16  # filler token types (disjoint from the symbols)
    reverse: bool = False  # the string backwards (Kazemnejad's "reverse")

    def __post_init__(self):
        for key in ("symbols", "filler"):
            if getattr(self, key) < 1:
                raise ConfigError(f"task.{key} must be >= 1, got {getattr(self, key)}")
        self.check_token_types("alphabet", "filler")
        if self.alphabet < 2:
            raise ConfigError(f"task.alphabet must be >= 2, got {self.alphabet}")
        if self.unique and self.symbols > self.alphabet:
            raise ConfigError(f"task.symbols={self.symbols} distinct symbols need task.alphabet >= {self.symbols}, "
                              f"got {self.alphabet}; raise task.alphabet or set task.unique=false")


@register("copy")
class Copy(Task):
    Options = CopyOptions
    description = "repeat a string of distinct symbols stated at the start, asked for after filler (task.reverse: backwards)"
    greedy = True

    def __init__(self, options: CopyOptions | None = None):
        super().__init__(options)
        o = self.options
        self.vocab += ["<sep>", "<eos>", *(f"s{i}" for i in range(o.alphabet)), *(f"f{i}" for i in range(o.filler))]
        self.symbol0, self.filler0 = self.vocab.index("s0"), self.vocab.index("f0")

    @property
    def min_length(self) -> int:
        return 2 * self.options.symbols + 2  # <bos> s1..sn <sep> s1..sn <eos>: no filler

    def make(self, rng, batch: int, length: int):
        n, o = self.options.symbols, self.options
        if o.unique:
            s = self.symbol0 + choose_without_replacement(rng, batch, o.alphabet, n)  # (B, n) distinct per row
        else:
            s = self.symbol0 + rng.integers(0, o.alphabet, (batch, n))  # (B, n)
        second = s[:, ::-1] if o.reverse else s
        gap = length - (2 * n + 2)  # the filler: (length + 1) tokens in all
        filler = self.filler0 + rng.integers(0, o.filler, (batch, gap))  # (B, gap)
        sep, eos, bos = self.ids("<sep>", "<eos>", "<bos>")
        parts = [np.full((batch, 1), bos), s, filler, np.full((batch, 1), sep), second, np.full((batch, 1), eos)]
        answer = np.zeros((batch, length), dtype=bool)
        answer[:, length - n - 1 : length - 1] = True  # targets: the n tokens after <sep> (the last target is <eos>)
        return np.concatenate(parts, axis=1), answer

    def sources(self, tokens, answer):
        """Answer target t (the copy's i-th symbol, i = t - (T - n - 1)) copies input n - i (reversed) or i + 1."""
        n, length = self.options.symbols, tokens.shape[1] - 1
        i = np.arange(n)  # (n,)
        sources = np.full(answer.shape, -1, dtype=np.int64)
        sources[:, length - n - 1 + i] = n - i if self.options.reverse else 1 + i
        return sources

    def chance(self, length: int) -> tuple[float, float]:
        """Guessing uniformly among the symbols not yet used (unique) or all of them, symbol by symbol."""
        a, n = self.options.alphabet, self.options.symbols
        if not self.options.unique:
            return 1 / a, (1 / a) ** n
        per_symbol = [1 / (a - i) for i in range(n)]
        return float(np.mean(per_symbol)), float(np.prod(per_symbol))
