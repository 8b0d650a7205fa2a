"""What one trial leaves behind in a worker process, undone before the next trial of a warm gang.

A warm gang (launch.gang_pool) runs trial after trial in the same worker processes. Each trial
seeds its own RNGs and builds its own model, optimizer and data, but some state is process-wide:
torch's flags (deterministic algorithms, cuDNN, TF32, threads), environment variables a trial
sets, dynamo's caches, the process groups and DeviceMeshes its layout made (held by DTensor's
caches), the caching allocator's memory. GangState captures that state once, when the gang
starts, and after_trial() puts it back; fresh_gang_reason() (on the driver) names what cannot
be put back, so that such a trial gets a gang of its own.

This is the minimal contract the gang loop needs; helper `isolation` (issue 17) owns the full
version and its engine-level proof.
"""

from __future__ import annotations

import gc
import os
import sys
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from trainlab.config import RunConfig


@dataclass
class GangState:
    """One per worker process: the process-wide state as it was before the gang's first trial."""

    env: dict[str, str] = field(default_factory=dict)
    num_threads: int = 1
    deterministic: bool = False
    cudnn_deterministic: bool = False
    cudnn_benchmark: bool = False
    matmul_tf32: bool = False
    cudnn_tf32: bool = True
    float32_matmul_precision: str = "highest"

    @classmethod
    def capture(cls) -> GangState:
        """At the gang's start, before its first trial."""
        return cls(env=dict(os.environ), num_threads=torch.get_num_threads(),
                   deterministic=torch.are_deterministic_algorithms_enabled(),
                   cudnn_deterministic=torch.backends.cudnn.deterministic,
                   cudnn_benchmark=torch.backends.cudnn.benchmark,
                   matmul_tf32=torch.backends.cuda.matmul.allow_tf32,
                   cudnn_tf32=torch.backends.cudnn.allow_tf32,
                   float32_matmul_precision=torch.get_float32_matmul_precision())

    def after_trial(self) -> None:
        """Restore what a trial changed: flags, env, dynamo, groups, memory. Every rank calls it
        at the same point (no collective: destroying a group is local)."""
        for k in [k for k in os.environ if k not in self.env]:  # key by key: other threads read it
            del os.environ[k]
        os.environ.update({k: v for k, v in self.env.items() if os.environ.get(k) != v})
        torch.set_num_threads(self.num_threads)
        torch.use_deterministic_algorithms(self.deterministic)
        torch.backends.cudnn.deterministic = self.cudnn_deterministic
        torch.backends.cudnn.benchmark = self.cudnn_benchmark
        torch.backends.cuda.matmul.allow_tf32 = self.matmul_tf32
        torch.backends.cudnn.allow_tf32 = self.cudnn_tf32
        torch.set_float32_matmul_precision(self.float32_matmul_precision)
        if "torch._dynamo" in sys.modules:  # imported by a trial that compiled
            torch._dynamo.reset()
        destroy_trial_groups()
        gc.collect()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()


def destroy_trial_groups() -> None:
    """Destroy every process group but the gang's world group, after emptying DTensor's caches
    (they hold the DeviceMeshes, which hold the groups): the next trial's mesh and sub-groups
    are made afresh, on every rank in the same order."""
    from trainlab.engine.distributed import _clear_dtensor_caches

    _clear_dtensor_caches()
    if not dist.is_initialized():
        return
    from torch.distributed.distributed_c10d import _world

    world = dist.group.WORLD
    for pg in list(_world.pg_map):
        if pg is not world:
            dist.destroy_process_group(pg)


def fresh_gang_reason(*, ran: list[RunConfig], run: RunConfig, device: str) -> str:
    """On the driver: "" if `run` may follow the trials `ran` on the same warm gang, else why not."""
    if device == "cuda" and run.train.deterministic and any(not r.train.deterministic for r in ran):
        # cuBLAS reads CUBLAS_WORKSPACE_CONFIG once, when the first CUDA matmul made its handle
        return "train.deterministic=true after a non-deterministic CUDA trial (cuBLAS's workspace is set)"
    return ""
