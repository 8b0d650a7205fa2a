"""A trial's layout as decided: the types every layer reads, whoever decided them.

trainlab.plan.derive_layout derives them (plan_layout, the one place parallel_dims runs); the
estimate, the engine and parallelize() are handed them.
"""

from __future__ import annotations

from dataclasses import dataclass


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
