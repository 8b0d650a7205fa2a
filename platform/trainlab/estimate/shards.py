"""What each rank stores of a model: its parameters' local shards, from the layout code itself.

    model = prepared_model(run, device_type="cuda")        # meta device, after the precision recipe
    shards = rank_shards(model, run, rank=3)               # [Shard(name, numel, dtype, ...)]

The same decisions the engine makes, read rather than copied: the pipeline stages are
parallel.pp.split_stages' copies of the (meta) model, tensor-parallel shard dims come from
parallel.tp's plan (param_shard_dims, model.tp_plan's when set), FSDP2 shards dim 0 of each (tensor-parallel local)
parameter in torch.chunk pieces, ZeRO-1 partitions the optimizer's parameters as
ZeroRedundancyOptimizer does (largest first, greedily onto the least loaded rank, per group,
loads carried across groups), and dtypes are those the precision recipe leaves on the model.
Everything is counted on the meta device: no rank's memory is touched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from trainlab.config import RunConfig
from trainlab.config.layout_types import MeshCoords, ParallelDims, TrialLayout, coords, fsdp_shards
from trainlab.data.build_corpus import corpus_vocab_size


@dataclass(frozen=True)
class Shard:
    """One parameter as one rank stores it."""

    name: str
    """The single-process model's name (pipeline stages keep them)."""
    shape: tuple[int, ...]
    """The local shape on this rank (after tensor-parallel and FSDP2 sharding)."""
    dtype: torch.dtype
    decay: bool
    """In the optimizer's weight-decay group (matrices; engine.schedule.build_optimizer)."""
    full_numel: int
    """Elements of the whole parameter (what ZeRO-1 balances by)."""
    grad_shape: tuple[int, ...] | None = None
    """The gradient's local shape where it differs from the parameter's (None: the same)."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    @property
    def grad_nbytes(self) -> int:
        return (self.numel if self.grad_shape is None else math.prod(self.grad_shape)) * self.dtype.itemsize


def chunk_len(size: int, parts: int, index: int) -> int:
    """Length of piece `index` of torch.chunk(range(size), parts): ceil(size / parts) each,
    the last ones shorter or empty (FSDP2's and DTensor's Shard placement)."""
    step = -(-size // parts)
    return max(0, min(step, size - index * step))


def zero1_partition(numels: list[list[int]], world: int) -> list[list[list[int]]]:
    """ZeroRedundancyOptimizer._partition_parameters: for each parameter group (element
    counts in group order), the indices of its parameters each rank owns. Within a group the
    largest go first (a stable sort), each to the rank with the least elements so far (the
    lowest such rank); the loads carry over from one group to the next."""
    loads = [0] * world
    out: list[list[list[int]]] = []
    for group in numels:
        owned: list[list[int]] = [[] for _ in range(world)]
        for i in sorted(range(len(group)), key=lambda i: group[i], reverse=True):
            rank = loads.index(min(loads))
            owned[rank].append(i)
            loads[rank] += group[i]
        out.append(owned)
    return out


# ---------------------------------------------------------------------------------------

def prepared_model(run: RunConfig, *, device_type: str, fsdp_backend: str = "") -> tuple[nn.Module, object]:
    """(the model on the meta device after the precision recipe's prepare, the recipe), as
    engine.run.build_trainer makes them: the parameters' dtypes and which linears became FP8."""
    from trainlab.models import build_model
    from trainlab.vocab.precision import spec_of

    with torch.device("meta"):
        model = build_model(run.model, vocab_size=corpus_vocab_size(run.data))
    spec = spec_of(run.precision.name)
    # the recipe class's own build, not precision.build_recipe: that also switches TF32 on this
    # process's CUDA backend, a side effect an estimate must not have
    recipe = spec.recipe_class().build(run.precision, spec, device_type=device_type)
    recipe.fsdp_backend = fsdp_backend
    return recipe.prepare(model), recipe


@dataclass(frozen=True)
class Sharding:
    """The layout's degrees and sharding, as parallelize() decides them."""

    dims: ParallelDims
    fsdp: bool
    """FSDP2 shards parameters, gradients and states (parallel.fsdp_shards)."""
    shard_size: int
    """Ranks one FSDP2 group shards over (dp, or dp / dp_replicate for HSDP); 1 without FSDP2."""
    zero1: bool
    """ZeRO-1 partitions the optimizer states over dp."""
    virtual_stages: int
    pp_microbatches: int
    """Pipeline micro-batches per step (1 without a pipeline)."""

    @classmethod
    def of(cls, run: RunConfig, trial_layout: TrialLayout) -> Sharding:
        """`run`'s sharding under the layout the plan decided (plan.derive_layout.plan_layout)."""

        dims = trial_layout.dims
        p = run.parallel
        fsdp = fsdp_shards(dims, p)
        replicate = p.dp_replicate if fsdp and p.data_parallel == "hsdp" and p.dp_replicate > 1 else 1
        return cls(dims=dims, fsdp=fsdp, shard_size=dims.dp // replicate if fsdp else 1,
                   zero1=p.data_parallel == "zero1" and dims.dp > 1 and dims.pp == 1,
                   virtual_stages=trial_layout.pp_virtual_stages if dims.pp > 1 else 1,
                   pp_microbatches=trial_layout.pp_microbatches if dims.pp > 1 else 1)


def stage_modules(model: nn.Module, layout: Sharding, pp_rank: int) -> list[nn.Module]:
    """The modules this pipeline rank holds: its stages (split_stages' copies), or the model."""
    if layout.dims.pp == 1:
        return [model]
    return _stages(model, pp_rank, layout.dims.pp, layout.virtual_stages)


_STAGES: dict[tuple[int, int, int, int], tuple[nn.Module, list[nn.Module]]] = {}


def _stages(model: nn.Module, pp_rank: int, pp: int, virtual: int) -> list[nn.Module]:
    from trainlab.parallel.pp import split_stages

    key = (id(model), pp_rank, pp, virtual)
    cached = _STAGES.get(key)
    if cached is None or cached[0] is not model:  # the id of a collected model may come back
        if len(_STAGES) > 64:
            _STAGES.clear()
        # deep copies of a meta model: cheap, but once per rank and model is enough
        cached = _STAGES[key] = (model, split_stages(model, pp_rank=pp_rank, pp_size=pp, virtual_stages=virtual))
    return cached[1]


def rank_shards(model: nn.Module, run: RunConfig, *, rank: int, trial_layout: TrialLayout) -> list[Shard]:
    """The parameters global rank `rank` stores, in the optimizer's order (model.parameters()
    of what the trainer trains), each with its local shape."""
    layout = Sharding.of(run, trial_layout)
    at = coords(rank, layout.dims)
    shards: list[Shard] = []
    for part in stage_modules(model, layout, at.pp_rank):
        tp_dims = _tp_dims(part, layout, run.parallel.sequence_parallel, run.model.tp_plan)
        seen: set[int] = set()
        for name, p in part.named_parameters():
            if id(p) in seen or not p.requires_grad:
                continue
            seen.add(id(p))
            shape, grad_shape = list(p.shape), None
            if name in tp_dims:
                d = tp_dims[name]
                shape[d] = chunk_len(shape[d], layout.dims.tp, at.tp_rank)
                if layout.dims.dp == 1 and _is_embedding(part, name):
                    # measured (torch 2.13): the vocab-sharded embedding's gradient comes back a
                    # Replicate DTensor of the whole table; a data-parallel wrapper (FSDP2, its
                    # replicate) reduces it to the parameter's own shard
                    grad_shape = tuple(p.shape)
            if layout.fsdp:
                shape[0] = chunk_len(shape[0], layout.shard_size, _shard_index(at, layout))
            shards.append(Shard(name=name, shape=tuple(shape), dtype=p.dtype, decay=p.dim() >= 2,
                                full_numel=p.numel(), grad_shape=grad_shape))
    return shards


def _is_embedding(part: nn.Module, param_name: str) -> bool:
    return isinstance(part.get_submodule(param_name.rpartition(".")[0]), nn.Embedding)


def _tp_dims(part: nn.Module, layout: Sharding, sequence_parallel: bool, user_plan: dict[str, str]) -> dict[str, int]:
    if layout.dims.tp == 1 or layout.dims.pp > 1:  # parallelize() applies no TP to pipeline stages
        return {}
    from trainlab.parallel.tp import param_shard_dims

    return param_shard_dims(part, sequence_parallel=sequence_parallel, user_plan=user_plan)


def _shard_index(at: MeshCoords, layout: Sharding) -> int:
    """This rank's place in its FSDP2 group: HSDP's mesh is (dp_replicate, dp_shard), the
    shard dimension inner."""
    return at.dp_rank % layout.shard_size


def optimizer_shards(shards: list[Shard], run: RunConfig, *, rank: int,
                     trial_layout: TrialLayout) -> list[Shard]:
    """The parameters whose optimizer states rank `rank` holds: all of its own, or under
    ZeRO-1 its partition (engine.schedule's groups: decay first, then no-decay)."""
    layout = Sharding.of(run, trial_layout)
    if not layout.zero1:
        return shards
    groups = [[s for s in shards if s.decay], [s for s in shards if not s.decay]]
    owned = zero1_partition([[s.full_numel for s in g] for g in groups], layout.dims.dp)
    dp_rank = coords(rank, layout.dims).dp_rank
    return [g[i] for g, parts in zip(groups, owned) for i in parts[dp_rank]]
