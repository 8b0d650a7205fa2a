"""Process-group setup that works the same under Ray Train, torchrun, or a single process,
and the few collectives the layers share (mean over ranks, gathering strings).

It depends on torch (and trainlab.devices, which imports nothing) and sits below every layer
that uses it (parallel, telemetry, the engine, the launcher, benches): layers only call downward.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from trainlab.devices import resolve_device


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0


def backend_for(device: str) -> str:
    """The torch.distributed backend for a device type: NCCL on CUDA, gloo on CPU."""
    return "nccl" if device == "cuda" else "gloo"


def setup_distributed(device: str, *, local_rank: int | None = None) -> DistInfo:
    """Join the process group this process was started in.

    Ray Train has already initialised it; torchrun leaves WORLD_SIZE/RANK in the
    environment for us to initialise (NCCL on GPU, gloo on CPU), a group of one included,
    so that a 1-GPU torchrun run goes through NCCL as a multi-GPU one does; otherwise one
    process without a group.
    """
    device = resolve_device(device, gpus=torch.cuda.is_available())  # a trial's plan resolved it already
    torchrun = "TORCHELASTIC_RUN_ID" in os.environ
    if not dist.is_initialized() and (torchrun or int(os.environ.get("WORLD_SIZE", "1")) > 1):
        dist.init_process_group(backend=backend_for(device))
    if dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "cuda":
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        dev = torch.device("cuda", torch.cuda.current_device())
    else:
        dev = torch.device("cpu")
    return DistInfo(rank=rank, world_size=world, local_rank=local_rank, device=dev)


def process_group_backend() -> str:
    """The backend of this process's group (nccl, gloo), or 'none' when it has none."""
    return str(dist.get_backend()) if dist.is_initialized() else "none"


def all_reduce_mean(values: list[float], *, device: torch.device) -> list[float]:
    """Mean of each value over all ranks (identity in a single process)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return (t / dist.get_world_size()).tolist()


def mean_over_ranks(value: torch.Tensor) -> torch.Tensor:
    """all_reduce_mean of a tensor, left where it is (no host sync on a GPU): the sum over
    all ranks divided by the world size (the input itself in a single process)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    total = value.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total / dist.get_world_size()


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return f"cpu ({platform.machine()})"


def gather_strings(value: str) -> list[str]:
    """`value` of every rank, in rank order (a list of one in a single process).

    For rare events only (it pickles): e.g. which tensor went non-finite on each rank."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [value]
    out: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return [v or "" for v in out]


def close_distributed(*, barrier: bool = True) -> None:
    """Leave the process group so that none of its backend threads outlives the interpreter.

    destroy_process_group() alone can leave a group alive: DTensor's sharding-propagation and
    redistribute-planner caches hold every DeviceMesh a layout used (FSDP2, TP), and a mesh
    holds its groups. Their gloo worker threads then run into interpreter finalization, where
    a worker that drops a finished collective's tensors must take the GIL, is ended by
    pthread_exit through a noexcept frame, and the process aborts after its work is done:
    "terminate called without an active exception", exit -6 (core dumps: ~AsyncAllgatherWork
    in ProcessGroupGloo::runLoop during Py_FinalizeEx). With the caches cleared and the group
    destroyed, its last reference goes now and its destructor joins those threads while the
    interpreter still runs. Call it once the trial's objects are gone; no collective after it.
    `barrier=False` on a path where a peer may already have failed (the barrier would wait).
    """
    import gc

    if not dist.is_initialized():
        return
    if barrier:
        dist.barrier()  # no rank tears down a group another rank is still using
    clear_dtensor_caches()
    dist.destroy_process_group()
    gc.collect()


def clear_dtensor_caches() -> None:
    """Empty every cache of torch.distributed.tensor that may hold a DeviceMesh: the C++ and
    Python sharding-propagation caches, the redistribute planners, and each functools cache of
    its modules (MeshTopoInfo.build_from_mesh among them). Before a group goes: at the end
    (close_distributed) and between the trials of a warm gang (engine.isolation)."""
    import sys

    if "torch.distributed.tensor._api" not in sys.modules:
        return  # no DTensor was made in this process: nothing cached
    # Not torch.distributed.tensor.debug._clear_sharding_prop_cache, which makes the same two
    # calls: importing that module imports torch._dynamo and through it
    # torch.distributed.nn.functional, whose functions default to group=group.WORLD, evaluated
    # at import. Imported while a group exists (here, always), they hold the group past
    # destroy_process_group, gloo threads and all (measured on torch 2.11 and 2.13 where
    # nothing had imported them before the group).
    try:  # private torch API (2.11, 2.13): without it a group may outlive the run
        from torch.distributed.tensor._api import DTensor
        from torch.distributed.tensor._redistribute import clear_redistribute_planner_cache

        clear_python_cache = DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear
        clear_cpp_cache = torch._C._clear_DTensor_sharding_propagator_cache
    except (ImportError, AttributeError):
        return
    clear_python_cache()
    clear_cpp_cache()
    clear_redistribute_planner_cache()
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("torch.distributed.tensor"):
            continue
        for value in list(vars(module).values()):
            members = list(vars(value).values()) if isinstance(value, type) else [value]
            for member in members:
                clear = getattr(getattr(member, "__func__", member), "cache_clear", None)
                if callable(clear):
                    clear()
