"""One recipe per precision mode: how the model is prepared, how forward runs, how a step applies.

The Trainer calls the same five methods whatever the mode, so it never branches on precision:
prepare(model) -> autocast() around forward -> scale(loss).backward() -> unscale(optimizer)
before clipping -> step(optimizer) returns whether the step was applied.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ContextManager

import torch
from torch import nn

from trainlab.config.schema import PrecisionConfig
from trainlab.precision.emulate import emulate_fp16_linears


@dataclass
class PrecisionRecipe:
    """fp32, and the base of every other mode: no casts, no scaling."""

    name: str
    device_type: str
    emulated: bool = False

    def prepare(self, model: nn.Module) -> nn.Module:
        return model

    def autocast(self) -> ContextManager:
        return contextlib.nullcontext()

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients to their true size (before clipping and measuring them)."""

    def step(self, optimizer: torch.optim.Optimizer, *, grads_finite: bool) -> bool:
        """Apply the update unless gradients are non-finite; True if it was applied."""
        if grads_finite:
            optimizer.step()
        return grads_finite

    @property
    def loss_scale(self) -> float | None:
        return None

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@dataclass
class AutocastRecipe(PrecisionRecipe):
    """bf16 (or native fp16 without scaling): autocast compute, fp32 master weights."""

    dtype: torch.dtype = torch.bfloat16

    def autocast(self) -> ContextManager:
        return torch.autocast(self.device_type, dtype=self.dtype)


@dataclass
class PureBf16Recipe(PrecisionRecipe):
    """Parameters, gradients and optimizer state in bf16."""

    def prepare(self, model: nn.Module) -> nn.Module:
        return model.to(torch.bfloat16)


class Fp16Recipe(AutocastRecipe):
    """fp16 compute with dynamic loss scaling (torch.amp.GradScaler), native or emulated.

    Emulated: Linear operands rounded through fp16 with fp32 accumulation (no autocast);
    the scaler is the same, so skipped steps and backoff behave as on a GPU.
    """

    def __init__(self, cfg: PrecisionConfig, device_type: str, *, emulated: bool):
        super().__init__(name="fp16", device_type=device_type, emulated=emulated,
                         dtype=torch.float16)
        self.scaler = torch.amp.GradScaler(
            device_type, init_scale=cfg.init_scale, growth_factor=cfg.growth_factor,
            backoff_factor=cfg.backoff_factor, growth_interval=cfg.growth_interval,
            enabled=cfg.loss_scale == "dynamic",
        )

    def prepare(self, model: nn.Module) -> nn.Module:
        if self.emulated:
            emulate_fp16_linears(model)
        return model

    def autocast(self) -> ContextManager:
        return contextlib.nullcontext() if self.emulated else super().autocast()

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss)

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler.is_enabled():
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer, *, grads_finite: bool) -> bool:
        if not self.scaler.is_enabled():
            return super().step(optimizer, grads_finite=grads_finite)
        # the scaler skips optimizer.step() itself when it found inf/NaN while unscaling
        before = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        return not self.scaler.get_scale() < before

    @property
    def loss_scale(self) -> float | None:
        return self.scaler.get_scale() if self.scaler.is_enabled() else None

    def state_dict(self) -> dict:
        return self.scaler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.scaler.load_state_dict(state)


def build_recipe(cfg: PrecisionConfig, *, device_type: str) -> PrecisionRecipe:
    """The recipe for cfg.name on `device_type` ('cpu' or 'cuda')."""
    if cfg.name == "fp32":
        return PrecisionRecipe(name="fp32", device_type=device_type)
    if cfg.name == "bf16":
        return AutocastRecipe(name="bf16", device_type=device_type, dtype=torch.bfloat16)
    if cfg.name == "bf16_pure":
        return PureBf16Recipe(name="bf16_pure", device_type=device_type)
    if cfg.name == "fp16":
        impl = cfg.fp16_impl
        if impl == "auto":
            impl = "emulated" if device_type == "cpu" else "native"
        return Fp16Recipe(cfg, device_type, emulated=impl == "emulated")
    raise ValueError(f"precision.name={cfg.name!r} has no recipe")  # schema checks first
