"""What a device of each Ray accelerator type offers an estimate: memory, bandwidths, peaks.

    hw = hardware("H100")          # Hardware(memory_gb=80, hbm_gb_s=3350, nvlink_gb_s=450, ...)
    hw.peak_tflops("bf16")         # 989.0: the GPU catalog's peak, the MFU denominator

A GPU's figures come from the one GPU catalog (vocab.gpus), the table MFU's peaks are read
from too, so estimated and measured MFU divide by the same number (Ray's 'H100' does not say SXM
or PCIe: it is read as the SXM part, and the estimate says so in its notes, vocab.gpus.NOTES).
CPU ranks: the host's memory shared by its ranks, and the matmul peak the probe measures on this
machine (telemetry.peak_flops.cpu_probe_peak, one thread per core a rank owns).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from trainlab.vocab.gpus import RAY_TYPES, by_ray_type
from trainlab.vocab.nodes import CPU


@dataclass(frozen=True)
class Hardware:
    """One device type as the estimate uses it."""

    type: str
    """Ray accelerator type (H100, A100, ...) or 'cpu'."""
    label: str
    """The GPU catalog's part it is read as (vocab.gpus.Gpu.label); 'cpu' = probed."""
    memory_gb: float
    """Device memory in GB (1e9 bytes); CPU: the host's."""
    hbm_gb_s: float
    """Memory bandwidth, GB/s (the memory-bound parts: optimizer update, casts)."""
    nvlink_gb_s: float
    """Bandwidth to another device of the node, GB/s per direction (PCIe where no NVLink)."""

    def peak_tflops(self, dtype: str) -> float | None:
        """Dense peak TFLOP/s of one device for `dtype` (fp32, tf32, bf16, fp16, fp8); None = unknown."""
        if self.type == CPU:
            return cpu_peak_tflops(dtype)
        gpu = by_ray_type(self.type)
        return gpu.peak_tflops.get(dtype) if gpu else None


CPU_MEM_GB_S = 20.0
"""A host's memory bandwidth one rank reaches, GB/s (a DDR4/5 channel or two); calibrated."""


def known_types() -> tuple[str, ...]:
    """The device types an estimate knows: the catalog's Ray types with memory figures, and cpu."""
    return (*(t for t in RAY_TYPES if by_ray_type(t).memory_gb is not None), CPU)


def hardware(device_type: str) -> Hardware:
    """The Hardware of a Ray accelerator type or 'cpu'; ValueError naming cluster.nodes otherwise."""
    if device_type == CPU:
        return Hardware(CPU, CPU, host_memory_gb(), CPU_MEM_GB_S, 0.0)
    gpu = by_ray_type(device_type)
    if gpu is None or gpu.memory_gb is None:
        raise ValueError(f"cluster.nodes names GPU type {device_type!r}, which the estimate does not know; "
                         f"use one of {', '.join(known_types())} (Ray accelerator type names)")
    return Hardware(device_type, gpu.label, gpu.memory_gb, gpu.hbm_gb_s, gpu.nvlink_gb_s)


def host_memory_gb() -> float:
    """Physical memory of this machine, GB."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9


def cpu_peak_tflops(dtype: str, *, threads: int = 1) -> float | None:
    """The probed matmul peak of `threads` cores of this machine; FP8 and TF32 have none on CPU."""
    if dtype in ("fp8", "tf32"):
        return None
    # fp16 on CPU runs emulated in fp32 (precision.emulate): its peak is fp32's, as MFU's
    return _probe_single_thread("bf16" if dtype == "bf16" else "fp32") * threads


@functools.cache
def _probe_single_thread(dtype: str) -> float:
    """One core's best matmul TFLOP/s (the probe MFU uses), measured once per process."""
    import torch

    from trainlab.telemetry.peak_flops import cpu_probe_peak

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a rank's cores are its cluster.cpus_per_worker: scale one core's rate
    try:
        return cpu_probe_peak(dtype).flops_per_s / 1e12  # the probe MFU's denominator takes
    finally:
        torch.set_num_threads(threads)
