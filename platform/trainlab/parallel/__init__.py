"""One apply_<strategy>() per parallelism; parallelize() applies them in a fixed order."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Callable, ContextManager

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from trainlab.config.layout_types import ParallelDims, fsdp_shards
from trainlab.config.schema import ParallelConfig
from trainlab.distributed import backend_for
from trainlab.parallel.ddp import apply_ddp
from trainlab.parallel.fsdp import apply_zero1

if TYPE_CHECKING:
    from trainlab.parallel.pp import Pipeline

REDUCE_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _plain_optimizer(optimizer_cls: type[torch.optim.Optimizer], params, **kwargs) -> torch.optim.Optimizer:
    return optimizer_cls(params, **kwargs)


@dataclass
class Parallelized:
    """What parallelize() made of the model: what the engine trains, and how."""

    model: nn.Module
    """What the optimizer, clipping, telemetry and checkpoints see: the wrapped model, or
    under pp this rank's stages in an nn.ModuleList."""
    pipeline: Pipeline | None = None
    """parallel.pp > 1: this rank's stages and their schedule."""
    dp_group: dist.ProcessGroup | None = None
    """This rank's data-parallel replicas (None: dp = 1, there are none): the group every
    collective meant for them runs on (gradient averaging, DDP communication hooks, ZeRO-1,
    fp8_delayed's amax). Not the world where that also holds tensor- or pipeline-parallel peers."""
    make_optimizer: Callable[..., torch.optim.Optimizer] = _plain_optimizer
    """(optimizer_cls, param_groups, **kwargs) -> the optimizer: ZeRO-1 shards its states
    over dp_group; every other layout builds optimizer_cls as it is."""


def parallelize(model: nn.Module, *, dims: ParallelDims, cfg: ParallelConfig,
                device: torch.device, mesh: DeviceMesh | None = None,
                param_dtype: torch.dtype | None = None, compile_unit: str | None = None,
                deterministic: bool = False, pp_microbatches: int = 1, pp_virtual_stages: int = 1,
                loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                tp_plan: Mapping[str, str] | None = None) -> Parallelized:
    """Apply the layout of `dims` / `cfg` to `model`, in torchtitan's order: the pipeline split
    first (each stage is then a model of its own, treated as below), then tensor parallel (it
    changes the parameters into DTensor shards), then activation checkpointing (it wraps the
    blocks' forwards, which then run on those shards; FSDP2's per-block hooks must sit outside
    the checkpoint so backward unshards a block before recomputing it), then compile (of each
    block, or of the whole model, which must see the checkpointed blocks), then data parallel,
    which must see the final (possibly sharded or cast) parameters it synchronises: FSDP2
    (fsdp, zero2, hsdp), replicate over the dp mesh dimension (ddp with tp), or DDP (ddp,
    zero1, with ZeRO-1's optimizer from `make_optimizer`).

    param_dtype: FSDP2's all-gather/compute dtype, as the precision's spec decides
    (vocab.precision.PrecisionSpec.fsdp_param_dtype; None = the parameters' own).
    compile_unit: None (eager), "block" or "model" (train.compile_unit). `deterministic`: DDP
    sums gradients in rank order (parallel.ordered_reduce). `mesh` (from parallel.mesh) is
    needed for anything but one process. pp only: `pp_microbatches` and `pp_virtual_stages`
    as config.validate resolves them, `loss_fn(logits, targets)` one micro-batch's mean loss.
    `tp_plan`: model.tp_plan, the tensor-parallel plan used instead of the built-in one when set."""
    dp_group = _dp_group(mesh, dims)
    make_optimizer = partial(apply_zero1, process_group=dp_group) \
        if cfg.data_parallel == "zero1" and dp_group is not None else _plain_optimizer
    if dims.pp > 1:
        from trainlab.parallel.pp import build_pipeline

        assert loss_fn is not None, "a pipeline's last stage computes the loss: pass loss_fn"
        # Stage replicas average their gradients after each pipelined step (the trainer's
        # allreduce_grads over dp_group): DDP's reducer cannot follow the schedule's
        # per-micro-batch backward passes.
        pipeline = build_pipeline(
            model, mesh_or_group=mesh["pp"], pp_rank=mesh["pp"].get_local_rank(), pp_size=dims.pp,
            schedule=cfg.pp_schedule, n_microbatches=pp_microbatches, loss_fn=loss_fn, device=device,
            virtual_stages=pp_virtual_stages,
            wrap=partial(_apply_to_stage, cfg=cfg, compile_unit=compile_unit))
        pipeline.dp_group = dp_group
        return Parallelized(model=nn.ModuleList(pipeline.stages), pipeline=pipeline, dp_group=dp_group,
                            make_optimizer=make_optimizer)
    if dims.tp > 1:
        from trainlab.parallel.tp import apply_tp

        model = apply_tp(model, mesh=mesh["tp"], sequence_parallel=cfg.sequence_parallel, user_plan=tp_plan)
    model = _apply_to_stage(model, cfg=cfg, compile_unit=compile_unit)
    if dims.dp == 1:
        return Parallelized(model=model)
    if fsdp_shards(dims, cfg):
        from trainlab.parallel.fsdp import HSDP_DIM_NAMES, apply_fsdp

        dp_mesh = mesh[HSDP_DIM_NAMES] if cfg.data_parallel == "hsdp" and cfg.dp_replicate > 1 else (
            mesh["dp_shard"] if "dp_shard" in (mesh.mesh_dim_names or ()) else mesh["dp"])
        model = apply_fsdp(model, mesh=dp_mesh, reshard_after_forward=cfg.data_parallel != "zero2",
                           param_dtype=param_dtype,
                           reduce_dtype=REDUCE_DTYPES[cfg.comm_dtype])
    elif dims.tp > 1:
        from trainlab.parallel.replicate import apply_replicate

        # DDP cannot hold DTensor parameters (see parallel.replicate); FSDP2's replicate keeps
        # them, replicated over dp and sharded over tp, and averages gradients over dp only
        model = apply_replicate(model, mesh=mesh["dp"], reduce_dtype=REDUCE_DTYPES[cfg.comm_dtype])
    else:
        model = apply_ddp(model, device=device, bucket_cap_mb=cfg.bucket_cap_mb, process_group=dp_group)
        if cfg.comm_dtype != "fp32" or cfg.powersgd_rank or deterministic:
            from trainlab.parallel.comm import register_comm_hook

            register_comm_hook(model, comm_dtype=cfg.comm_dtype, powersgd_rank=cfg.powersgd_rank,
                               backend=backend_for(device.type), ordered=deterministic, group=dp_group)
    return Parallelized(model=model, dp_group=dp_group, make_optimizer=make_optimizer)


