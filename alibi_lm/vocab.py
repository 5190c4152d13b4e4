"""Token embedding and the tied output layer, as one module so that tying is by construction.

Both classes answer: embed(idx) -> (B, T, D); logits(h) -> (..., V); nll(h, targets) -> (...).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def fit_cutoffs(cutoffs: list[int] | None, vocab_size: int) -> list[int]:
    """The adaptive cutoffs a vocabulary of vocab_size can hold: those below vocab_size, in order.

    The rule that lets every model preset run on every vocabulary: a preset's cutoffs are written for
    the vocabulary it was made for (the paper's 20000/60000 for WikiText-103's 267,735 words); on a
    smaller one (WikiText-2's 33,278) the bands past its end are dropped and the last band ends at
    vocab_size. With no cutoff left, the model has a plain tied embedding and softmax."""
    return [int(c) for c in cutoffs or [] if int(c) < vocab_size]


class TiedVocabulary(nn.Module):
    """One (V, D) table for the input embedding and the output softmax."""

    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(vocab_size, d_model) * d_model**-0.5)  # (V, D)

    def embed(self, idx):
        return F.embedding(idx, self.weight)  # (B, T, D)

    def logits(self, h):
        return h @ self.weight.t()  # (..., V)

    def nll(self, h, targets):
        logits = self.logits(h).float()  # (..., V)
        return F.cross_entropy(logits.flatten(0, -2), targets.flatten(), reduction="none").view_as(targets)


class AdaptiveVocabulary(nn.Module):
    """Adaptive input (Baevski & Auli, 2019) tied with an adaptive softmax (Grave et al., 2017),
    as in the paper's fairseq model: band i of the frequency-sorted vocabulary gets dimension
    d_model / factor^i. The softmax reuses each band's table and (transposed) projection, and adds
    only the head's cluster logits. torch's nn.AdaptiveLogSoftmaxWithLoss owns its own weights and
    cannot be tied to an input embedding, so the few lines below do it instead.
    """

    def __init__(self, vocab_size: int, d_model: int, cutoffs: list[int], factor: int = 4, softmax_dropout: float = 0.0):
        super().__init__()
        # cutoffs: increasing, in (0, vocab_size) (LMConfig checks them; fit_cutoffs drops those past the end)
        self.edges = [0, *map(int, cutoffs), vocab_size]  # band i covers token ids [edges[i], edges[i+1])
        self.d_model = d_model
        dims = [max(1, d_model // factor**i) for i in range(len(self.edges) - 1)]
        # fairseq's AdaptiveInput init: band tables N(0, dim_i^-1/2), projections xavier_uniform, so
        # that after the model's sqrt(d) scale every band's input has a per-element std of about
        # sqrt(2 d / (d + dim_i)) (1 for the head band, at most sqrt(2) for the tails)
        self.tables = nn.ParameterList(
            [nn.Parameter(torch.randn(hi - lo, dim) * dim**-0.5) for lo, hi, dim in zip(self.edges, self.edges[1:], dims)]
        )  # band i: (V_i, D_i)
        self.projections = nn.ParameterList(
            [nn.Parameter(nn.init.xavier_uniform_(torch.empty(d_model, dim))) for dim in dims]
        )  # band i: (D, D_i), maps D_i -> D on input and D -> D_i (transposed) on output
        self.cluster_logits = nn.Linear(d_model, len(cutoffs), bias=False)  # head's tail-cluster logits
        nn.init.xavier_uniform_(self.cluster_logits.weight)  # fairseq's AdaptiveSoftmax init
        # fairseq's adaptive_softmax_dropout, applied twice as there: to the softmax's input, and inside each
        # tail between its projection and its (tied) word table
        self.softmax_dropout = nn.Dropout(softmax_dropout)

    def embed(self, idx):
        out = torch.zeros(*idx.shape, self.d_model, device=idx.device, dtype=self.projections[0].dtype)
        for i, (lo, hi) in enumerate(zip(self.edges, self.edges[1:])):
            in_band = (idx >= lo) & (idx < hi)
            band_ids = idx[in_band] - lo  # (n,)
            # .to(out.dtype): under autocast (bf16 on CUDA) the product is bf16, the buffer float32
            out[in_band] = (F.embedding(band_ids, self.tables[i]) @ self.projections[i].t()).to(out.dtype)  # (n, D)
        return out  # (B, T, D)

    def _head_logprobs(self, h):
        head = torch.cat([h @ self.tables[0].t(), self.cluster_logits(h)], dim=-1)  # (N, V_0 + n_tails)
        return head.float().log_softmax(-1)

    def _tail_logprobs(self, h, i):
        return (self.softmax_dropout(h @ self.projections[i]) @ self.tables[i].t()).float().log_softmax(-1)  # (N, V_i)

    def logits(self, h):
        """Full log-probabilities (valid logits: softmax of them is the model's distribution)."""
        flat = h.reshape(-1, h.shape[-1])  # (N, D)
        head = self._head_logprobs(flat)  # (N, V_0 + n_tails)
        n0 = self.edges[1]
        parts = [head[:, :n0]]
        for i in range(1, len(self.tables)):
            parts.append(head[:, n0 + i - 1 : n0 + i] + self._tail_logprobs(flat, i))
        return torch.cat(parts, dim=-1).view(*h.shape[:-1], -1)  # (..., V)

    def nll(self, h, targets):
        flat_h, flat_t = self.softmax_dropout(h.reshape(-1, h.shape[-1])), targets.reshape(-1)  # (N, D), (N,)
        head = self._head_logprobs(flat_h)  # (N, V_0 + n_tails)
        n0 = self.edges[1]
        # head column: the word itself in band 0, else its band's cluster
        band = torch.bucketize(flat_t, torch.tensor(self.edges[1:-1], device=flat_t.device), right=True)
        head_col = torch.where(band == 0, flat_t, n0 + band - 1)
        logp = head.gather(1, head_col[:, None]).squeeze(1)  # (N,)
        for i in range(1, len(self.tables)):
            rows = (band == i).nonzero().squeeze(1)
            if rows.numel():
                tail = self._tail_logprobs(flat_h[rows], i)  # (n, V_i)
                logp = logp.index_add(0, rows, tail.gather(1, (flat_t[rows] - self.edges[i])[:, None]).squeeze(1))
        return (-logp).view_as(targets)
