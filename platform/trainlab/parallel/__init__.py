"""One apply_<strategy>() per parallelism; parallelize() applies them in a fixed order."""

from __future__ import annotations

import contextlib
from typing import ContextManager

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from trainlab.config.schema import ParallelConfig
from trainlab.config.validate import ParallelDims
from trainlab.engine.distributed import backend_for
from trainlab.parallel.ddp import apply_ddp

FSDP_KINDS = ("fsdp", "zero2", "hsdp")
REDUCE_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def fsdp_shards(dims: ParallelDims, cfg: ParallelConfig) -> bool:
    """Whether parallelize() shards parameters with FSDP2 (which then all-gathers them)."""
    return dims.dp > 1 and dims.pp == 1 and cfg.data_parallel in FSDP_KINDS


def parallelize(model: nn.Module, *, dims: ParallelDims, cfg: ParallelConfig,
                device: torch.device, mesh: DeviceMesh | None = None,
                param_dtype: torch.dtype | None = None, compile_blocks: bool = False,
                deterministic: bool = False) -> nn.Module:
    """Wrap `model` for the layout, in torchtitan's order: tensor parallel first (it changes
    the parameters into DTensor shards), then activation checkpointing (it wraps the
    blocks' forwards, which then run on those shards; FSDP2's per-block hooks must sit
    outside the checkpoint so backward unshards a block before recomputing it), then data
    parallel, which must see the final (possibly sharded or cast) parameters it
    synchronises. `compile_blocks` compiles each block after checkpointing (torchtitan's
    place for it). `deterministic`: DDP sums gradients in rank order (parallel.ordered_reduce).
    `param_dtype`: FSDP2's all-gather/compute dtype, as the precision's spec decides
    (precision.spec.PrecisionSpec.fsdp_param_dtype; None = the parameters' own).
    `mesh` (from parallel.mesh) is needed for anything but plain DDP."""
    if dims.tp > 1:
        from trainlab.parallel.tp import apply_tp

        model = apply_tp(model, mesh=mesh["tp"], sequence_parallel=cfg.sequence_parallel)
    if cfg.activation_checkpoint != "none":
        from trainlab.parallel.checkpoint import apply_activation_checkpointing

        apply_activation_checkpointing(model, cfg.activation_checkpoint)
    if compile_blocks:
        from trainlab.parallel.compile import compile_blocks as compile_each_block

        compile_each_block(model)
    if dims.dp == 1:
        return model
    if fsdp_shards(dims, cfg):
        from trainlab.parallel.fsdp import HSDP_DIM_NAMES, apply_fsdp

        dp_mesh = mesh[HSDP_DIM_NAMES] if cfg.data_parallel == "hsdp" and cfg.dp_replicate > 1 else (
            mesh["dp_shard"] if "dp_shard" in (mesh.mesh_dim_names or ()) else mesh["dp"])
        return apply_fsdp(model, mesh=dp_mesh, reshard_after_forward=cfg.data_parallel != "zero2",
                          param_dtype=param_dtype,
                          reduce_dtype=REDUCE_DTYPES[cfg.comm_dtype])
    group = mesh["dp"].get_group() if mesh is not None and mesh.ndim > 1 else None
    if dims.tp > 1:
        # DDP syncs plain tensors: hand it the local shards of the DTensor parameters
        from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform

        _pre_dp_module_transform(model)
    model = apply_ddp(model, device=device, bucket_cap_mb=cfg.bucket_cap_mb, process_group=group)
    if cfg.comm_dtype != "fp32" or cfg.powersgd_rank or deterministic:
        from trainlab.parallel.comm import register_comm_hook

        register_comm_hook(model, comm_dtype=cfg.comm_dtype, powersgd_rank=cfg.powersgd_rank,
                           backend=backend_for(device.type), ordered=deterministic, group=group)
    return model


def unwrap(model: nn.Module) -> nn.Module:
    """The user's model inside DDP / torch.compile wrappers (its names have no prefixes)."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def reshard(model: nn.Module) -> None:
    """Shard again what FSDP2 left gathered after a forward without backward (an evaluation):
    the root and the last block keep their parameters gathered for a backward that does not
    come, and until they are resharded `model.parameters()` are those gathered compute copies
    (hp_dtype, or float8 with float8 all-gather), not the sharded fp32 masters."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def no_sync(model: nn.Module, *, last_micro_batch: bool) -> ContextManager:
    """Skip the gradient all-reduce on every micro-batch but the last of an optimizer step."""
    if last_micro_batch or not hasattr(model, "no_sync"):
        return contextlib.nullcontext()
    return model.no_sync()


__all__ = ["apply_ddp", "fsdp_shards", "no_sync", "parallelize", "reshard", "unwrap"]
