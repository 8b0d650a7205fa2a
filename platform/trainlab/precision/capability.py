"""Which precision each device can run, as data (checked before any worker starts)."""

from __future__ import annotations

from trainlab.config.schema import FP8_PRECISIONS, PrecisionConfig

FP8_TENSOR_CORES = (8, 9)
"""Ada (SM 8.9) and Hopper (9.0) are the first GPUs with FP8 tensor cores."""

# minimum CUDA compute capability (major, minor) per precision mode, run natively
MIN_CUDA_CAPABILITY: dict[str, tuple[int, int]] = {
    "fp32": (0, 0),
    "fp16": (5, 3),   # native half arithmetic; any GPU a current torch supports
    "bf16": (8, 0),   # Ampere and newer
    "bf16_pure": (8, 0),
    "fp8_tensorwise": FP8_TENSOR_CORES,
    "fp8_rowwise": FP8_TENSOR_CORES,
    "fp8_rowwise_gw_hp": FP8_TENSOR_CORES,
    "fp8_delayed": FP8_TENSOR_CORES,
    "emulated": (0, 0),  # fake-quantized casts, matmuls in precision.hp_dtype (see below)
}

# emulated casts (precision=emulated, or an fp8 mode with precision.fp8_impl=emulated) run on
# any GPU; their matmuls need what precision.hp_dtype needs
HP_DTYPE_MIN_CUDA_CAPABILITY = {"bf16": MIN_CUDA_CAPABILITY["bf16"], "fp32": (0, 0)}

# CPU: every mode runs (fp16 by default as faithful emulation, fp8 with real float8 casts
# and torch._scaled_mm on CPU: slow, but the numerics are those of the GPU recipe)
CPU_PRECISIONS = frozenset(MIN_CUDA_CAPABILITY)


def check_precision_supported(precision: str, *, device: str,
                              capability: tuple[int, int] | None = None,
                              device_name: str = "", emulated: bool = False,
                              hp_dtype: str = "bf16") -> None:
    """Raise ValueError naming the precision, the device and the fix if it cannot run there.

    `emulated`: the fp8 mode was asked to run emulated (precision.fp8_impl=emulated);
    `hp_dtype`: precision.hp_dtype, what the matmuls of emulated casts run in.
    """
    if device == "cpu":
        if precision not in CPU_PRECISIONS:
            raise ValueError(f"precision={precision} does not run on CPU; choose one of "
                             f"{', '.join(sorted(CPU_PRECISIONS))}")
        return
    need = MIN_CUDA_CAPABILITY.get(precision)
    if need is None:
        raise ValueError(f"precision={precision} has no known CUDA capability requirement")
    fp8 = precision in FP8_PRECISIONS
    if (fp8 and emulated) or precision == "emulated":
        need = HP_DTYPE_MIN_CUDA_CAPABILITY[hp_dtype]
    if capability is None or tuple(capability) >= need:
        return
    gpu = f"{device_name or 'this GPU'} is {capability[0]}.{capability[1]}"
    if fp8 and not emulated:
        raise ValueError(
            f"precision={precision} needs FP8 tensor cores (compute capability "
            f"{need[0]}.{need[1]}+, Ada or Hopper), but {gpu}; add precision.fp8_impl=emulated "
            "to study the FP8 numerics with high-precision matmuls (no speedup), or use "
            "precision=bf16"
        )
    if need == HP_DTYPE_MIN_CUDA_CAPABILITY["bf16"] and (emulated or precision == "emulated"):
        fix = "add precision.hp_dtype=fp32 (emulated casts, fp32 matmuls)"
    else:
        fix = "use precision=fp16 (with loss scaling) or precision=fp32 on this GPU"
    raise ValueError(
        f"precision={precision} needs a GPU of compute capability {need[0]}.{need[1]} or "
        f"newer, but {gpu}; {fix}"
    )


def check_precision_on_gpu(cfg: PrecisionConfig, *, capability: tuple[int, int], device_name: str) -> None:
    """check_precision_supported for a precision config on a CUDA GPU: the one call the driver's
    preflight and each GPU worker make, so both read the same config fields."""
    check_precision_supported(cfg.name, device="cuda", capability=capability, device_name=device_name,
                              emulated=cfg.fp8_impl == "emulated", hp_dtype=cfg.hp_dtype)
