"""Where a trial's ranks land: each rank's device, node, mesh coordinates, groups and batch share.

    layout = Layout.of(run, cluster, trial_layout)   # trial_layout: plan.derive_layout.plan_layout(run)
    layout.hardware[r], layout.dp_group(r), layout.link(layout.tp_group(r)), layout.shares[dp_rank]

Ranks fill the cluster's nodes in order (ClusterSpec.rank_nodes, Ray's PACK), and sit on the
mesh as parallel.mesh lays them out (tp innermost, then pp, dp outermost; HSDP's dp split into
replicas of shard groups), so a group's link is the one its ranks really share.

Each data-parallel rank's share of the global batch is the engine's (data.shares.plan_shares):
equal, or with parallel.dp_balance=weighted / accumulate proportional to parallel.dp_weights, or,
where those are left to be measured, to each rank's peak (what a measured rate approaches).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainlab.config.layout_types import MeshCoords, TrialLayout, coords
from trainlab.config.schema import RunConfig
from trainlab.data.shares import plan_shares
from trainlab.estimate.hardware import Hardware, hardware
from trainlab.estimate.links import Link, group_link
from trainlab.vocab.nodes import CPU, ClusterSpec
from trainlab.vocab.precision import spec_of


@dataclass(frozen=True)
class Layout:
    run: RunConfig
    cluster: ClusterSpec
    trial_layout: TrialLayout
    """The degrees, accumulation and pipeline micro-batches the plan decided (plan.derive_layout)."""
    world: int
    hardware: tuple[Hardware, ...]
    nodes: tuple[int, ...]
    coords: tuple[MeshCoords, ...]
    shares: tuple[tuple[int, int], ...]
    """Per data-parallel rank: (sequences, micro-batches) of every optimizer step."""
    threads: tuple[float, ...]
    """CPU ranks: the cores each one computes on (cluster.cpus_per_worker; a share of one when the
    node's ranks ask for more cores than the host has); GPUs: 1."""

    @classmethod
    def of(cls, run: RunConfig, cluster: ClusterSpec, trial_layout: TrialLayout) -> Layout:
        world = run.cluster.num_workers
        nodes = cluster.rank_nodes(world)  # ValueError naming cluster.num_workers if too few devices
        types = [cluster.nodes[n].type for n in nodes]
        kinds = {"cpu" if t == CPU else "gpu" for t in types}
        if len(kinds) > 1:
            raise ValueError(f"cluster.nodes={cluster.describe()} mixes CPU and GPU nodes for one gang; a "
                             "trial computes on one device kind: describe only GPU nodes or only cpu")
        hws = {t: hardware(t) for t in set(types)}
        dims = trial_layout.dims
        threads = [1.0] * world
        if kinds == {"cpu"}:
            threads = [_cpu_threads(run, cluster, n, nodes) for n in nodes]
        layout = cls(run=run, cluster=cluster, trial_layout=trial_layout, world=world,
                     hardware=tuple(hws[t] for t in types),
                     nodes=tuple(nodes), coords=tuple(coords(r, dims) for r in range(world)),
                     shares=(), threads=tuple(threads))
        return _with_shares(layout)

    def peak_tflops(self, rank: int, dtype: str) -> float | None:
        peak = self.hardware[rank].peak_tflops(dtype)
        return None if peak is None else peak * self.threads[rank]

    def link(self, ranks: list[int]) -> Link:
        return group_link(ranks=ranks, rank_nodes=self.nodes, cluster=self.cluster,
                          device_types=[h.type for h in self.hardware],
                          nvlink_gb_s=[h.nvlink_gb_s for h in self.hardware])

    # ---- groups (global ranks), as parallel.mesh builds them ----------------------------
    def tp_group(self, rank: int) -> list[int]:
        tp = self.run.parallel.tp
        base = rank - rank % tp
        return list(range(base, base + tp))

    def pp_group(self, rank: int) -> list[int]:
        dims = self.trial_layout.dims
        c = self.coords[rank]
        return [c.dp_rank * dims.tp * dims.pp + s * dims.tp + c.tp_rank for s in range(dims.pp)]

    def dp_group(self, rank: int) -> list[int]:
        dims = self.trial_layout.dims
        c = self.coords[rank]
        return [d * dims.tp * dims.pp + c.pp_rank * dims.tp + c.tp_rank for d in range(dims.dp)]

    def shard_group(self, rank: int) -> list[int]:
        """HSDP: the dp ranks of this rank's replica (dp_shard, inner)."""
        group, shard = self.dp_group(rank), self._dp_shard
        start = self.coords[rank].dp_rank // shard * shard
        return group[start:start + shard]

    def replica_group(self, rank: int) -> list[int]:
        """HSDP: the dp ranks holding the same shard in the other replicas."""
        group, shard = self.dp_group(rank), self._dp_shard
        return group[self.coords[rank].dp_rank % shard::shard]

    @property
    def _dp_shard(self) -> int:
        return self.trial_layout.dims.dp // self.run.parallel.dp_replicate

    # ---- pipeline stages -----------------------------------------------------------------
    def blocks_of(self, rank: int, *, shape, virtual: int) -> list[int]:
        """The block indices of the stages `rank` holds (parallel.pp.split_stages's split)."""
        pp = self.trial_layout.dims.pp
        per_stage = shape.n_layers // (pp * virtual)
        pp_rank = self.coords[rank].pp_rank
        return [b for v in range(virtual) for b in range((v * pp + pp_rank) * per_stage,
                                                         (v * pp + pp_rank + 1) * per_stage)]

    def holds_head(self, rank: int, *, virtual: int) -> bool:
        pp = self.trial_layout.dims.pp
        return self.coords[rank].pp_rank == pp - 1  # the last stage (of the last virtual chunk)


def _cpu_threads(run: RunConfig, cluster: ClusterSpec, node: int, nodes: list[int]) -> float:
    import os

    ranks_here = nodes.count(node)
    cores = len(os.sched_getaffinity(0)) if cluster.source == "local" else run.cluster.cpus_per_worker * ranks_here
    # ranks asking for more cores than the host has share them (the OS time-slices their threads):
    # 4 ranks on 2 cores compute at half a core each
    return min(run.cluster.cpus_per_worker, cores / ranks_here)


def _with_shares(layout: Layout) -> Layout:
    run = layout.run
    p, t = run.parallel, run.train
    dims = layout.trial_layout.dims
    if dims.pp > 1 or p.dp_balance == "equal":
        accum = layout.trial_layout.grad_accum_steps
        shares = [(t.global_batch_size // dims.dp, accum)] * dims.dp
    else:
        weights = list(p.dp_weights) or _peak_weights(layout)
        shares = [(s.sequences, s.micro_batches) for s in plan_shares(
            p.dp_balance, weights, global_batch_size=t.global_batch_size, micro_batch_size=t.micro_batch_size)]
    return Layout(**{**layout.__dict__, "shares": tuple(shares)})


def _peak_weights(layout: Layout) -> list[float]:
    """Measured weights approach each rank's compute rate: its peak for the mode's matmul dtype."""
    spec = spec_of(layout.run.precision.name)
    dtype = spec.matmul_dtype(layout.run.precision.hp_dtype)
    return [layout.peak_tflops(r, dtype) or layout.peak_tflops(r, "fp32") or 1.0 for r in range(layout.world)]
