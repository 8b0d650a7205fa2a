"""Sharded data parallel: FSDP2 (ZeRO-3, ZeRO-2-like, HSDP) and ZeRO-1.

    model = apply_fsdp(model, mesh=mesh["dp_shard"])                          # ZeRO-3
    model = apply_fsdp(model, mesh=mesh["dp_shard"], reshard_after_forward=False)   # ZeRO-2-like
    model = apply_fsdp(model, mesh=mesh["dp_replicate", "dp_shard"])          # HSDP
    optimizer = apply_zero1(torch.optim.AdamW, groups, lr=...)                # ZeRO-1 (with DDP)
    (parallelize() hands apply_zero1 to the optimizer builder as Parallelized.make_optimizer)
    tracker.log_metrics(sharded_bytes(model, optimizer), ...)                 # per-rank memory

What each shards, per rank, with dp ranks:
- ZeRO-1: optimizer states (~1/dp); parameters and gradients replicated (DDP all-reduce).
- ZeRO-2-like (`reshard_after_forward=False`): parameters, gradients and states are stored
  sharded, but a block's gathered parameters stay alive from its forward to its backward, so
  backward needs no second all-gather. FSDP2 has no "shard only gradients" mode; this is the
  form with ZeRO-2's communication (one all-gather + one reduce-scatter per block and step).
- ZeRO-3 (`reshard_after_forward=True`): everything ~1/dp; blocks re-gathered in backward.
- HSDP (2-D mesh ("dp_replicate", "dp_shard")): ZeRO-3 within a dp_shard group, gradients
  all-reduced across the dp_replicate groups.

Facts of torch 2.13 (CPU build, gloo) that this module relies on, checked by
tests/distributed/test_fsdp.py:
- fully_shard works on CPU over gloo for 1-D and 2-D meshes; sharded parameters, their
  gradients and AdamW's exp_avg / exp_avg_sq are DTensors (Shard(0)); AdamW's `step` is a
  plain scalar tensor.
- torch.nn.utils.get_total_norm over DTensor gradients returns a replicated DTensor that
  already holds the global norm (`float(norm)` works); clip_grads_with_norm_ accepts it. The
  trainer's clipping code runs unchanged.
- ZeroRedundancyOptimizer takes parameter groups (our decay / no-decay pair) and LambdaLR:
  it copies each group's lr to its local optimizer on every step.
- FP8 (torchao 0.18 Float8Linear) under FSDP2 on gloo. gloo has no float8 dtype: an
  all-gather of float8 tensors fails in ProcessGroupGloo with
  "RuntimeError: Invalid scalar type". Without fp8 all-gather
  (`enable_fsdp_float8_all_gather=False`, torchao's default) FSDP2 gathers the high-precision
  weights and every layout works. With it, FSDP2 gathers each group's inputs in one flat
  buffer of their common dtype and falls back to a uint8 byte view when the dtypes differ
  (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py). The grouping here (one group
  per block, one for the root) always puts fp32 RMSNorm weights next to the fp8 weights, so
  the buffer is uint8 and fp8 all-gather works on gloo too. Only a group whose every
  parameter gathers in fp8 (e.g. sharding a lone Float8Linear) fails; `apply_fsdp` refuses
  such a group with a ValueError before the first step instead of failing inside it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor

HSDP_DIM_NAMES = ("dp_replicate", "dp_shard")


# ---------------------------------------------------------------------------------------
def apply_fsdp(model: nn.Module, *, mesh: DeviceMesh, reshard_after_forward: bool = True,
               param_dtype: torch.dtype | None = None,
               reduce_dtype: torch.dtype | None = None) -> nn.Module:
    """Shard `model` with FSDP2 over `mesh`: one group per block of `model.layers`, then the
    root (embedding, final norm, output head), torchtitan's order. Returns the model, now an
    FSDPModule whose parameters are DTensors (build the optimizer after this call).

    mesh: 1-D = FSDP over all its ranks; 2-D named ("dp_replicate", "dp_shard") = HSDP.
    reshard_after_forward: True = ZeRO-3, False = the ZeRO-2-like form (module docstring).
    param_dtype / reduce_dtype: FSDP2's MixedPrecisionPolicy (compute and all-gather dtype;
    gradient reduction dtype); None for both = the parameters' own dtype throughout.
    """
    if mesh.ndim not in (1, 2):
        raise ValueError(f"apply_fsdp: mesh has {mesh.ndim} dims; pass the 1-D dp_shard "
                         f"sub-mesh or the 2-D {HSDP_DIM_NAMES} one")
    if mesh.ndim == 2 and tuple(mesh.mesh_dim_names or ()) != HSDP_DIM_NAMES:
        raise ValueError(
            f"apply_fsdp: a 2-D mesh means HSDP and must be named {HSDP_DIM_NAMES}, got "
            f"{mesh.mesh_dim_names}; pass the data-parallel sub-mesh, e.g. mesh['dp_shard'] "
            f"or mesh[{HSDP_DIM_NAMES}]")
    kwargs: dict[str, Any] = {"mesh": mesh}
    if param_dtype is not None or reduce_dtype is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    no_fp8_comm = _backend_lacks_float8(mesh)

    blocks = list(getattr(model, "layers", ()))
    for i, block in enumerate(blocks):
        if no_fp8_comm:
            _refuse_fp8_only_group(block, name=f"layers.{i}", mesh=mesh)
        # the last block's parameters would be gathered again at once: backward starts there
        fully_shard(block, reshard_after_forward=reshard_after_forward and i < len(blocks) - 1,
                    **kwargs)
    if no_fp8_comm:
        _refuse_fp8_only_group(model, name="<root>", mesh=mesh, skip=blocks)
    # the root's parameters (output head first) are the first ones backward needs
    fully_shard(model, reshard_after_forward=False, **kwargs)
    return model


def float8_only_groups(model: nn.Module, *, float8_params: set[str]) -> list[str]:
    """The groups `apply_fsdp` would make of `model` (one per block of `model.layers`, then the
    root with the rest) whose every parameter is in `float8_params` (names as in
    model.named_parameters()): what gloo could not all-gather with float8 all-gather on."""
    groups: dict[str, list[str]] = {f"layers.{i}": [] for i in range(len(getattr(model, "layers", ())))}
    groups["<root>"] = []
    for name, _ in model.named_parameters():
        block = ".".join(name.split(".")[:2])
        groups[block if block in groups else "<root>"].append(name)
    return [group for group, params in groups.items() if params and set(params) <= float8_params]


def _backend_lacks_float8(mesh: DeviceMesh) -> bool:
    """True where the mesh's collectives run on gloo (no float8 dtype)."""
    for dim in range(mesh.ndim):
        backend = str(dist.get_backend(mesh.get_group(dim)))
        if backend == "gloo" or f"{mesh.device_type}:gloo" in backend:
            return True
    return False


