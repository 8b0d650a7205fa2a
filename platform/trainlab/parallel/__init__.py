"""One apply_<strategy>() per parallelism; parallelize() applies them in a fixed order."""

from __future__ import annotations

import contextlib
from typing import ContextManager

import torch
from torch import nn

from trainlab.config.schema import ParallelConfig
from trainlab.config.validate import ParallelDims
from trainlab.parallel.ddp import apply_ddp


def parallelize(model: nn.Module, *, dims: ParallelDims, cfg: ParallelConfig,
                device: torch.device) -> nn.Module:
    """Wrap `model` for the layout. Data parallel goes last: it must see the final
    (possibly sharded or cast) parameters it synchronises."""
    if dims.dp > 1:
        model = apply_ddp(model, device=device, bucket_cap_mb=cfg.bucket_cap_mb)
    return model


def unwrap(model: nn.Module) -> nn.Module:
    """The user's model inside DDP / torch.compile wrappers (its names have no prefixes)."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def no_sync(model: nn.Module, *, last_micro_batch: bool) -> ContextManager:
    """Skip the gradient all-reduce on every micro-batch but the last of an optimizer step."""
    if last_micro_batch or not hasattr(model, "no_sync"):
        return contextlib.nullcontext()
    return model.no_sync()


__all__ = ["apply_ddp", "no_sync", "parallelize", "unwrap"]
