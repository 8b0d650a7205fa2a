"""Linear warmup, then cosine decay to min_lr_ratio * lr."""

from __future__ import annotations

import math

import torch

from trainlab.config.schema import OptimConfig


def lr_factor(step: int, *, warmup_steps: int, max_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of the peak LR at optimizer step `step` (0-based)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(1, max_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, *, max_steps: int):
    """AdamW with weight decay on matrices only (not norms or biases) and its LR schedule."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: lr_factor(step, warmup_steps=cfg.warmup_steps, max_steps=max_steps,
                               min_lr_ratio=cfg.min_lr_ratio),
    )
    return optimizer, scheduler
