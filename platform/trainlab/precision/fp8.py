"""FP8 linears: torchao's Float8Linear (current scaling) and the project's delayed scaling.

torchao is imported only when an fp8 mode is asked for: its import prints warnings about
GPU kernels a CPU build lacks, and every other mode must not pay for it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from trainlab.precision.policy import CastSpec
from trainlab.vocab.format_names import FloatFormat, parse_format
from trainlab.vocab.precision import spec_of

E4M3 = parse_format("e4m3")
E5M2 = parse_format("e5m2")


def _format_of(dtype: torch.dtype) -> FloatFormat:
    return E4M3 if dtype == torch.float8_e4m3fn else E5M2


def torchao_config(precision: str, *, emulate: bool):
    """torchao's Float8LinearConfig for one of the fp8_* modes."""
    from torchao.float8 import Float8LinearConfig

    config = Float8LinearConfig.from_recipe_name(spec_of(precision).torchao_recipe)
    return dataclasses.replace(config, emulate=emulate) if emulate else config


def torchao_cast_spec(config) -> CastSpec:
    """What the forward-pass casts of a torchao config are, for the numerics probe."""
    axiswise = config.cast_config_input.scaling_granularity.value == "axiswise"
    return CastSpec(
        input=_format_of(config.cast_config_input.target_dtype),
        weight=_format_of(config.cast_config_weight.target_dtype),
        grad_output=_format_of(config.cast_config_grad_output.target_dtype),
        scaling="row" if axiswise else "tensor",
        power_of_2=config.round_scales_to_power_of_2,
    )


@dataclass(frozen=True)
class Float8AllGather:
    """Whether FSDP2 all-gathers a trial's FP8 weights in float8 (torchao's
    enable_fsdp_float8_all_gather: half of bf16's bytes, one amax all-reduce for every weight
    after each optimizer step) and, when it does not, why (the `fp8_all_gather` tag)."""

    enabled: bool
    reason: str = ""

    @property
    def tag(self) -> str:
        return "true" if self.enabled else f"false: {self.reason}"


def float8_all_gather(precision: str, *, fsdp_backend: str, model: nn.Module, layers: list[str]) -> Float8AllGather:
    """The one decision on float8 all-gather, before `layers` of `model` are converted.
    `fsdp_backend`: the backend FSDP2 shards parameters over ('' = the layout has no FSDP2).

    On: a torchao recipe with tensorwise weight scales (torchao refuses the flag otherwise),
    FSDP2 on, and a backend that can send the bytes: NCCL, or gloo (no float8 dtype) where every
    FSDP group also holds other parameters, so FSDP2 gathers the group as one uint8 buffer."""
    if not spec_of(precision).torchao_recipe:
        return Float8AllGather(False, f"{precision} is not a torchao recipe; its weights are "
                                      "all-gathered in precision.hp_dtype")
    from torchao.float8.config import ScalingGranularity

    weight = torchao_config(precision, emulate=False).cast_config_weight
    if weight.scaling_granularity != ScalingGranularity.TENSORWISE:
        return Float8AllGather(False, f"torchao all-gathers float8 weights only with tensorwise scales, "
                                      f"{precision} scales rows; weights all-gathered in precision.hp_dtype")
    if not fsdp_backend:
        return Float8AllGather(False, "no FSDP2 in this layout (nothing is all-gathered)")
    if not layers:
        return Float8AllGather(False, "no fp8 layers")
    if fsdp_backend == "gloo":
        from trainlab.parallel.fsdp import float8_only_groups

        only = float8_only_groups(model, float8_params={f"{name}.weight" for name in layers})
        if only:
            return Float8AllGather(False, f"gloo has no float8 dtype and FSDP group {only[0]} holds "
                                          "only fp8 weights")
    return Float8AllGather(True)


def convert_torchao(model: nn.Module, precision: str, *, layers: list[str], emulate: bool,
                    all_gather: bool = False) -> dict[str, nn.Module]:
    """Swap the named nn.Linear layers for torchao Float8Linear; returns name -> new module.
    `all_gather`: FSDP2 all-gathers their weights in float8 (decided by `float8_all_gather`)."""
    from torchao.float8 import convert_to_float8_training

    config = torchao_config(precision, emulate=emulate)
    if all_gather:
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
    wanted = set(layers)
    convert_to_float8_training(model, config=config, module_filter_fn=lambda _m, fqn: fqn in wanted)
    converted = {n: m for n, m in model.named_modules() if n in wanted}
    if precision == "fp8_rowwise_gw_hp":
        # its weight gradient is a high-precision matmul of grad_output (autocast dtype) and
        # the saved input; under bf16 autocast with fp32 master weights the input arrives in
        # fp32 and the matmul fails ("expected m1 and m2 to have the same dtype"). Giving the
        # layer its input in the autocast dtype is what autocast would do for nn.Linear.
        for module in converted.values():
            module.register_forward_pre_hook(_cast_input_to_autocast_dtype)
    return converted


def _cast_input_to_autocast_dtype(module: nn.Module, args: tuple) -> tuple | None:
    (x, *rest) = args
    device_type = x.device.type
    if not torch.is_autocast_enabled(device_type):
        return None
    return (x.to(torch.get_autocast_dtype(device_type)), *rest)


def delayed_cast_spec() -> CastSpec:
    return CastSpec(input=E4M3, weight=E4M3, grad_output=E5M2, scaling="delayed")
