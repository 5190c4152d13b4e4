"""StreamingLLM (Xiao et al., ICLR 2024, arXiv 2309.17453): the first `sinks` tokens plus a window of recent keys.

The published protocol (mit-han-lab/streaming-llm, examples/eval_long_ppl.py with StartRecentKVCache(start_size,
recent_size)) scores token by token: after each token the KV cache keeps its first `sinks` keys and its last
`window` ones, and every cached key is rotated at its slot in the cache, the query at the slot after them
("pos-shift"; ALiBi's bias, MPT's, is computed over slots already). Token i then sees, once i > sinks + window,
the sinks j < sinks and the keys i - window .. i, at slot distances

    d' = i - j                      for the recent keys (i - j <= window)
    d' = min(i, sinks + window) - j for the sinks (before the cache fills, min(i, .) = i: every key, at d)

which is what this module gives for a whole window at once (tests/test_extension.py checks it against a token-by-
token run of the cache). Default window: L - sinks - 1, so that no distance exceeds L - 1, the longest trained.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import ExtensionMethod, ExtensionOptions, affine, positive


@dataclass
class StreamingOptions(ExtensionOptions):
    sinks: int = 4  # start_size: the first tokens every query keeps (the reference's 4)
    window: int | None = None  # recent_size: keys kept besides the query itself; null: L - sinks - 1

    def __post_init__(self):
        positive("sinks", self.sinks, 0)
        positive("window", self.window)

    def resolve(self, train_len):
        window = self.window if self.window is not None else max(1, train_len - self.sinks - 1)
        return StreamingOptions(self.sinks, window)


class Streaming(ExtensionMethod):
    name = "streaming"
    Options = StreamingOptions
    hides_keys = True

    def remap(self, q_pos, k_pos):
        sinks, window = self.options.sinks, self.options.window
        d = q_pos[:, None] - k_pos[None, :]  # (tq, tk)
        recent = d <= window
        visible = recent | (k_pos < sinks)[None, :]
        query_slot = q_pos.clamp(max=sinks + window)  # the query's slot once the cache is full
        return affine([q_pos, query_slot], [k_pos, k_pos], (~recent).long(), visible)
