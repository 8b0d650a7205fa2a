"""Data parallel over tensor parallel (parallel=dp_tp): replicas on the "dp" dimension of a 2-D
(dp, tp) mesh, through torch's FSDP2-based `replicate`, as torchtitan applies DDP.

    model = apply_tp(model, mesh=mesh["tp"])
    model = apply_replicate(model, mesh=mesh["dp"], reduce_dtype=torch.float16)

Why not DDP: DDP syncs plain tensors, so the DTensor shards that tensor parallel makes must be
turned into plain parameters first (torch's `_pre_dp_module_transform`), and back into
DTensors by a forward pre-hook that sets them as plain attributes: after the first forward the
model has no parameters left. `model.parameters()` and the state dict are then empty, the
gradient norm reads 0, clipping never happens and a checkpoint cannot be saved. `replicate`
instead keeps every parameter a DTensor on the 2-D mesh (Replicate() over dp, the tensor-
parallel placement over tp), so the optimizer, clipping, telemetry and DCP checkpoints see
the model as they do under FSDP2.

What it does, as DDP does: parameters stay whole on every dp rank (nothing is sharded), and
each gradient is all-reduced (averaged) over the dp group only, one all-reduce per block
while backward goes on, in `reduce_dtype` (parallel.comm_dtype: fp32, fp16, bf16; torch's
MixedPrecisionPolicy, so the average is cast back to the parameters' dtype). With gradient
accumulation the all-reduce runs on the last micro-batch only (`parallel.no_sync`), as DDP's.
What it does not take: DDP communication hooks (PowerSGD, precision.formats.comm_grads,
train.deterministic's rank-ordered sum); config validation refuses the first two with
dp_tp, and the third's note says that this all-reduce keeps the backend's order.

Checked on torch 2.13 CPU / gloo, 4 ranks (tests/distributed/test_dp_tp.py): losses and
gradient norms as one process within 1e-5 with clipping active; checkpoint and resume bitwise.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed._composable.replicate_with_fsdp import ReplicateModule, replicate
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy

from trainlab.parallel.activation_checkpoint import indexed_blocks


def apply_replicate(model: nn.Module, *, mesh: DeviceMesh,
                    reduce_dtype: torch.dtype | None = None) -> nn.Module:
    """Replicate `model` over the 1-D data-parallel `mesh` (a dimension of the mesh the tensor-
    parallel DTensors live on): one group per block, then the root (embedding, final norm,
    head), torchtitan's grouping, so each block's all-reduce overlaps the backward of the
    blocks before it. Returns the model, in place (build the optimizer after this call)."""
    if mesh.ndim != 1:
        raise ValueError(f"apply_replicate needs the 1-D data-parallel mesh (e.g. world_mesh['dp']), "
                         f"got a {mesh.ndim}-D mesh {mesh.mesh_dim_names}")
    policy = MixedPrecisionPolicy(reduce_dtype=reduce_dtype)
    for _, block in indexed_blocks(model):  # blocks() or `.layers` (model=custom), as checkpointing finds them
        replicate(block, mesh=mesh, mp_policy=policy)
    replicate(model, mesh=mesh, mp_policy=policy)
    return model


def is_replicated(model: nn.Module) -> bool:
    return isinstance(model, ReplicateModule)


__all__ = ["apply_replicate", "is_replicated"]