def _gathers_in_fp8(param: torch.Tensor) -> bool:
    """A torchao Float8Linear weight with fp8 all-gather on (enable_fsdp_float8_all_gather)."""
    fsdp_utils = sys.modules.get("torchao.float8.fsdp_utils")  # absent = torchao never used
    return fsdp_utils is not None and isinstance(param, fsdp_utils.WeightWithDynamicFloat8CastTensor)


def _refuse_fp8_only_group(module: nn.Module, *, name: str, mesh: DeviceMesh,
                           skip: Sequence[nn.Module] = ()) -> None:
    skipped = {id(p) for m in skip for p in m.parameters()}
    params = [p for p in module.parameters() if id(p) not in skipped]
    if params and all(_gathers_in_fp8(p) for p in params):
        raise ValueError(
            f"apply_fsdp: every parameter of FSDP group '{name}' is all-gathered in float8, "
            f"which gloo (mesh device '{mesh.device_type}') cannot communicate; turn fp8 "
            f"all-gather off (torchao Float8LinearConfig enable_fsdp_float8_all_gather=False) "
            f"or run on NCCL")


# ---------------------------------------------------------------------------------------
def apply_zero1(optimizer_cls: type[torch.optim.Optimizer], params, *, process_group=None,
                **kwargs) -> torch.optim.Optimizer:
    """ZeRO-1: `optimizer_cls` wrapped in ZeroRedundancyOptimizer over `process_group` (the
    data-parallel group; None = the world).

    Use with a DDP model: gradients are all-reduced as usual; each rank keeps the optimizer
    states of ~1/world of the parameters (whole tensors, sorted-greedy by size), updates
    those and broadcasts them. `params` may be tensors or parameter groups (dicts, e.g. an
    optimizer's param_groups; they are copied, not modified); `kwargs` go to optimizer_cls.
    LR schedulers work on the returned optimizer as on any other."""
    params = list(params)
    if params and isinstance(params[0], dict):
        params = [{**group, "params": list(group["params"])} for group in params]
    return ZeroRedundancyOptimizer(params, optimizer_class=optimizer_cls, process_group=process_group,
                                   **kwargs)


def sharded_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """This rank's bytes of parameters, gradients and optimizer state: for DTensors only the
    local shard, for ZeroRedundancyOptimizer only this rank's partition of the states.

    Gradients count only while they exist: call between backward and zero_grad.
    Keys: params, grads, optim_state, total."""
    params = list(model.parameters())
    out = {"params": sum(_local_bytes(p) for p in params),
           "grads": sum(_local_bytes(p.grad) for p in params if p.grad is not None),
           "optim_state": 0}
    if optimizer is not None:
        local = optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer
        out["optim_state"] = sum(_local_bytes(v) for state in local.state.values()
                                 for v in state.values() if isinstance(v, torch.Tensor))
    out["total"] = out["params"] + out["grads"] + out["optim_state"]
    return out


def _local_bytes(t: torch.Tensor) -> int:
    if isinstance(t, DTensor):
        t = t.to_local()
    return t.numel() * t.element_size()


__all__ = ["HSDP_DIM_NAMES", "apply_fsdp", "apply_zero1", "float8_only_groups", "sharded_bytes"]
