"""Data parallel: DistributedDataParallel, gloo on CPU, NCCL on GPU."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def apply_ddp(model: nn.Module, *, device: torch.device, bucket_cap_mb: float,
              process_group=None) -> nn.Module:
    """`process_group`: the data-parallel group when the world also holds tp or pp ranks."""
    return DDP(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=bucket_cap_mb,
        process_group=process_group,
        forward_sync_buffers=False,  # the only buffers (rotary tables) are identical on every rank
    )
