"""train.deterministic: the process-wide switches that make kernels reproducible.

What it fixes: torch.use_deterministic_algorithms (an op without a deterministic kernel raises
instead of running a racy one), cuDNN's deterministic algorithms with autotuning off (the
autotuner may pick another algorithm on another run), and CUBLAS_WORKSPACE_CONFIG=:4096:8,
which cuBLAS reads when it creates its handle: it must be in the environment before the first
CUDA matmul (run_trial sets it before the process group and the model exist).

What it does not fix: the order in which collectives sum across ranks. With DDP the gradient
buckets get a fixed rank-order sum (parallel.ordered_reduce); other layouts keep the backend's
order (config.validate.unordered_reductions names them and the run warns).
"""

from __future__ import annotations

import os

import torch

CUBLAS_WORKSPACE = ":4096:8"


def set_deterministic(enabled: bool) -> None:
    """Turn the deterministic switches on, or back to torch's defaults (they are process-wide:
    a later trial in the same process must not inherit them)."""
    if enabled:
        # an explicit setting by the user (e.g. the smaller :16:8) is kept
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(enabled)
    torch.backends.cudnn.deterministic = enabled
    torch.backends.cudnn.benchmark = False  # torch's default too: autotuning is never reproducible
