"""Dual Chunk Attention (An et al., ICML 2024, arXiv 2402.17463; HKUNLP/ChunkLlama chunkllama_attn_replace.py).

With chunk size C and local window w, keys sit at j mod c, c = C - w, and a query at i in chunk floor(i / c) takes

    intra-chunk       (same chunk)                  i mod c                 -> d' = i - j
    successive-chunk  (the chunk just before)       min(i mod c + c, C)
    inter-chunk       (every earlier chunk)         min(2c - 1, C)          (the reference's position c - 1 there)

so every d' stays at most C. Three rotary passes, merged by the chunk a key is in (the reference merges three
flash-attention outputs by log-sum-exp; taking each pair's score from its pass is the same softmax). Defaults:
the reference's C = 3L/4 and w = L/16 of replace_with_chunkllama(pretraining_length=L).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ConfigError
from .base import ExtensionMethod, ExtensionOptions, affine, positive


@dataclass
class DualChunkOptions(ExtensionOptions):
    chunk: int | None = None  # C; null: 3L/4
    local: int | None = None  # w, the local window; null: L/16

    def __post_init__(self):
        positive("chunk", self.chunk, 2)
        positive("local", self.local, 0)

    def resolve(self, train_len):
        chunk = self.chunk or max(2, train_len * 3 // 4)
        local = self.local if self.local is not None else train_len // 16
        if not chunk - local >= 1:
            raise ConfigError(f"extension.chunk ({chunk}) must exceed extension.local ({local}): chunks of "
                              f"chunk - local tokens")
        return DualChunkOptions(chunk, local)


class DualChunk(ExtensionMethod):
    name = "dca"
    Options = DualChunkOptions

    def remap(self, q_pos, k_pos):
        C = self.options.chunk
        c = C - self.options.local  # tokens per chunk
        chunk_gap = (torch.div(q_pos, c, rounding_mode="floor")[:, None]
                     - torch.div(k_pos, c, rounding_mode="floor")[None, :])  # (tq, tk)
        intra = q_pos % c  # (tq,)
        successive = (intra + c).clamp(max=C)
        inter = torch.full_like(q_pos, min(2 * c - 1, C))
        k_at = k_pos % c
        return affine([intra, successive, inter], [k_at, k_at, k_at], chunk_gap.clamp(0, 2), None)
