"""Which precision each device can run, as data (checked before any worker starts)."""

from __future__ import annotations

# minimum CUDA compute capability (major, minor) per precision mode
MIN_CUDA_CAPABILITY: dict[str, tuple[int, int]] = {
    "fp32": (0, 0),
    "fp16": (5, 3),   # native half arithmetic; any GPU a current torch supports
    "bf16": (8, 0),   # Ampere and newer
    "bf16_pure": (8, 0),
}

# CPU: every mode runs (fp16 by default as faithful emulation, see precision.emulate)
CPU_PRECISIONS = frozenset(MIN_CUDA_CAPABILITY)


def check_precision_supported(precision: str, *, device: str,
                              capability: tuple[int, int] | None = None,
                              device_name: str = "") -> None:
    """Raise ValueError naming the precision, the device and the fix if it cannot run there."""
    if device == "cpu":
        if precision not in CPU_PRECISIONS:
            raise ValueError(f"precision={precision} does not run on CPU; choose one of "
                             f"{', '.join(sorted(CPU_PRECISIONS))}")
        return
    need = MIN_CUDA_CAPABILITY.get(precision)
    if need is None:
        raise ValueError(f"precision={precision} has no known CUDA capability requirement")
    if capability is not None and tuple(capability) < need:
        raise ValueError(
            f"precision={precision} needs a GPU of compute capability {need[0]}.{need[1]} or "
            f"newer, but {device_name or 'this GPU'} is {capability[0]}.{capability[1]}; "
            "use precision=fp16 (with loss scaling) or precision=fp32 on this GPU"
        )
