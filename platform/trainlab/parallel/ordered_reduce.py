"""A fixed summation order for data-parallel gradients (train.deterministic with DDP).

A backend's all-reduce sums the ranks' contributions in an order set by its algorithm and
the topology (ring, tree, NVLS, how many nodes): floating-point addition is not associative,
so the same gradients can average to different last bits on another device set. Here each
bucket is all-gathered and every rank adds the contributions itself in rank order,
((g0 + g1) + g2) + ..., then divides by the world size. Every rank computes the same bits,
and the result depends only on the number of ranks, not on the collective algorithm.

Cost: an all-gather moves (world - 1) x the bucket to every rank (a ring all-reduce moves
about 2x) and holds world x the bucket in memory while summing; fine for a few ranks, the
price grows with the data-parallel degree. `trainlab bench determinism` measures it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

SEND_DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


def ordered_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    """parts[0] + parts[1] + ... in this order, in float32 (low-precision parts are upcast)."""
    total = parts[0].to(torch.float32, copy=True)
    for part in parts[1:]:
        total += part.to(torch.float32)
    return total


def ordered_allreduce_mean(tensor: torch.Tensor, *, group=None, comm_dtype: torch.dtype | None = None,
                           async_op: bool = False):
    """Mean of `tensor` over `group`, summed in rank order; written into `tensor` in place.

    comm_dtype: what is sent (fp16 / bf16 halve the bytes); the sum is in float32. With
    async_op, returns a Future whose value is `tensor` once the mean is in it."""
    group = group if group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    send = tensor if comm_dtype is None else tensor.to(comm_dtype)
    parts = [torch.empty_like(send) for _ in range(world)]
    work = dist.all_gather(parts, send, group=group, async_op=True)

    def reduce(_fut=None) -> torch.Tensor:
        tensor.copy_(ordered_sum(parts).div_(world))
        return tensor

    if async_op:
        return work.get_future().then(lambda fut: reduce(fut))
    work.wait()
    return reduce()


# no annotations: under `from __future__ import annotations` they are strings, which DDP's
# hook check compares with dist.GradBucket and refuses (see parallel.comm)
def ordered_allreduce_hook(state, bucket):
    """DDP communication hook: the bucket's mean over the data-parallel group in rank order.

    state: None, or a dict with 'group' (default: DDP's process group is not passed to hooks,
    so the caller gives it) and 'comm_dtype' (a torch dtype to send, None = the bucket's)."""
    state = state or {}
    return ordered_allreduce_mean(bucket.buffer(), group=state.get("group"),
                                  comm_dtype=state.get("comm_dtype"), async_op=True)


__all__ = ["SEND_DTYPES", "ordered_allreduce_hook", "ordered_allreduce_mean", "ordered_sum"]
