"""The optimizer of a training run and its learning-rate schedule.

`train.optimizer=adamw` (the default) or `nag`: fairseq's NAG, which the paper's WikiText-103 model
trains with. fairseq's update (fairseq/optim/nag.py), with buffer b and learning rate lr_t,

    b_t = m (lr_t / lr_{t-1}) b_{t-1} - lr_t g_t ;   p_t = p_{t-1} + m b_t - lr_t g_t

is torch's SGD(nesterov=True, dampening=0) exactly (b_t = -lr_t * torch's buffer), at any schedule;
a test replays both. Weight decay (the paper uses none) would differ: fairseq decouples it.
"""

from __future__ import annotations

import torch


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on the blocks' and the vocabulary's matrices only. Biases and LayerNorm gains are
    vectors; a position scheme's parameters are never decayed: decay would pull a learned bias that
    training rarely reaches (T5's far buckets, KERPLE's slopes) towards zero for no reason."""
    position = {id(p) for p in getattr(model, "position", torch.nn.Module()).parameters()}
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2 and id(p) not in position]
    no_decay = [p for p in params if p.dim() < 2 or id(p) in position]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: torch.nn.Module, tc) -> torch.optim.Optimizer:
    groups = parameter_groups(model, tc.weight_decay)
    if tc.optimizer == "nag":
        return torch.optim.SGD(groups, lr=tc.lr, momentum=tc.momentum, nesterov=True)
    fused = next(model.parameters()).is_cuda
    return torch.optim.AdamW(groups, lr=tc.lr, betas=tuple(tc.betas), fused=fused)


def build_scheduler(opt, tc, total_steps: int):
    """Linear warmup from train.warmup_init_lr (default lr / warmup_steps) to train.lr, then cosine
    decay to lr * min_lr_ratio at the last step (torch's own schedulers). With warmup_init_lr=1e-7,
    lr=1, min_lr_ratio=1e-4 this is fairseq's cosine schedule of the paper's single 270k-update period."""
    warmup = min(tc.warmup_steps, max(total_steps - 1, 0))
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(total_steps - warmup, 1), eta_min=tc.lr * tc.min_lr_ratio)
    if warmup == 0:
        return cosine
    start = 1.0 / warmup if tc.warmup_init_lr is None else tc.warmup_init_lr / tc.lr
    linear = torch.optim.lr_scheduler.LinearLR(opt, start_factor=start, total_iters=warmup)
    return torch.optim.lr_scheduler.SequentialLR(opt, [linear, cosine], milestones=[warmup])
