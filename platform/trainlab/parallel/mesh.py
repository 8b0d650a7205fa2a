"""The DeviceMesh of a layout: one named dimension per parallelism, ranks laid out dp-major.

Rank r sits at (dp, pp, tp) = divmod chains of r with tp innermost, so tensor-parallel peers
are neighbours (on one node when nodes hold tp or more GPUs: TP's all-reduces are the most
frequent) and pipeline stages next, data-parallel replicas outermost. HSDP splits dp into
(dp_replicate, dp_shard). Other dimensions of degree 1 are left out of the mesh.
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from trainlab.config.layout_types import ParallelDims


def mesh_shape(dims: ParallelDims, *, dp_replicate: int = 1) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(sizes, names) of the mesh for `dims`, outermost first, degree-1 dimensions dropped
    (a 1-D data-parallel mesh when nothing else is set)."""
    dp_dims = [("dp_replicate", dp_replicate), ("dp_shard", dims.dp // dp_replicate)] \
        if dp_replicate > 1 else [("dp", dims.dp)]
    # HSDP keeps both of its dimensions (a shard group of 1 is still the dimension FSDP2 shards on)
    parts = [(n, s) for n, s in (*dp_dims, ("pp", dims.pp), ("tp", dims.tp))
             if s > 1 or (dp_replicate > 1 and n == "dp_shard")]
    if not parts:
        parts = [("dp", 1)]
    return tuple(s for _, s in parts), tuple(n for n, _ in parts)


def build_mesh(dims: ParallelDims, *, device_type: str, dp_replicate: int = 1) -> DeviceMesh:
    sizes, names = mesh_shape(dims, dp_replicate=dp_replicate)
    return init_device_mesh(device_type, sizes, mesh_dim_names=names)
