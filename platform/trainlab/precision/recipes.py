"""One recipe per precision mode: how the model is prepared, how forward runs, how a step applies.

The Trainer calls the same methods whatever the mode, so it never branches on precision:
prepare(model) -> attach(wrapped model) -> autocast() around forward ->
scale(loss).backward() -> unscale(optimizer) before clipping -> step(optimizer) returns
whether the step was applied. `casts` lists every low-precision linear and how it casts,
for the numerics probe; `plan` says which linears were kept in high precision.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import ContextManager

import torch
from torch import nn

from trainlab.parallel.parts import modules_by_name
from trainlab.precision import fp8
from trainlab.precision.capability import check_precision_supported
from trainlab.precision.emulate import (
    emulate_fp16_linears,
    emulate_linear,
    quantized_allreduce_hook,
    round_optimizer_states,
)
from trainlab.precision.policy import CastSpec, LayerPlan, linear_layers, plan_layers
from trainlab.vocab.format_names import parse_format
from trainlab.vocab.precision import EMULATION_TARGETS, PrecisionSettings, PrecisionSpec, emulates, spec_of

HP_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass
class PrecisionRecipe:
    """fp32, and the base of every other mode: no casts, no scaling."""

    name: str
    device_type: str
    emulated: bool = False
    peak_dtype: str = "fp32"
    """The compute dtype whose peak FLOP/s MFU is measured against (tf32: fp32 on TF32 cores)."""
    casts: list[tuple[str, nn.Module, CastSpec]] = field(default_factory=list)
    """(name, module, how it casts) of every linear layer running in low precision."""
    plan: LayerPlan | None = None
    """fp8 and emulated modes: which linears were converted and which kept in high precision."""
    dp_group: object = None
    """The data-parallel process group the recipe's own collectives run on (set by attach;
    None: no data-parallel peers)."""
    fsdp_backend: str = ""
    """The backend FSDP2 will all-gather parameters over ('' = the layout has no FSDP2)."""
    all_gather: fp8.Float8AllGather | None = None
    """fp8 modes: whether FSDP2 all-gathers the FP8 weights in float8, and why not."""

    @classmethod
    def build(cls, cfg: PrecisionSettings, spec: PrecisionSpec, *, device_type: str) -> PrecisionRecipe:
        """The recipe of `spec` for this config on `device_type` (subclasses with settings of
        their own override this). fp32 with precision.tf32 on a GPU runs (and is measured
        against) TF32 tensor cores; on CPU there are none and it stays fp32 (spec.peak_dtype)."""
        return cls(name=spec.name, device_type=device_type, peak_dtype=spec.peak_dtype(cfg, device_type=device_type))

    def prepare(self, model: nn.Module) -> nn.Module:
        return model

    def attach(self, model: nn.Module, *, dp_group=None) -> None:
        """Called with the parallelized model (e.g. to register a DDP communication hook) and
        its data-parallel group (parallel.Parallelized.dp_group; None: dp = 1). The casts
        follow the modules that train: a pipeline stage is a copy of the prepared model, and
        holds only some of its layers (parallel.parts)."""
        self.dp_group = dp_group
        self.casts = _trained_casts(self.casts, model)

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

    @property
    def skips_overflow(self) -> bool:
        """True when non-finite gradients are expected and handled (a dynamic loss scaler
        skips the step and backs off) rather than a sign of divergence."""
        return False

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def _autocast(device_type: str, dtype: torch.dtype) -> ContextManager:
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=dtype)


def _trained_casts(casts: list[tuple[str, nn.Module, CastSpec]],
                   model: nn.Module) -> list[tuple[str, nn.Module, CastSpec]]:
    """`casts` re-bound by name to the modules of `model` that run on this rank; the layers
    another pipeline rank holds are left out."""
    modules = modules_by_name(model)
    return [(name, modules[name], spec) for name, _, spec in casts if name in modules]


def _all_linears(model: nn.Module, spec: CastSpec) -> list[tuple[str, nn.Module, CastSpec]]:
    return [(name, module, spec) for name, module in linear_layers(model)]


@dataclass
class AutocastRecipe(PrecisionRecipe):
    """bf16 (or native fp16 without scaling): autocast compute, fp32 master weights."""

    dtype: torch.dtype = torch.bfloat16

    def prepare(self, model: nn.Module) -> nn.Module:
        fmt = parse_format("bf16" if self.dtype == torch.bfloat16 else "fp16")
        self.casts = _all_linears(model, CastSpec(fmt, fmt, fmt, scaling="none"))
        return model

    def autocast(self) -> ContextManager:
        return _autocast(self.device_type, self.dtype)


@dataclass
class PureBf16Recipe(PrecisionRecipe):
    """Parameters, gradients and optimizer state in bf16."""

    def prepare(self, model: nn.Module) -> nn.Module:
        bf16 = parse_format("bf16")
        self.casts = _all_linears(model, CastSpec(bf16, bf16, bf16, scaling="none"))
        return model.to(torch.bfloat16)


class Fp16Recipe(AutocastRecipe):
    """fp16 compute with dynamic loss scaling (torch.amp.GradScaler), native or emulated.

    Emulated: Linear operands rounded through fp16 with fp32 accumulation (no autocast);
    the scaler is the same, so skipped steps and backoff behave as on a GPU.
    """

    @classmethod
    def build(cls, cfg: PrecisionSettings, spec: PrecisionSpec, *, device_type: str) -> Fp16Recipe:
        return cls(cfg, device_type, emulated=emulates(cfg, device_type=device_type))

    def __init__(self, cfg: PrecisionSettings, device_type: str, *, emulated: bool):
        super().__init__(name="fp16", device_type=device_type, emulated=emulated,
                         peak_dtype=spec_of("fp16").peak_dtype(cfg, device_type=device_type), dtype=torch.float16)
        self.scaler = torch.amp.GradScaler(
            device_type, init_scale=cfg.init_scale, growth_factor=cfg.growth_factor,
            backoff_factor=cfg.backoff_factor, growth_interval=cfg.growth_interval,
            # a CUDA recipe built where no GPU is (the estimate of a GPU cluster, on a laptop) needs no
            # scaler, and GradScaler would say so in a warning of its own before disabling itself
            enabled=cfg.loss_scale == "dynamic" and (device_type != "cuda" or torch.cuda.is_available()),
        )

    def prepare(self, model: nn.Module) -> nn.Module:
        fp16 = parse_format("fp16")
        # gradients reach the casts multiplied by the loss scale (the probe divides it out)
        self.casts = _all_linears(model, CastSpec(fp16, fp16, fp16, scaling="loss"))
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

    @property
    def skips_overflow(self) -> bool:
        return self.scaler.is_enabled()

    def state_dict(self) -> dict:
        return self.scaler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.scaler.load_state_dict(state)


class Fp8Recipe(PrecisionRecipe):
    """FP8 linears (torchao Float8Linear with current scaling, or the project's delayed
    scaling) for the layers precision.keep_hp does not keep; everything else in hp_dtype."""

    @classmethod
    def build(cls, cfg: PrecisionSettings, spec: PrecisionSpec, *, device_type: str) -> PrecisionRecipe:
        return cls(cfg, device_type)

    def __init__(self, cfg: PrecisionSettings, device_type: str):
        # MFU against the high-precision peak; run.py adds a second one against the FP8 peak
        super().__init__(name=cfg.name, device_type=device_type,
                         emulated=emulates(cfg, device_type=device_type),
                         peak_dtype=spec_of(cfg.name).peak_dtype(cfg, device_type=device_type))
        self.cfg = cfg
        self.hp_dtype = HP_DTYPES[cfg.hp_dtype]
        self._model: nn.Module | None = None

    def prepare(self, model: nn.Module) -> nn.Module:
        if self.device_type == "cpu":  # the preflight checked the driver's torch; this is the worker's
            check_precision_supported(self.name, device="cpu", emulated=self.emulated)
        self.plan = plan_layers(model, self.cfg.keep_hp, size_filter=spec_of(self.name).size_filter)
        self.all_gather = fp8.float8_all_gather(self.name, fsdp_backend=self.fsdp_backend, model=model,
                                                layers=self.plan.lowp)
        if spec_of(self.name).torchao_recipe:
            converted = fp8.convert_torchao(model, self.name, layers=self.plan.lowp, emulate=self.emulated,
                                            all_gather=self.all_gather.enabled)
            spec = fp8.torchao_cast_spec(fp8.torchao_config(self.name, emulate=self.emulated))
        else:
            from trainlab.precision.fp8_delayed import convert_to_delayed_fp8

            wanted = set(self.plan.lowp)
            convert_to_delayed_fp8(model, module_filter=lambda _m, fqn: fqn in wanted,
                                   history_len=self.cfg.amax_history_len,
                                   margin=self.cfg.fp8_margin, emulate=self.emulated)
            converted = {n: m for n, m in model.named_modules() if n in wanted}
            spec = fp8.delayed_cast_spec()
        self.casts = [(name, converted[name], spec) for name in self.plan.lowp]
        self._model = model
        return model

    def attach(self, model: nn.Module, *, dp_group=None) -> None:
        super().attach(model, dp_group=dp_group)
        self._model = model  # fp8_delayed updates the scales of the layers that run here

    def autocast(self) -> ContextManager:
        return _autocast(self.device_type, self.hp_dtype)

    def step(self, optimizer: torch.optim.Optimizer, *, grads_finite: bool) -> bool:
        applied = super().step(optimizer, grads_finite=grads_finite)
        if self.name == "fp8_delayed":
            from trainlab.precision.fp8_delayed import update_delayed_scales

            # this step's amaxes -> histories -> next scales, the same on every dp replica
            update_delayed_scales(self._model, group=self.dp_group, reduce=self.dp_group is not None)
        if applied and self.all_gather.enabled:
            from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

            # the new weights' scales, for the next all-gathers: one all-reduce of every amax
            # instead of one per weight and gather (torchtitan's post-optimizer hook)
            precompute_float8_dynamic_scale_for_fsdp(self._model)
        return applied


class EmulatedRecipe(PrecisionRecipe):
    """Any eXmY format on the chosen tensors (precision.formats), on any device."""

    @classmethod
    def build(cls, cfg: PrecisionSettings, spec: PrecisionSpec, *, device_type: str) -> PrecisionRecipe:
        return cls(cfg, device_type)

    def __init__(self, cfg: PrecisionSettings, device_type: str):
        super().__init__(name="emulated", device_type=device_type, emulated=True,
                         peak_dtype=spec_of("emulated").peak_dtype(cfg, device_type=device_type))
        self.cfg = cfg
        self.scaled = cfg.scaling == "tensor"
        f = cfg.formats
        self.formats = {t: parse_format(getattr(f, t)) if getattr(f, t) else None
                        for t in EMULATION_TARGETS}

    def prepare(self, model: nn.Module) -> nn.Module:
        self.plan = plan_layers(model, self.cfg.keep_hp)
        fmts = self.formats
        spec = CastSpec(fmts["activations"], fmts["weights"], fmts["gradients"],
                        scaling="tensor" if self.scaled else "none")
        modules = dict(linear_layers(model))
        if any((fmts["activations"], fmts["weights"], fmts["gradients"])):
            for name in self.plan.lowp:
                emulate_linear(modules[name], activations=fmts["activations"], weights=fmts["weights"],
                               gradients=fmts["gradients"], scaled=self.scaled)
            self.casts = [(name, modules[name], spec) for name in self.plan.lowp]
        return model

    def attach(self, model: nn.Module, *, dp_group=None) -> None:
        super().attach(model, dp_group=dp_group)
        if self.formats["comm_grads"] is not None and hasattr(model, "register_comm_hook"):
            # the hook's state is its process group: the data-parallel one, not the world
            model.register_comm_hook(dp_group, quantized_allreduce_hook(self.formats["comm_grads"],
                                                                        scaled=self.scaled))

    def autocast(self) -> ContextManager:
        return _autocast(self.device_type, HP_DTYPES[self.cfg.hp_dtype])

    def step(self, optimizer: torch.optim.Optimizer, *, grads_finite: bool) -> bool:
        applied = super().step(optimizer, grads_finite=grads_finite)
        if applied and self.formats["optimizer_states"] is not None:
            round_optimizer_states(optimizer, self.formats["optimizer_states"], scaled=self.scaled)
        return applied


def build_recipe(cfg: PrecisionSettings, *, device_type: str, fsdp_backend: str = "") -> PrecisionRecipe:
    """The recipe of precision `cfg.name` (its class named by vocab.precision) on `device_type`.
    `fsdp_backend`: the backend FSDP2 will shard parameters over ('' = no FSDP2 in the layout)."""
    spec = spec_of(cfg.name)
    recipe = spec.recipe_class().build(cfg, spec, device_type=device_type)
    recipe.fsdp_backend = fsdp_backend
    if device_type == "cuda":
        # set either way: a warm worker may run an fp32 trial with TF32 after one without
        tf32 = recipe.peak_dtype == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    return recipe
