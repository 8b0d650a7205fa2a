"""FP8 linears: torchao's Float8Linear (current scaling) and the project's delayed scaling.

torchao is imported only when an fp8 mode is asked for: its import prints warnings about
GPU kernels a CPU build lacks, and every other mode must not pay for it.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from trainlab.precision.formats import FloatFormat, parse_format
from trainlab.precision.policy import CastSpec
from trainlab.precision.spec import spec_of

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


def convert_torchao(model: nn.Module, precision: str, *, layers: list[str], emulate: bool) -> dict[str, nn.Module]:
    """Swap the named nn.Linear layers for torchao Float8Linear; returns name -> new module."""
    from torchao.float8 import convert_to_float8_training

    config = torchao_config(precision, emulate=emulate)
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
