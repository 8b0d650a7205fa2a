"""Low-precision emulation on any hardware: fp16 autocast, and any eXmY format on chosen tensors.

fp16: faithful emulation on fp32 hardware, operands rounded through fp16, fp32 accumulation.

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

from trainlab.precision.fake_cast import fake_cast, fake_quantize
from trainlab.vocab.format_names import FloatFormat


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


# -- any eXmY format ----------------------------------------------------------------------
def emulate_linear(module: nn.Linear, *, activations: FloatFormat | None, weights: FloatFormat | None,
                   gradients: FloatFormat | None, scaled: bool) -> None:
    """Make `module` cast as a low-precision linear does: its input and weight to their
    formats in the forward pass, the gradient arriving at its output in the backward pass.
    The matmul itself runs in the high-precision dtype (fp32 or the autocast dtype), as the
    accumulation of an FP8 tensor core does. The state dict is unchanged."""

    def forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        xq = fake_cast(x, activations, None, scaled=scaled)
        wq = fake_cast(self.weight, weights, None, scaled=scaled)
        return fake_cast(F.linear(xq, wq, self.bias), None, gradients, scaled=scaled)

    module.forward = types.MethodType(forward, module)


def round_optimizer_states(optimizer: torch.optim.Optimizer, fmt: FloatFormat, *, scaled: bool) -> None:
    """Re-round every floating-point state tensor but the step count (AdamW: both moments)
    to `fmt`, in place: the values an optimizer storing its state in that format would hold."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if key != "step" and torch.is_tensor(value) and value.is_floating_point() and value.dim() > 0:
                value.copy_(fake_quantize(value, fmt, scaled=scaled))


def quantized_allreduce_hook(fmt: FloatFormat, *, scaled: bool):
    """A DDP communication hook: each rank's gradient bucket is rounded to `fmt` (as if it
    were sent in that format) and then averaged. The sum itself is exact, as a reduction in
    higher precision would be; what is emulated is the precision of what travels."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def hook(state, bucket):
        buffer = bucket.buffer()
        buffer.copy_(fake_quantize(buffer, fmt, scaled=scaled))
        return allreduce_hook(state, bucket)

    return hook
