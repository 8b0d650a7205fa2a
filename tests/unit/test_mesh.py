"""The mesh layout as data: names and sizes per layout, and each rank's coordinates."""

from __future__ import annotations

import pytest

from trainlab.config.layout_types import ParallelDims, coords
from trainlab.parallel.mesh import mesh_shape


@pytest.mark.parametrize(("dims", "replicate", "expected"), [
    (ParallelDims(dp=4, tp=1, pp=1), 1, ((4,), ("dp",))),
    (ParallelDims(dp=1, tp=1, pp=1), 1, ((1,), ("dp",))),
    (ParallelDims(dp=2, tp=2, pp=1), 1, ((2, 2), ("dp", "tp"))),
    (ParallelDims(dp=2, tp=1, pp=4), 1, ((2, 4), ("dp", "pp"))),
    (ParallelDims(dp=4, tp=1, pp=1), 2, ((2, 2), ("dp_replicate", "dp_shard"))),
    (ParallelDims(dp=2, tp=1, pp=1), 2, ((2, 1), ("dp_replicate", "dp_shard"))),  # HSDP of 1-rank shards
    (ParallelDims(dp=1, tp=2, pp=1), 1, ((2,), ("tp",))),
])
def test_mesh_shape_names_each_parallelism_outermost_first(dims, replicate, expected):
    assert mesh_shape(dims, dp_replicate=replicate) == expected


def test_tensor_parallel_peers_are_neighbours_and_replicas_outermost():
    dims = ParallelDims(dp=2, tp=2, pp=2)  # 8 ranks
    got = [coords(r, dims) for r in range(8)]
    assert [(c.dp_rank, c.pp_rank, c.tp_rank) for c in got] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]