def _apply_to_stage(model: nn.Module, *, cfg: ParallelConfig, compile_unit: str | None) -> nn.Module:
    """Activation checkpointing, then compile: of the whole model or of a pipeline stage."""
    if cfg.activation_checkpoint != "none":
        from trainlab.parallel.activation_checkpoint import apply_activation_checkpointing

        apply_activation_checkpointing(model, cfg.activation_checkpoint)
    if compile_unit == "block":
        from trainlab.parallel.compile import compile_blocks

        compile_blocks(model)
    elif compile_unit == "model":
        from trainlab.parallel.compile import compile_model

        model = compile_model(model)
    return model


def _dp_group(mesh: DeviceMesh | None, dims: ParallelDims) -> dist.ProcessGroup | None:
    """This rank's data-parallel group on `mesh` (no mesh: plain data parallel over the
    world); None when dp = 1."""
    if dims.dp == 1:
        return None
    if mesh is None:
        assert dims.tp == dims.pp == 1, "tensor and pipeline parallel need a mesh"
        return dist.group.WORLD
    names = mesh.mesh_dim_names or ()
    if "dp" in names:
        return mesh["dp"].get_group()
    # hsdp: dp_replicate x dp_shard, which config validation allows only as the whole world
    assert dims.dp == dist.get_world_size(), f"a data-parallel mesh {names} smaller than the world"
    return dist.group.WORLD


def unwrap(model: nn.Module) -> nn.Module:
    """The user's model inside DDP / torch.compile wrappers (its names have no prefixes)."""
    while True:
        # not `a or b`: bool() of torch.compile's wrapper calls len() of the model, which raises
        inner = getattr(model, "module", None)
        if inner is None:
            inner = getattr(model, "_orig_mod", None)
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
    """Skip the gradient all-reduce on every micro-batch but the last of an optimizer step
    (DDP, and replicate as DDP does; FSDP2's sharded layouts reduce every micro-batch)."""
    from trainlab.parallel.replicate import is_replicated

    if is_replicated(model):
        model.set_requires_gradient_sync(last_micro_batch)
        return contextlib.nullcontext()
    if last_micro_batch or not hasattr(model, "no_sync"):
        return contextlib.nullcontext()
    return model.no_sync()


__all__ = ["Parallelized", "apply_ddp", "fsdp_shards", "no_sync", "parallelize", "reshard", "unwrap"]
