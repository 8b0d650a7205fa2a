"""A trial's layout as decided: the types every layer reads, whoever decided them.

trainlab.plan.derive_layout derives them (plan_layout, the one place parallel_dims runs); the
estimate, the engine and parallelize() are handed them. The arithmetic of a layout that needs no
process group (a rank's coordinates, whether FSDP shards, a pipeline's bubble in theory) is here too, so the estimate
reads it without importing the parallel layer (torch.distributed's FSDP and pipelining: seconds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainlab.config.schema import ParallelConfig


@dataclass(frozen=True)
class ParallelDims:
    """Degrees of each parallelism; their product is the world size."""

    dp: int
    tp: int
    pp: int

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp


@dataclass(frozen=True)
class MeshCoords:
    """Where this rank sits: which data shard it reads, which stage and tp slice it holds."""

    dp_rank: int
    pp_rank: int
    tp_rank: int


def coords(rank: int, dims: ParallelDims) -> MeshCoords:
    """This rank's coordinates in the dp-major layout (trainlab.parallel.mesh): tp innermost,
    then pp, dp outermost."""
    tp_rank = rank % dims.tp
    pp_rank = (rank // dims.tp) % dims.pp
    dp_rank = rank // (dims.tp * dims.pp)
    return MeshCoords(dp_rank=dp_rank, pp_rank=pp_rank, tp_rank=tp_rank)


FSDP_KINDS = ("fsdp", "zero2", "hsdp")
"""parallel.data_parallel kinds that shard parameters with FSDP2 (zero1 shards only the optimizer's state)."""


def fsdp_shards(dims: ParallelDims, cfg: ParallelConfig) -> bool:
    """Whether parallelize() shards parameters with FSDP2 (which then all-gathers them)."""
    return dims.dp > 1 and dims.pp == 1 and cfg.data_parallel in FSDP_KINDS


def bubble_fraction(*, pp: int, n_microbatches: int, virtual_stages: int = 1) -> float:
    """A pipeline's idle share of a step in theory, equal-cost stages and free communication:
    (p - 1) / (v m + p - 1); v = 1 for GPipe and 1F1B (the same bubble, 1F1B holds less memory)."""
    return (pp - 1) / (virtual_stages * n_microbatches + pp - 1)


@dataclass(frozen=True)
class TrialLayout:
    """The layout decisions of a trial on its full gang (plan.derive_layout.plan_layout)."""

    dims: ParallelDims
    """The parallel degrees; their product is cluster.num_workers."""
    grad_accum_steps: int
    """Micro-batches per rank per optimizer step."""
    pp_microbatches: int
    """Pipeline micro-batches per step (1 without a pipeline)."""
    pp_virtual_stages: int
    """Stages per pipeline rank (parallel.pp_virtual_stages with interleaved 1F1B, else 1)."""
    elastic: tuple[int, int] | None
    """(fewest, most) workers of an elastic trial; None for a fixed gang."""
