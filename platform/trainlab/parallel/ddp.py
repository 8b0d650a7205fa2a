"""Data parallel: DistributedDataParallel, gloo on CPU, NCCL on GPU."""

from __future__ import annotations

import inspect

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

# No buffer broadcast at each forward: the only buffers are the same on every rank already
# (rotary tables are computed; delayed-FP8 amaxes are max-all-reduced over the dp group by
# precision.fp8_delayed, which then sets the same scales everywhere).
# torch 2.13 spells it forward_sync_buffers=False (buffers are still broadcast once at init) and
# deprecates broadcast_buffers; 2.11 has only broadcast_buffers=False, which also skips that
# init broadcast. Skipping it changes nothing here: _allocate gives the buffers uninitialised
# storage and models.init.materialize sets them in place after DDP, the same on every rank (a
# model built with storage computes them the same on every rank). Chosen by the signature, so
# a torch that has the new argument gets it.
_NO_FORWARD_BUFFER_SYNC = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
    else {"broadcast_buffers": False}
)


def apply_ddp(model: nn.Module, *, device: torch.device, bucket_cap_mb: float,
              process_group=None) -> nn.Module:
    """`process_group`: the data-parallel group (None = the world). Plain tensors only: with
    tensor parallel (DTensor parameters) the dp replicas are parallel.replicate's instead.

    A model built on the meta device gets uninitialised storage on `device` here: DDP buckets
    and broadcasts real tensors. Its values come after (models.init.materialize fills them in
    place, the same on every rank, so the broadcast's garbage never survives)."""
    _allocate(model, device)
    return DDP(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=bucket_cap_mb,
        process_group=process_group,
        **_NO_FORWARD_BUFFER_SYNC,
    )


def _allocate(model: nn.Module, device: torch.device) -> None:
    """Uninitialised storage on `device` for every meta tensor of `model`. Not `to_empty`: it
    replaces a meta Parameter by a new object, dropping the attributes torch's DDP-over-TP
    transform keeps on the local shards (`_st_info`: how to rebuild the DTensor)."""
    made: dict[int, nn.Parameter] = {}  # a parameter shared by two modules stays shared
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None and p.is_meta:
                if id(p) not in made:
                    made[id(p)] = nn.Parameter(torch.empty_like(p, device=device), requires_grad=p.requires_grad)
                    made[id(p)].__dict__.update(p.__dict__)
                module._parameters[name] = made[id(p)]
        for name, b in module._buffers.items():
            if b is not None and b.is_meta:
                module._buffers[name] = torch.empty_like(b, device=device)


def allreduce_grads(params: list[torch.Tensor], *, group, ordered: bool = False) -> None:
    """Average the gradients of `params` over `group` in one flat all-reduce: data parallel for
    pipeline stages, whose per-micro-batch backward passes DDP's reducer cannot follow.
    ordered (train.deterministic): summed in rank order (parallel.ordered_reduce)."""
    import torch.distributed as dist
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = _flatten_dense_tensors(grads)
    if ordered:
        from trainlab.parallel.ordered_reduce import ordered_allreduce_mean

        ordered_allreduce_mean(flat, group=group)
    else:
        dist.all_reduce(flat, group=group)
        flat /= dist.get_world_size(group)
    for g, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
        g.copy_(synced)
