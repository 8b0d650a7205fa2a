"""How many collective calls a rank makes in one optimizer step, and their links' latency.

    calls = rank_calls(run, layout=layout, rank=r, blocks=blocks, micro=micro, virtual=virtual)
    calls.count, calls.latency_s

A collective costs bytes over bandwidth (estimate.links, calibrated by comm_efficiency) plus a
cost per call that no bandwidth explains: the process group's dispatch, the work's wait, the
peers' arrival (on gloo a TCP round trip through a background thread; on NCCL a kernel launch
and the proxy's hand-off) and the hops' latency. Small messages are all call cost: tensor
parallel on gloo moves kilobytes per call, dozens of calls a step. So the step counts calls
per rank per layout, from the same decisions the engine makes:

- every step: the loss mean over all ranks (engine.trainer: mean_over_ranks), and the gradient
  norm's reduction where gradients are sharded (a DTensor norm's full_tensor, or the
  pipeline's norm over its stages);
- DDP: one all-reduce per gradient bucket on the last micro-batch (torch's first bucket holds
  1 MiB, the others parallel.bucket_cap_mb); a pipeline's replicas one flat all-reduce
  (parallel.ddp.allreduce_grads); DDP over tensor parallel is FSDP2's replicate, one
  all-reduce per block and one for the root;
- ZeRO-1: ZeroRedundancyOptimizer broadcasts every parameter tensor from its owner;
- FSDP2: one all-gather per unit (every block and the root) per micro-batch in forward, again
  in backward for the blocks that reshard (all but the last; zero2 reshards none), one
  reduce-scatter per unit on the last micro-batch, HSDP one all-reduce per unit more;
- tensor parallel (parallel.tp's plan): per block per micro-batch an all-reduce after wo and
  after w2 forward and two for the column-parallel inputs' gradients backward; with sequence
  parallel an all-gather and a reduce-scatter for each of those four and the two norms'
  weight gradients; the embedding's and the head's per micro-batch;
- pipeline: per micro-batch and stage a rank holds, the activation sent to the next stage and
  received from the previous one, the gradient the other way round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainlab.config.schema import RunConfig
from trainlab.estimate.links import Link
from trainlab.estimate.shape import ModelShape

DDP_FIRST_BUCKET_BYTES = 1024 * 1024
"""torch DDP's first bucket (dist._DEFAULT_FIRST_BUCKET_BYTES): the first gradients go early."""
TENSORS_PER_BLOCK = 9
"""Parameter tensors of one block: wq, wk, wv, wo, w1, w2, w3 and the two norms' weights."""


@dataclass(frozen=True)
class Calls:
    count: float
    """Collective calls per optimizer step on this rank."""
    latency_s: float
    """Their links' latency (hops x Link.latency_s), seconds."""
    unit_gathers: float = 0.0
    """FSDP2 units gathered (and their reduce-scatters): each runs the unit's hooks and copies its
    parameters in and out of the flat buffer, Python work besides the collective."""
    redistributes: float = 0.0
    """Tensor parallel's collectives: each a DTensor redistribute (placement planning, the
    functional collective and its wait, the async tensor's unwrapping), Python besides the call."""

    def __add__(self, other: Calls) -> Calls:
        return Calls(self.count + other.count, self.latency_s + other.latency_s,
                     self.unit_gathers + other.unit_gathers, self.redistributes + other.redistributes)


NONE = Calls(0.0, 0.0)


def _of(op: str, *, n: int, link: Link, times: float = 1.0) -> Calls:
    """`times` calls of collective `op` over `n` ranks: the alpha-beta model's latency hops."""
    if n <= 1 or times <= 0:
        return NONE
    hops = {"all_reduce": 2 * math.log2(n), "all_gather": n - 1, "reduce_scatter": n - 1,
            "broadcast": math.log2(n), "p2p": 1}[op]
    return Calls(times, times * hops * link.latency_s)


def tensors_of(blocks: list[int], *, n_layers: int) -> int:
    """Parameter tensors of a rank holding `blocks` (the embedding with the first, the final
    norm and the head with the last)."""
    return TENSORS_PER_BLOCK * len(blocks) + (0 in blocks) + 2 * (n_layers - 1 in blocks)


def rank_calls(run: RunConfig, *, layout, rank: int, shape: ModelShape, blocks: list[int], micro: int,
               virtual: int) -> Calls:
    """Collective calls of `rank` in one optimizer step (module docstring)."""
    p = run.parallel
    dims = layout.trial_layout.dims
    world = layout.world
    out = _of("all_reduce", n=world, link=layout.link(list(range(world))))  # the loss's mean
    dp_group = layout.dp_group(rank)
    dp, dp_link = len(dp_group), layout.link(dp_group)
    dpk = p.data_parallel
    units = len(blocks) + 1  # FSDP2 / replicate units: every block and the root
    if dp > 1 and dims.pp > 1:
        out += _of("all_reduce", n=dp, link=dp_link)  # the stage replicas' flat all-reduce
    elif dp > 1 and dpk in ("ddp", "zero1"):
        if dims.tp > 1:  # FSDP2's replicate: one all-reduce per unit
            out += _of("all_reduce", n=dp, link=dp_link, times=units)
        else:
            grad_bytes = shape.local_params(blocks, 1) * (2 if p.comm_dtype in ("bf16", "fp16") else 4)
            buckets = 1 + math.ceil(max(0, grad_bytes - DDP_FIRST_BUCKET_BYTES) / (p.bucket_cap_mb * 2**20))
            out += _of("all_reduce", n=dp, link=dp_link, times=buckets)
        if dpk == "zero1":  # issued asynchronously, waited together: gloo's thread runs them back to back
            out += _of("broadcast", n=dp, link=dp_link, times=tensors_of(blocks, n_layers=shape.n_layers))
    elif dp > 1 and dpk in ("zero2", "fsdp", "hsdp"):
        shard = layout.shard_group(rank) if dpk == "hsdp" else dp_group
        link = layout.link(shard)
        gathers = units if dpk == "zero2" else units + len(blocks) - 1  # backward re-gathers resharded blocks
        out += _of("all_gather", n=len(shard), link=link, times=micro * gathers)
        out += _of("reduce_scatter", n=len(shard), link=link, times=units)
        out += Calls(0.0, 0.0, unit_gathers=micro * gathers + units)
        if dpk == "hsdp":
            replicas = layout.replica_group(rank)
            out += _of("all_reduce", n=len(replicas), link=layout.link(replicas), times=units)
        out += _of("all_reduce", n=len(shard), link=link)  # the DTensor gradient norm
    if dims.tp > 1:
        tp_group = layout.tp_group(rank)
        link = layout.link(tp_group)
        per_block, ends = (10, 5) if p.sequence_parallel else (4, 3)
        tp_calls = micro * (per_block * len(blocks) + ends) + 1  # + the DTensor gradient norm's
        out += _of("all_reduce", n=dims.tp, link=link, times=tp_calls)
        out += Calls(0.0, 0.0, redistributes=tp_calls)
    if dims.pp > 1:
        pp_group = layout.pp_group(rank)
        link = layout.link(pp_group)
        stages = dims.pp * virtual
        for v in range(virtual):
            stage = v * dims.pp + layout.coords[rank].pp_rank
            out += _of("p2p", n=2, link=link, times=micro * 2 * ((stage > 0) + (stage < stages - 1)))
        out += _of("all_reduce", n=dims.pp, link=link)  # the norm over every stage
    return out
