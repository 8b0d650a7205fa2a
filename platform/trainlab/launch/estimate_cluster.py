"""Estimates against a running Ray cluster: its nodes as a ClusterSpec, and the estimate the
driver puts in a trial's plan (placement's memory check is launch.placement.memory_reason).

    cluster = ray_cluster(ray.nodes(), run, gpus=True, types=("H100",))   # the nodes a gang may use
    est = placed_estimate(run, gang, layout)   # launch.plan: the trial on the devices it was placed on

A GPU node is read by its accelerator type (``accelerator_type:<TYPE>``, launch.placement) and
GPU count; a CPU trial's ranks fill each node's CPUs, cluster.cpus_per_worker each. Nodes come
in gpu_pools' order (the largest pool first), the order the estimate packs ranks onto them.
"""

from __future__ import annotations

from trainlab.config import RunConfig
from trainlab.config.layout import TrialLayout
from trainlab.estimate.fits import config_cluster, estimate_run, local_cluster
from trainlab.estimate.result import Estimate
from trainlab.launch.placement import PlacementError, accelerator_type, gpu_pools, place
from trainlab.launch.preflight import check_cluster
from trainlab.launch.ray_trial import connect
from trainlab.plan.trial import GangShape
from trainlab.vocab.nodes import CPU, ClusterSpec, NodeSpec


def ray_cluster(nodes: list[dict], run: RunConfig, *, gpus: bool, types: tuple[str, ...] = ()) -> ClusterSpec:
    """The alive nodes of `ray.nodes()` a trial's gang may use: GPU nodes of `types` (every GPU
    type when empty) for a GPU gang, else every node's CPUs as ranks of cluster.cpus_per_worker."""
    c = run.cluster
    alive = [n for n in nodes if n.get("Alive", True)]
    specs: list[NodeSpec] = []
    if gpus:
        for pool in gpu_pools(alive):
            if types and pool.type not in types:
                continue
            specs += [NodeSpec(pool.type or "GPU", int(n["Resources"]["GPU"])) for n in alive
                      if n.get("Resources", {}).get("GPU", 0) > 0 and accelerator_type(n["Resources"]) == pool.type]
    else:
        specs = [NodeSpec(CPU, int(n["Resources"].get("CPU", 0) // c.cpus_per_worker)) for n in alive
                 if n.get("Resources", {}).get("CPU", 0) >= c.cpus_per_worker]
    if not specs:
        what = f"GPU nodes of type {', '.join(types)}" if types else "GPU nodes" if gpus else "CPU nodes"
        raise ValueError(f"cluster.address={c.address or 'auto'}: the running Ray cluster has no {what} to "
                         "estimate on; describe the cluster instead with cluster.nodes=[8xH100,...]")
    return ClusterSpec(nodes=tuple(specs), nvlink_gb_s=c.nvlink_gb_s, network_gb_s=c.network_gb_s, source="ray")


def placed_estimate(run: RunConfig, gang: GangShape, layout: TrialLayout) -> Estimate:
    """The trial on the devices its gang was given: the placement's GPU types of the joined
    cluster, or CPU ranks (the cluster's nodes when joined, this machine's for a local one).
    ValueError where the estimate cannot be made."""
    import ray

    if gang.gpus:
        return estimate_run(run, ray_cluster(ray.nodes(), run, gpus=True, types=gang.accelerator_types),
                            trial_layout=layout)
    if run.cluster.address:
        return estimate_run(run, ray_cluster(ray.nodes(), run, gpus=False), trial_layout=layout)
    return estimate_run(run, local_cluster(run, device="cpu"), trial_layout=layout)


def described_cluster(run: RunConfig) -> tuple[ClusterSpec, str]:
    """`trainlab estimate`'s cluster and a note on it: cluster.nodes; else the running cluster at
    cluster.address (the nodes placement gives the gang; all its GPUs, with placement's reasons
    as the note, when no type can take it); else this machine."""
    from trainlab.devices import resolve_device

    described = config_cluster(run)
    if described is not None:
        return described, ""
    if not run.cluster.address:
        import torch

        device = resolve_device(run.cluster.device, gpus=torch.cuda.is_available(),
                                logical_gpus=run.debug.logical_gpus)
        return local_cluster(run, device=device), ""
    check_cluster(run)  # ValueError now, not ray.init retrying for minutes, when nothing answers there
    connect(run)
    import ray

    device = resolve_device(run.cluster.device, gpus=ray.cluster_resources().get("GPU", 0) > 0,
                            logical_gpus=run.debug.logical_gpus)
    if not (device == "cuda" or run.debug.logical_gpus):
        return ray_cluster(ray.nodes(), run, gpus=False), ""
    pools = gpu_pools(ray.nodes())
    try:
        placement = place(run, pools)
    except PlacementError as e:  # shown beside the estimate on every GPU of the cluster
        return ray_cluster(ray.nodes(), run, gpus=True), f"refused at launch: {e}"
    others = [p.type for p in pools if p.type not in placement.types]
    note = f"placed on {', '.join(placement.types)}" + (f" (not {', '.join(others)})" if others else "")
    return ray_cluster(ray.nodes(), run, gpus=True, types=placement.types), note
