"""Linear warmup, then cosine decay to min_lr_ratio * lr."""

from __future__ import annotations

import math
from typing import Callable

import torch

from trainlab.config.schema import OptimConfig


def lr_factor(step: int, *, warmup_steps: int, max_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of the peak LR at optimizer step `step` (0-based)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(1, max_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, *, max_steps: int,
                    make_optimizer: Callable[..., torch.optim.Optimizer] | None = None,
                    bf16_update: str = "plain", seed: int = 0):
    """AdamW with weight decay on matrices only (not norms or biases) and its LR schedule.

    Moments stored in low precision (optim.exp_avg_dtype / exp_avg_sq_dtype) use the
    project's LowPrecisionAdamW; all-fp32 state uses torch's own AdamW. make_optimizer:
    (optimizer_cls, param_groups, **kwargs) -> optimizer, from the layout
    (parallel.Parallelized.make_optimizer; ZeRO-1 shards the states); None = optimizer_cls.
    bf16_update (precision.bf16_update, for bf16 parameters): plain is torch's AdamW; stochastic
    and kahan use LowPrecisionAdamW with the moments in bf16 where the config says fp32, as
    torch's AdamW keeps them for bf16 parameters (bf16_pure's memory), `seed` for its rounding."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    kwargs = dict(lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)
    optimizer_cls, extra = torch.optim.AdamW, {}
    if cfg.exp_avg_dtype != "fp32" or cfg.exp_avg_sq_dtype != "fp32":
        from trainlab.precision.lowp_adamw import LowPrecisionAdamW

        optimizer_cls = LowPrecisionAdamW
        extra = dict(exp_avg_dtype=cfg.exp_avg_dtype, exp_avg_sq_dtype=cfg.exp_avg_sq_dtype)
    if bf16_update != "plain" and any(p.dtype == torch.bfloat16 for p in params):
        from trainlab.precision.lowp_adamw import LowPrecisionAdamW

        optimizer_cls = LowPrecisionAdamW
        extra = dict(exp_avg_dtype=cfg.exp_avg_dtype.replace("fp32", "bf16"),
                     exp_avg_sq_dtype=cfg.exp_avg_sq_dtype.replace("fp32", "bf16"),
                     bf16_update=bf16_update, seed=seed)
    if make_optimizer is not None:
        optimizer = make_optimizer(optimizer_cls, groups, **kwargs, **extra)
    else:
        optimizer = optimizer_cls(groups, **kwargs, **extra)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: lr_factor(step, warmup_steps=cfg.warmup_steps, max_steps=max_steps,
                               min_lr_ratio=cfg.min_lr_ratio),
    )
    return optimizer, scheduler
