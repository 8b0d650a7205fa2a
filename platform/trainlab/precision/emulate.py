"""Faithful fp16 emulation on fp32 hardware: round operands through fp16, accumulate in fp32.

Native fp16 matmuls on CPUs are ~100x slower than fp32, which makes fp16 experiments on CPU
impractical. What matters numerically about fp16 autocast is where values are rounded to
fp16 (inputs, weights, outputs and the gradients flowing back through them: the place
small gradients underflow), not the kernel. `round_fp16` rounds in the forward pass and
rounds the incoming gradient in the backward pass; wrapping every Linear's operands and
output with it reproduces autocast's fp16 linears with fp32 accumulation.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn


class _RoundFp16(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # noqa: D401
        return x.to(torch.float16).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        # the gradient arriving at an fp16 tensor is itself fp16 under autocast
        return grad.to(torch.float16).to(grad.dtype)


def round_fp16(x: torch.Tensor) -> torch.Tensor:
    """x rounded to the nearest fp16 value (overflow -> inf, tiny -> subnormal or 0), both ways."""
    return _RoundFp16.apply(x)


def _emulated_linear_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    bias = round_fp16(self.bias) if self.bias is not None else None
    return round_fp16(F.linear(round_fp16(x), round_fp16(self.weight), bias))


def emulate_fp16_linears(model: nn.Module) -> int:
    """Make every nn.Linear of `model` compute as an fp16-autocast linear would. Returns the count.

    The state dict is unchanged (only `forward` is rebound), so checkpoints stay compatible.
    """
    count = 0
    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.forward = types.MethodType(_emulated_linear_forward, module)
            count += 1
    return count
