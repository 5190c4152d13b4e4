"""Attention sinks: how much attention each layer and head puts on the first tokens of a window (Xiao et al., ICLR
2024, who found that most heads of a trained LM send a large share of their attention to the first tokens whatever
they hold). Measured per scheme, so that one can see where sinks emerge and whether an extension keeps them."""

from __future__ import annotations

import numpy as np
import torch


@torch.no_grad()
def first_token_mass(model, tokens: np.ndarray, eval_len: int, n_first: int = 4, windows: int = 4,
                     device="cpu") -> np.ndarray:
    """(n_layer, H) mean attention probability on keys 0..n_first-1, over the queries at positions >= n_first of the
    first `windows` consecutive windows of eval_len tokens (the explicit attention path's probabilities)."""
    n = min(windows, (len(tokens) - 1) // eval_len)
    if n < 1 or eval_len <= n_first:
        raise ValueError(f"need a window of more than n_first={n_first} tokens and at least one window of {eval_len} "
                         f"tokens, got {len(tokens)} tokens")
    idx = torch.from_numpy(tokens[: n * eval_len].astype(np.int64).reshape(n, eval_len)).to(device)  # (B, T)
    _, probs = model(idx, return_attention=True)  # per layer (B, H, T, T)
    mass = [p[:, :, n_first:, :n_first].sum(-1).mean(dim=(0, 2)) for p in probs]  # per layer (H,)
    return torch.stack(mass).float().cpu().numpy()  # (n_layer, H)
