"""Peak memory of this worker, in GB: device memory on GPU, resident set on CPU."""

from __future__ import annotations

import resource
import sys

import torch


def peak_memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / (1e9 if sys.platform == "darwin" else 1e6)
