"""A running Ray cluster's nodes as a ClusterSpec: the devices the driver's plan estimates a
trial on (placement's memory check is launch.placement.memory_reason).

    cluster = ray_cluster(ray.nodes(), run, gpus=True, types=("H100",))   # the nodes a gang may use
    cluster = placed_cluster(run, gang)   # launch.plan -> plan_trial: the devices it was placed on

A GPU node is read by its accelerator type (``accelerator_type:<TYPE>``, launch.placement) and
GPU count; a CPU trial's ranks fill each node's CPUs, cluster.cpus_per_worker each. Nodes come
in gpu_pools' order (the largest pool first), the order the estimate packs ranks onto them.
"""

from __future__ import annotations

from trainlab.config import RunConfig
from trainlab.estimate.fit_check import local_cluster
from trainlab.launch.placement import accelerator_type, gpu_pools
from trainlab.plan.trial_plan import GangShape
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


def placed_cluster(run: RunConfig, gang: GangShape) -> ClusterSpec:
    """The devices a trial's gang was given: the placement's GPU types of the joined cluster, or
    CPU ranks (the cluster's nodes when joined, this machine's for a local one). ValueError where
    they cannot be read."""
    import ray

    if gang.gpus:
        return ray_cluster(ray.nodes(), run, gpus=True, types=gang.accelerator_types)
    if run.cluster.address:
        return ray_cluster(ray.nodes(), run, gpus=False)
    return local_cluster(run, device="cpu")
