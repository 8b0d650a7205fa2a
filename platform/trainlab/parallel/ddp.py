"""Data parallel: DistributedDataParallel, gloo on CPU, NCCL on GPU."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def apply_ddp(model: nn.Module, *, device: torch.device, bucket_cap_mb: float) -> nn.Module:
    return DDP(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=bucket_cap_mb,
        forward_sync_buffers=False,  # the only buffers (rotary tables) are identical on every rank
    )
