"""Which precision each device can run, from the modes' specifications (vocab.precision);
checked before any worker starts, and again on each GPU worker."""

from __future__ import annotations

import functools

from trainlab.vocab.precision import FP8_TENSOR_CORES, SPECS, emulates, spec_of

MIN_CUDA_CAPABILITY: dict[str, tuple[int, int]] = {n: s.min_capability for n, s in SPECS.items()}
"""Minimum CUDA compute capability (major, minor) per precision mode, run natively."""

# CPU: every mode runs (fp16 by default as faithful emulation, fp8 with real float8 casts
# and torch._scaled_mm on CPU: slow, but the numerics are those of the GPU recipe), the
# rowwise ones natively only where torch's CPU _scaled_mm takes rowwise scales
CPU_PRECISIONS = frozenset(SPECS)

__all__ = ["CPU_PRECISIONS", "FP8_TENSOR_CORES", "MIN_CUDA_CAPABILITY", "check_precision_on_gpu",
           "check_precision_supported", "cpu_lacks_native", "cpu_rowwise_scaled_mm"]


@functools.cache
def cpu_rowwise_scaled_mm() -> bool:
    """Whether this torch's torch._scaled_mm on CPU takes rowwise scales (one per row of A,
    one per column of B), which torchao's rowwise recipes call: 2.13 does; 2.11 fails an
    internal assert ("_scaled_mm only supports per-tensor scaling for CPU backend"). Tried once
    per process on a 16 x 32 x 16 product."""
    import torch

    a = torch.zeros(16, 32, dtype=torch.float8_e4m3fn)
    b = torch.zeros(16, 32, dtype=torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
    try:
        torch._scaled_mm(a, b, scale_a=torch.ones(16, 1), scale_b=torch.ones(1, 16),
                         out_dtype=torch.bfloat16)
    except RuntimeError:
        return False
    return True


def cpu_lacks_native(precision: str, *, emulated: bool) -> bool:
    """A rowwise FP8 mode run natively (not precision.fp8_impl=emulated) on a CPU whose
    torch._scaled_mm has no rowwise scales: refused by check_precision_supported."""
    return spec_of(precision).torchao_recipe.startswith("rowwise") and not emulated and not cpu_rowwise_scaled_mm()


def check_precision_supported(precision: str, *, device: str,
                              capability: tuple[int, int] | None = None,
                              device_name: str = "", emulated: bool = False,
                              hp_dtype: str = "bf16") -> None:
    """Raise ValueError naming the precision, the device and the fix if it cannot run there.

    `emulated`: the fp8 mode was asked to run emulated (precision.fp8_impl=emulated);
    `hp_dtype`: precision.hp_dtype, what the matmuls of emulated casts run in.
    """
    spec = spec_of(precision)
    if device == "cpu":
        if precision not in CPU_PRECISIONS:
            raise ValueError(f"precision={precision} does not run on CPU; choose one of "
                             f"{', '.join(sorted(CPU_PRECISIONS))}")
        if cpu_lacks_native(precision, emulated=emulated):
            import torch

            raise ValueError(
                f"precision={precision} runs its FP8 matmuls natively on CPU with rowwise scales, "
                f"which torch._scaled_mm on CPU lacks in torch {torch.__version__} (2.13 has them); "
                "add precision.fp8_impl=emulated (the same casts, matmuls in precision.hp_dtype), "
                "use precision=fp8_tensorwise, or install torch 2.13")
        return
    emulated = emulated and spec.fp8
    need = spec.needs_capability(hp_dtype=hp_dtype, emulated=emulated)
    if capability is None or tuple(capability) >= need:
        return
    gpu = f"{device_name or 'this GPU'} is {capability[0]}.{capability[1]}"
    if spec.fp8 and not emulated and tuple(capability) >= spec.min_capability:
        raise ValueError(
            f"precision={precision} with precision.hp_dtype={hp_dtype} needs compute capability "
            f"{need[0]}.{need[1]}+ (its rowwise-scaled FP8 matmuls with an fp32 output exist in "
            f"cuBLAS for Hopper only), but {gpu}; use precision.hp_dtype=bf16, or "
            "precision=fp8_tensorwise")
    if spec.fp8 and not emulated:
        raise ValueError(
            f"precision={precision} needs FP8 tensor cores (compute capability "
            f"{need[0]}.{need[1]}+, Ada or Hopper), but {gpu}; add precision.fp8_impl=emulated "
            "to study the FP8 numerics with high-precision matmuls (no speedup), or use "
            "precision=bf16"
        )
    if emulated or spec.emulation and spec.compute_dtype == "hp":
        fix = "add precision.hp_dtype=fp32 (emulated casts, fp32 matmuls)"
    else:
        fix = "use precision=fp16 (with loss scaling) or precision=fp32 on this GPU"
    raise ValueError(
        f"precision={precision} needs a GPU of compute capability {need[0]}.{need[1]} or "
        f"newer, but {gpu}; {fix}"
    )


def check_precision_on_gpu(cfg, *, capability: tuple[int, int], device_name: str) -> None:
    """check_precision_supported for a precision config on a CUDA GPU: the one call the driver's
    preflight and each GPU worker make, so both read the same config fields."""
    check_precision_supported(cfg.name, device="cuda", capability=capability, device_name=device_name,
                              emulated=emulates(cfg, device_type="cuda"), hp_dtype=cfg.hp_dtype)
