"""LM-Infinite (Han et al., NAACL 2024, arXiv 2308.16137): a Lambda-shaped mask and a distance cap.

Query i keeps the keys j < n_global (the "global branch") and those with d = i - j < n_local (the local branch);
every distance is capped at `limit`: d' = min(d, limit). The reference (Glaciohound/LM-Infinite) sets
local_branch = limit_distance = the pretraining length and global_branch = 10 (10-100 "similar effect"); for its
ALiBi model (MPT) a far global key gets ALiBi's bias at the limit, as a bias scheme does here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import ExtensionMethod, ExtensionOptions, affine, positive


@dataclass
class LMInfiniteOptions(ExtensionOptions):
    n_global: int = 10  # the first keys every query keeps (the reference's 10)
    n_local: int | None = None  # keys at d < n_local are kept; null: L
    limit: int | None = None  # every distance capped here; null: L

    def __post_init__(self):
        positive("n_global", self.n_global, 0)
        positive("n_local", self.n_local)
        positive("limit", self.limit)

    def resolve(self, train_len):
        return LMInfiniteOptions(self.n_global, self.n_local or train_len, self.limit or train_len)


class LMInfinite(ExtensionMethod):
    name = "lm_infinite"
    Options = LMInfiniteOptions
    hides_keys = True

    def remap(self, q_pos, k_pos):
        o = self.options
        d = q_pos[:, None] - k_pos[None, :]  # (tq, tk)
        visible = (d < o.n_local) | (k_pos < o.n_global)[None, :]
        capped = torch.full_like(q_pos, o.limit)  # the query at `limit`, the key at 0: d' = limit
        return affine([q_pos, capped], [k_pos, torch.zeros_like(k_pos)], (d >= o.limit).long(), visible)
