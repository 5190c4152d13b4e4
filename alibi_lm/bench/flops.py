"""The FLOP model of training and the machine's peak, for MFU.

Training FLOPs per token = 6N + 12 n_layer d_model L (PaLM, Chowdhery et al. 2022, appendix B),
N = the weights a token multiplies."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from alibi_lm.model import LMConfig

from .common import sync
from .rows import Peak


@dataclass(frozen=True)
class FlopCount:
    per_token: float  # training FLOPs per token: 6 n_weights + attention
    n_weights: float  # N
    attention: float  # the attention term per token


def weights_per_token(cfg: LMConfig, targets: np.ndarray) -> float:
    """N: per layer 4 d^2 (q, k, v, out) + 2 d d_ff (MLP), and the output layer: d V for a plain
    softmax; for the adaptive one, the head (d (V_0 + clusters)) plus each tail's projection and
    table weighted by the share of targets in its band (tails are computed only for those).
    Embedding lookups, biases and LayerNorms are not counted."""
    d, d_ff = cfg.d_model, cfg.d_ff or 4 * cfg.d_model
    n = cfg.n_layer * (4 * d * d + 2 * d * d_ff)
    if not cfg.adaptive_cutoffs:
        return n + d * cfg.vocab_size
    edges = [0, *cfg.adaptive_cutoffs, cfg.vocab_size]
    dims = [max(1, d // cfg.adaptive_factor**i) for i in range(len(edges) - 1)]
    n += d * (edges[1] + len(edges) - 2)
    for i in range(1, len(dims)):
        share = float(((targets >= edges[i]) & (targets < edges[i + 1])).mean())
        n += share * (d * dims[i] + dims[i] * (edges[i + 1] - edges[i]))
    return n


def flops_per_token(cfg: LMConfig, L: int, targets: np.ndarray) -> FlopCount:
    """6N + 12 n_layer d L. The attention term is q k^T and p v at length L, forward and backward,
    not halved for causality (PaLM's convention)."""
    n = weights_per_token(cfg, targets)
    attention = 12 * cfg.n_layer * cfg.d_model * L
    return FlopCount(6 * n + attention, n, attention)


def best_matmul_seconds(a: torch.Tensor, b: torch.Tensor, device, reps: int) -> float:
    """Fastest of `reps` timed a @ b after 2 untimed warm-ups."""
    best = float("inf")
    for i in range(reps + 2):
        sync(device)
        t0 = time.perf_counter()
        a @ b
        sync(device)
        if i >= 2:
            best = min(best, time.perf_counter() - t0)
    return best


def measure_peak(device, quick: bool, layer: LMConfig, tokens: int) -> Peak:
    """Best FLOP/s of a large matmul (fp32 on CPU, bf16 on GPU), and for scale that of one MLP-sized
    matmul of the model, (tokens x d_model) @ (d_model x d_ff): what its layers can reach."""
    if device.type == "cuda":
        n, dtype, reps = 8192, torch.bfloat16, 20
    else:
        n, dtype, reps = (1024 if quick else 2048), torch.float32, (2 if quick else 6)
    a = torch.randn(n, n, device=device, dtype=dtype)
    best = best_matmul_seconds(a, torch.randn(n, n, device=device, dtype=dtype), device, reps)
    how = f"{n}x{n} @ {n}x{n} {str(dtype).replace('torch.', '')} matmul, best of {reps}"
    d, d_ff = layer.d_model, layer.d_ff or 4 * layer.d_model
    x, w = torch.randn(tokens, d, device=device, dtype=dtype), torch.randn(d, d_ff, device=device, dtype=dtype)
    layer_flops = 2 * tokens * d * d_ff / best_matmul_seconds(x, w, device, reps=5)
    return Peak(2 * n**3 / best, how, layer_flops)
