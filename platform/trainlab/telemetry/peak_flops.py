"""Peak FLOP/s for MFU: the GPU catalog's peaks per dtype (vocab.gpus), a measured probe on CPU.

An unknown GPU gets no MFU (and a warning), never a guessed peak: a wrong denominator is
worse than a missing number when comparing runs across devices.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch

from trainlab.vocab.gpus import by_device_name


@dataclass(frozen=True)
class Peak:
    flops_per_s: float | None
    """Peak FLOP/s of one device for the mode's compute dtype; None = unknown (no MFU)."""
    source: str
    """Where it came from: 'table:<GPU>', 'probe:cpu:<dtype>', or 'unknown:<reason>'."""


def gpu_peak(device_name: str, compute_dtype: str) -> Peak:
    """The catalog's peak of this exact device name for `compute_dtype` (unknown: no MFU)."""
    gpu = by_device_name(device_name)
    if gpu is None:
        return Peak(None, f"unknown:{device_name} is not in the peak table")
    if compute_dtype not in gpu.peak_tflops:
        return Peak(None, f"unknown:{gpu.label} has no {compute_dtype} peak in the table")
    return Peak(gpu.peak_tflops[compute_dtype] * 1e12, f"table:{gpu.label}:{compute_dtype}")


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
    # the best single matmul (a few ms): a gang's ranks probe together while Ray and the other
    # ranks start, and on a shared core a longer window is often cut by another process (4 matmuls
    # per window measured 57-102 GFLOP/s beside 3 busy processes on this 2-core machine, where
    # one per window gives 99-103, its rate when idle), which made CPU MFU read over 100 %
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = max(best, 2 * size**3 / (time.perf_counter() - t0))
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
