"""Which tensor went non-finite first: an activation (of which module), the loss, or a gradient.

Healthy steps pay nothing: the loss and the gradient norm are checked anyway. On a step where
either is non-finite, the step's micro-batches are run forward again with a hook on every
module, and the first module (in execution order) whose output is non-finite is the origin;
a NaN propagates forward, so every module after it is non-finite too. The replay sees the
same weights and inputs (the update of a non-finite step is never applied), so it reproduces
the forward pass; if it does not (a transient fault), the loss or the first non-finite
gradient in backward order is named instead.
"""

from __future__ import annotations

from typing import Callable, ContextManager, Iterable

import torch
from torch import nn

from trainlab.parallel.parts import holds_stages, model_parts, modules_by_name

ACTIVATION = "activation:"
GRADIENT = "grad:"
LOSS = "loss"


class NonFiniteMonitor:
    def __init__(self, model: nn.Module) -> None:
        self.model = model
        """The user's model, unwrapped (no DDP or torch.compile: names without prefixes)."""

    @torch.no_grad()
    def first_activation(self, inputs: Iterable[torch.Tensor], autocast: Callable[[], ContextManager]) -> str:
        """Replay forward passes over `inputs` until a module's output is non-finite."""
        found: list[str] = []

        def hook_for(name: str):
            def hook(_module, _args, output):
                if not found and torch.is_tensor(output) and output.is_floating_point() \
                        and not torch.isfinite(output).all():
                    found.append(name)
            return hook

        handles = [m.register_forward_hook(hook_for(n)) for n, m in self.model.named_modules() if n]
        try:
            for x in inputs:
                with autocast():
                    self.model(x)
                if found:
                    return ACTIVATION + found[0]
        finally:
            for h in handles:
                h.remove()
        return ""

    def first_gradient(self) -> str:
        """Gradients are produced from the output backwards: the first non-finite one in that
        order is where the overflow started."""
        named = [p for part in model_parts(self.model) for p in part.named_parameters()]
        for name, param in reversed(named):  # pipeline stages in stage order, under the model's names
            if param.grad is not None and not torch.isfinite(param.grad).all():
                return GRADIENT + name
        return ""

    def origin(self, inputs: Iterable[torch.Tensor], autocast: Callable[[], ContextManager], *,
               loss_finite: bool) -> str:
        """'activation:<module>', 'loss', 'grad:<param>' or '' (call only on a bad step)."""
        return self.first_activation(inputs, autocast) or (LOSS if not loss_finite else self.first_gradient())


def injection_target(model: nn.Module, module_name: str) -> nn.Module:
    """The module debug.inject_nan names; ValueError naming the field and some real names."""
    modules = modules_by_name(model)
    if module_name not in modules:
        known = [n for n in modules if n and n.count(".") <= 2]
        raise ValueError(f"debug.inject_nan names module {module_name!r}, which the model does not "
                         f"have; pick one of {', '.join(known[:12])}, ...")
    return modules[module_name]


def inject_nan(model: nn.Module, module_name: str, *, at_step: int, current_step: Callable[[], int]):
    """Make `module_name`'s output NaN during optimizer step `at_step` (1-based): a fault to
    prove the monitor attributes it. Runs before any other forward hook of that module.

    `model`: what trains (parallel.parts): under pipeline stages only the rank holding the
    module hooks it (None elsewhere; preflight checked the name against the whole model)."""
    if holds_stages(model) and module_name not in modules_by_name(model):
        return None
    target = injection_target(model, module_name)

    def hook(module, _args, output):
        if module.training and current_step() == at_step:
            return output * float("nan")
        return None

    return target.register_forward_hook(hook, prepend=True)
