"""Peak FLOP/s for MFU: a table of known GPUs per dtype, a measured probe on CPU.

An unknown GPU gets no MFU (and a warning), never a guessed peak: a wrong denominator is
worse than a missing number when comparing runs across devices.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch

# Dense (no sparsity) peak TFLOP/s from the vendors' datasheets, per part, keyed by the exact
# names torch.cuda.get_device_name reports for it. Exact, never by substring: "NVIDIA L40"
# contains "L4" and "NVIDIA H100 NVL" contains "H100", and each is a different chip.
# fp32 is the plain FP32 (CUDA core) rate; tf32 is fp32 matmuls on tensor cores
# (precision.tf32, SM 8.0+). A part lacking a dtype's tensor cores has no entry for it.
GPU_PEAK_TFLOPS: tuple[tuple[str, tuple[str, ...], dict[str, float]], ...] = (
    ("H100 SXM", ("NVIDIA H100 80GB HBM3",),
     {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0, "fp8": 1979.0}),
    ("H100 PCIe", ("NVIDIA H100 PCIe",),
     {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0, "fp8": 1513.0}),
    ("H100 NVL", ("NVIDIA H100 NVL",),
     {"bf16": 835.0, "fp16": 835.0, "tf32": 418.0, "fp32": 60.0, "fp8": 1671.0}),
    ("H200", ("NVIDIA H200",),
     {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0, "fp8": 1979.0}),
    ("H200 NVL", ("NVIDIA H200 NVL",),
     {"bf16": 835.0, "fp16": 835.0, "tf32": 418.0, "fp32": 60.0, "fp8": 1671.0}),
    ("A100", ("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB",
              "NVIDIA A100 80GB PCIe"),
     {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("L40S", ("NVIDIA L40S",), {"bf16": 362.0, "fp16": 362.0, "tf32": 183.0, "fp32": 91.6, "fp8": 733.0}),
    ("L40", ("NVIDIA L40",), {"bf16": 181.0, "fp16": 181.0, "tf32": 90.5, "fp32": 90.5, "fp8": 362.0}),
    ("L4", ("NVIDIA L4",), {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3, "fp8": 242.0}),
    ("A10G", ("NVIDIA A10G",), {"bf16": 70.0, "fp16": 70.0, "tf32": 35.0, "fp32": 31.2}),
    ("RTX 4090", ("NVIDIA GeForce RTX 4090",),
     {"bf16": 165.0, "fp16": 165.0, "tf32": 82.6, "fp32": 82.6, "fp8": 330.0}),
    ("V100 SXM2", ("Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB"), {"fp16": 125.0, "fp32": 15.7}),
    ("V100 PCIe", ("Tesla V100-PCIE-16GB", "Tesla V100-PCIE-32GB"), {"fp16": 112.0, "fp32": 14.0}),
    ("T4", ("Tesla T4",), {"fp16": 65.0, "fp32": 8.1}),
)
_BY_NAME = {name: (label, peaks) for label, device_names, peaks in GPU_PEAK_TFLOPS for name in device_names}


@dataclass(frozen=True)
class Peak:
    flops_per_s: float | None
    """Peak FLOP/s of one device for the mode's compute dtype; None = unknown (no MFU)."""
    source: str
    """Where it came from: 'table:<GPU>', 'probe:cpu:<dtype>', or 'unknown:<reason>'."""


def gpu_peak(device_name: str, compute_dtype: str) -> Peak:
    """The table's peak of this exact device name for `compute_dtype` (unknown: no MFU)."""
    if device_name not in _BY_NAME:
        return Peak(None, f"unknown:{device_name} is not in the peak table")
    label, peaks = _BY_NAME[device_name]
    if compute_dtype not in peaks:
        return Peak(None, f"unknown:{label} has no {compute_dtype} peak in the table")
    return Peak(peaks[compute_dtype] * 1e12, f"table:{label}:{compute_dtype}")


def cpu_probe_peak(compute_dtype: str, *, size: int = 512, seconds: float = 0.3) -> Peak:
    """Best matmul FLOP/s this process reaches with its threads, for the mode's dtype.

    fp16 on CPU runs emulated in fp32 (see precision.emulate), so it is probed as fp32. A CPU
    without bf16 instructions runs large bf16 matmuls far slower than fp32 while small ones
    go through fp32 anyway, so the bf16 peak is the better of the bf16 and fp32 probes: MFU
    must never exceed what the hardware can do by any path.
    """
    if compute_dtype == "bf16":
        return max(_probe(torch.bfloat16, size=size, seconds=seconds),
                   _probe(torch.float32, size=size, seconds=seconds), key=lambda p: p.flops_per_s)
    return _probe(torch.float32, size=size, seconds=seconds)


def _probe(dtype: torch.dtype, *, size: int, seconds: float) -> Peak:
    # its own generator: the trial's seeded global RNG must not depend on whether this process
    # probed already (a warm gang's later trials take the probe from _probed_once's cache)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(dtype)
    b = torch.randn(size, size, generator=gen).to(dtype)
    torch.mm(a, b)  # warm up the kernel selection
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        for _ in range(4):
            torch.mm(a, b)
        best = max(best, 4 * 2 * size**3 / (time.perf_counter() - t0))
    return Peak(best, f"probe:cpu:{'bf16' if dtype == torch.bfloat16 else 'fp32'}")


def mean_peak(peaks: list[Peak]) -> Peak:
    """The mean of the ranks' own peaks, so that MFU = model FLOP/s / (world size x mean) divides
    by the sum of the peaks: on a mix of GPU types each device counts at its own peak. Unknown
    on any rank = unknown (no MFU), as for one device."""
    if len(peaks) == 1:
        return peaks[0]
    sources = sorted({p.source for p in peaks})
    if any(not p.flops_per_s for p in peaks):
        return Peak(None, ",".join(s for s in sources if s.startswith("unknown")))
    return Peak(sum(p.flops_per_s for p in peaks) / len(peaks), "+".join(sources))


def device_peak(device: torch.device, compute_dtype: str) -> Peak:
    """Peak of one device for `compute_dtype` (fp32, tf32, fp16, bf16 or fp8: a recipe's peak_dtype).

    CPUs have no FP8 matmul units: their fp8 peak is unknown rather than a made-up number."""
    if device.type == "cuda":
        return gpu_peak(torch.cuda.get_device_name(device), compute_dtype)
    if compute_dtype == "fp8":
        return Peak(None, "unknown:cpu has no FP8 peak")
    return _probed_once(compute_dtype, torch.get_num_threads())


@functools.cache
def _probed_once(compute_dtype: str, threads: int) -> Peak:
    """The CPU probe, once per dtype and thread count in a process: a warm gang's worker runs
    trial after trial on the same cores, and each probe costs its trial 0.3-0.6 s of start."""
    return cpu_probe_peak(compute_dtype)
