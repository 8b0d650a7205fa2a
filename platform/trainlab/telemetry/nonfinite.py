"""Which tensor went non-finite first: an activation (of which module), the loss, or a gradient.

Every module's output is checked on the device each forward (one fused isfinite-all per
module, OR-ed into a flag vector: no host sync). The flags are read only on a step whose
loss or gradient norm is already non-finite, so a healthy step pays no synchronisation.
The first flagged module in execution order is the origin: a NaN propagates forward, so
every module after it is flagged too.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

ACTIVATION = "activation:"
GRADIENT = "grad:"
LOSS = "loss"


class NonFiniteMonitor:
    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._names = [name for name, _ in model.named_modules() if name]
        self._flags: torch.Tensor | None = None
        self._order: list[int] = []      # module indices in the order their outputs complete
        self._order_done = False
        self._handles = [module.register_forward_hook(self._hook(i))
                         for i, (name, module) in enumerate((n, m) for n, m in model.named_modules() if n)]
        self._root = model.register_forward_hook(self._root_hook)

    def _hook(self, index: int) -> Callable:
        def hook(_module, _args, output):
            if not torch.is_tensor(output) or not output.is_floating_point():
                return
            if not self._order_done:
                self._order.append(index)
            if self._flags is None or self._flags.device != output.device:
                self._flags = torch.zeros(len(self._names), dtype=torch.bool, device=output.device)
            self._flags[index] |= ~torch.isfinite(output.detach()).all()
        return hook

    def _root_hook(self, *_):
        self._order_done = True

    def reset(self) -> None:
        """Start a new optimizer step (flags are OR-ed over its micro-batches)."""
        if self._flags is not None:
            self._flags.zero_()

    def first_nonfinite(self, *, loss_finite: bool) -> str:
        """The origin of a non-finite step: 'activation:<module>', 'loss', 'grad:<param>' or ''.

        Call after backward of a step whose loss or gradient norm was non-finite (syncs)."""
        if self._flags is not None:
            flagged = self._flags.tolist()
            for index in self._order:
                if flagged[index]:
                    return ACTIVATION + self._names[index]
        if not loss_finite:
            return LOSS
        # gradients are produced from the output backwards: the first non-finite one in
        # that order is where the overflow started
        for name, param in reversed(list(self.model.named_parameters())):
            if param.grad is not None and not torch.isfinite(param.grad).all():
                return GRADIENT + name
        return ""

    def close(self) -> None:
        for h in (*self._handles, self._root):
            h.remove()


def inject_nan(model: nn.Module, module_name: str, *, at_step: int, current_step: Callable[[], int]):
    """Make `module_name`'s output NaN during optimizer step `at_step` (1-based): a fault to
    prove the monitor attributes it. Runs before any other forward hook of that module."""
    modules = dict(model.named_modules())
    if module_name not in modules:
        known = [n for n in modules if n and n.count(".") <= 2]
        raise ValueError(f"train.inject_nan names module {module_name!r}, which the model does not "
                         f"have; pick one of {', '.join(known[:12])}, ...")

    def hook(module, _args, output):
        if module.training and current_step() == at_step:
            return output * float("nan")
        return None

    return modules[module_name].register_forward_hook(hook, prepend=True)
