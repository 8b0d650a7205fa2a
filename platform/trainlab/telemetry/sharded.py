"""The whole value of a tensor that may be a DTensor shard (FSDP2, tensor parallel).

Sampled telemetry measures whole tensors: amax, norms and cosines of a shard are not those of
the tensor. `full` gathers a DTensor (a collective: every rank must call it at the same point,
which the sampled steps guarantee) and returns a plain tensor otherwise.
"""

from __future__ import annotations

import torch


def full(t: torch.Tensor) -> torch.Tensor:
    full_tensor = getattr(t, "full_tensor", None)
    return full_tensor() if callable(full_tensor) else t
