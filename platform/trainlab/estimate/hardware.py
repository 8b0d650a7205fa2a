"""What a device of each Ray accelerator type offers an estimate: memory, bandwidths, peaks.

    hw = hardware("H100")          # Hardware(memory_gb=80, hbm_gb_s=3350, nvlink_gb_s=450, ...)
    hw.peak_tflops("bf16")         # 989.0: telemetry.peak_flops's table, the MFU denominator

Peaks are never copied here: each Ray type names the row of telemetry.peak_flops.GPU_PEAK_TFLOPS
it stands for (Ray's 'H100' does not say SXM or PCIe: it is read as the SXM part, and the
estimate says so in its notes), so estimated and measured MFU divide by the same number.
Memory and bandwidths are the vendors' datasheet figures for that part. NVLink is per GPU and
per direction (half the "bidirectional" figure datasheets print); a part without NVLink talks
over PCIe. CPU ranks: the host's memory shared by its ranks, and the matmul peak the probe
measures on this machine (telemetry.peak_flops.cpu_probe_peak, one thread per core a rank owns).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from trainlab.telemetry.peak_flops import GPU_PEAK_TFLOPS
from trainlab.vocab.nodes import CPU


@dataclass(frozen=True)
class Hardware:
    """One device type as the estimate uses it."""

    type: str
    """Ray accelerator type (H100, A100, ...) or 'cpu'."""
    label: str
    """The row of the MFU peak table it reads ('' = none: unknown peaks); 'cpu' = probed."""
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
        return _TABLE.get(self.label, {}).get(dtype)


_TABLE = {label: peaks for label, _, peaks in GPU_PEAK_TFLOPS}

# Ray accelerator type -> (peak-table row, memory GB, HBM GB/s, NVLink GB/s per direction).
# Datasheets: H100 SXM5 80 GB HBM3 3.35 TB/s, NVLink 4 900 GB/s bidirectional; H200 141 GB
# 4.8 TB/s, NVLink 900; A100 SXM 80 GB 2.04 TB/s (40 GB 1.56), NVLink 3 600; V100 SXM2 16 GB
# 900 GB/s, NVLink 2 300; L40S 48 GB 864 GB/s, L4 24 GB 300 GB/s, A10G 24 GB 600 GB/s, T4 16 GB
# 320 GB/s: PCIe only (Gen4 x16 32 GB/s, T4 Gen3 16 GB/s).
_CATALOG: dict[str, tuple[str, float, float, float]] = {
    "H100": ("H100 SXM", 80.0, 3350.0, 450.0),
    "H200": ("H200", 141.0, 4800.0, 450.0),
    "A100": ("A100", 80.0, 2039.0, 300.0),
    "A100-80G": ("A100", 80.0, 2039.0, 300.0),
    "A100-40G": ("A100", 40.0, 1555.0, 300.0),
    "V100": ("V100 SXM2", 16.0, 900.0, 150.0),
    "L40S": ("L40S", 48.0, 864.0, 32.0),
    "L4": ("L4", 24.0, 300.0, 32.0),
    "A10G": ("A10G", 24.0, 600.0, 32.0),
    "T4": ("T4", 16.0, 320.0, 16.0),
}
for _label, *_ in _CATALOG.values():  # a renamed table row must fail at import, not estimate unknown
    assert _label in _TABLE, f"{_label} is not a row of telemetry.peak_flops.GPU_PEAK_TFLOPS"

NOTES = {"H100": "H100 read as the H100 SXM (80 GB HBM3); a PCIe or NVL part is slower",
         "A100": "A100 read as the A100 SXM 80 GB",
         "V100": "V100 read as the V100 SXM2 16 GB"}
"""What an estimate assumes about a Ray type that names more than one part."""

CPU_MEM_GB_S = 20.0
"""A host's memory bandwidth one rank reaches, GB/s (a DDR4/5 channel or two); calibrated."""


def known_types() -> tuple[str, ...]:
    return (*_CATALOG, CPU)


def hardware(device_type: str) -> Hardware:
    """The Hardware of a Ray accelerator type or 'cpu'; ValueError naming cluster.nodes otherwise."""
    if device_type == CPU:
        return Hardware(CPU, CPU, host_memory_gb(), CPU_MEM_GB_S, 0.0)
    if device_type not in _CATALOG:
        raise ValueError(f"cluster.nodes names GPU type {device_type!r}, which the estimate does not know; "
                         f"use one of {', '.join(known_types())} (Ray accelerator type names)")
    label, memory_gb, hbm, nvlink = _CATALOG[device_type]
    return Hardware(device_type, label, memory_gb, hbm, nvlink)


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
        return cpu_probe_peak(dtype, size=256, seconds=0.2).flops_per_s / 1e12
    finally:
        torch.set_num_threads(threads)
