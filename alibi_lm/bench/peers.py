"""The peer implementations of section 2: the same width, depth, heads, FFN, dropout and tied plain
softmax as alibi-lm's model, ALiBi written two other ways."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from alibi_lm.model import LMConfig
from alibi_lm.positions import alibi_bias


class NaiveAttention(nn.Module):
    """Attention as the seed tutorials write it: scores by hand, the full (B, H, T, T) ALiBi bias (with
    the causal mask) built in every layer and every forward, softmax by hand."""

    def __init__(self, d, n_head, dropout):
        super().__init__()
        self.n_head, self.head_dim = n_head, d // n_head
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)  # (B, H, T, Dh)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)  # (B, H, T, T)
        pos = torch.arange(T, device=x.device)
        bias = alibi_bias(self.n_head, pos, pos).to(scores.dtype)  # (H, T, T), -inf on future keys
        scores = scores + bias[None].repeat(B, 1, 1, 1)  # materialised over the batch
        scores = scores - scores.amax(-1, keepdim=True)
        p = scores.exp()
        p = self.drop(p / p.sum(-1, keepdim=True))
        return self.out((p @ v).transpose(1, 2).reshape(B, T, D))


class NaiveBlock(nn.Module):
    def __init__(self, d, n_head, d_ff, dropout, attn_dropout):
        super().__init__()
        self.ln1, self.attn, self.ln2 = nn.LayerNorm(d), NaiveAttention(d, n_head, attn_dropout), nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, d_ff), nn.GELU(), nn.Linear(d_ff, d), nn.Dropout(dropout))
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.mlp(self.ln2(x))


class NaiveALiBiLM(nn.Module):
    """Same width, depth, heads, FFN, dropouts and tied plain softmax as alibi-lm's model."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        d = cfg.d_model
        self.weight = nn.Parameter(torch.randn(cfg.vocab_size, d) * d**-0.5)  # tied input/output table
        self.drop = nn.Dropout(cfg.dropout)
        d_ff = cfg.d_ff or 4 * d
        self.blocks = nn.ModuleList([NaiveBlock(d, cfg.n_head, d_ff, cfg.dropout, cfg.attn_dropout)
                                     for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(d)
        self.scale = math.sqrt(d)

    def forward(self, idx, targets):
        x = self.drop(F.embedding(idx, self.weight) * self.scale)
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.weight.t()  # (B, T, V)
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def x_transformers_lm(cfg: LMConfig, max_len: int) -> nn.Module:
    """x-transformers with its defaults (its own attention, not attn_flash) and ALiBi."""
    from x_transformers import Decoder, TransformerWrapper

    d = cfg.d_model
    decoder = Decoder(dim=d, depth=cfg.n_layer, heads=cfg.n_head, attn_dim_head=d // cfg.n_head,
                      ff_mult=(cfg.d_ff or 4 * d) // d, alibi_pos_bias=True, attn_dropout=cfg.attn_dropout,
                      ff_dropout=cfg.dropout)
    return TransformerWrapper(num_tokens=cfg.vocab_size, max_seq_len=max_len, attn_layers=decoder,
                              use_abs_pos_emb=False, tie_embedding=True, emb_dropout=cfg.dropout)


def x_transformers_loss(model: nn.Module):
    def loss(idx, targets):
        return F.cross_entropy(model(idx).float().flatten(0, 1), targets.flatten())

    return loss


def x_transformers_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("x-transformers")
    except PackageNotFoundError:
        return "not installed"
