"""Memory of this worker, in GB (1e9 bytes), the same kind of number on every layout.

    reset_peak_memory(device)     # at the start of training and after the first (warm-up) step
    peak_memory_gb(device)        # the peak since the last reset
    memory_gb(device)             # allocated / reserved now (CUDA only)

What is measured (`MEMORY_SOURCES`, recorded in a tag):
- CUDA: `torch.cuda.max_memory_allocated`, the caching allocator's peak of live tensors; the
  allocator's reserved memory (what other processes cannot have) is logged beside it.
- CPU (Linux): the process's peak resident set (VmHWM), reset through /proc/self/clear_refs.
  It includes the interpreter and torch's libraries (a few hundred MB, the same for every
  layout), so compare layouts by differences, not ratios. CPU has no allocator statistics:
  no allocated / reserved metrics there rather than numbers that mean something else.
- Elsewhere (no /proc): the peak resident set since the process started (getrusage), which
  cannot be reset; its source says so.

Without the resets the peak would include the build (before meta-device construction, the
whole unsharded fp32 model on every rank) and the first step's one-off allocations, and an
FSDP2 rank would look no smaller than a DDP replica.
"""

from __future__ import annotations

import re
import resource
import sys
from pathlib import Path

import torch

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
MEMORY_SOURCES = {
    "cuda": "cuda:max_memory_allocated since warm-up",
    "cpu": "cpu:peak_rss (VmHWM) since warm-up",
    "cpu_lifetime": "cpu:peak_rss since process start (not resettable here)",
}


def reset_peak_memory(device: torch.device) -> bool:
    """Start a new peak; False where it cannot be reset (the peak is then the process's)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return True
    try:
        _CLEAR_REFS.write_text("5")  # "5": reset the peak resident set size (Linux >= 4.0)
        return True
    except OSError:
        return False


def peak_memory_gb(device: torch.device) -> float:
    """The peak since the last `reset_peak_memory` (module docstring: what it measures)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    kib = _status_kib("VmHWM")
    if kib is not None:
        return kib * 1024 / 1e9
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / (1e9 if sys.platform == "darwin" else 1e6)


def memory_gb(device: torch.device) -> dict[str, float]:
    """Allocated (live tensors) and reserved (held by the caching allocator) GB now, keyed
    "allocated" and "reserved"; {} on CPU, which has no allocator statistics."""
    if device.type != "cuda":
        return {}
    return {"allocated": torch.cuda.memory_allocated(device) / 1e9,
            "reserved": torch.cuda.memory_reserved(device) / 1e9}


def memory_source(device: torch.device) -> str:
    """What `peak_memory_gb` measures on `device` (a tag's value)."""
    if device.type == "cuda":
        return MEMORY_SOURCES["cuda"]
    return MEMORY_SOURCES["cpu" if _status_kib("VmHWM") is not None and _CLEAR_REFS.exists()
                          else "cpu_lifetime"]


def rss_gb() -> float | None:
    """This process's resident set now (Linux), GB; None without /proc."""
    kib = _status_kib("VmRSS")
    return None if kib is None else kib * 1024 / 1e9


def _status_kib(field: str) -> int | None:
    try:
        match = re.search(rf"^{field}:\s+(\d+) kB", _STATUS.read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) if match else None


__all__ = ["MEMORY_SOURCES", "memory_gb", "memory_source", "peak_memory_gb", "reset_peak_memory", "rss_gb"]
