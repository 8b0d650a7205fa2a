"""Which GPU types of a Ray cluster can run a trial, decided before any worker starts.

    pools = gpu_pools(ray.nodes())                 # [GpuPool('H100', gpus=8, nodes=1), ...]
    choice = place(run, pools)                     # Placement(types=('H100',), ...) or PlacementError

Ray gives every GPU node a resource ``accelerator_type:<TYPE>`` (names from
``ray.util.accelerators``: H100, A100, V100, ...). The GPU catalog (vocab.gpus) gives each
its CUDA compute capability; `precision.capability` says what each precision mode needs
(FP8 tensor cores SM 8.9+, BF16 8.0+, FP16 any CUDA GPU). A trial is routed to the types
that pass its precision, its own asks (`cluster.accelerator_type`, `cluster.min_capability`)
and its memory estimate (memory_reason: what one rank needs must fit the type's
memory); a trial that no type can run is refused with one reason per type, instead of waiting
forever for resources that will never appear, or dying of out-of-memory once it got them.

`cluster.placement` says how a gang may use those types:
- ``same_type``: every worker on one GPU type (the least capable type that holds the gang, so
  the GPUs only some precisions can use stay free for them);
- ``pack`` / ``spread``: any mix of eligible types, workers packed onto few nodes or spread
  over many (Ray placement-group strategies PACK / SPREAD).

A mixed cluster on one machine (logical GPUs; how the tests build one). Ray 2.60 heads turn on
token authentication, so every `ray start` and driver needs RAY_AUTH_MODE=token:

    export RAY_AUTH_MODE=token
    ray start --head --port 6391 --num-gpus 2 --resources '{"accelerator_type:H100": 1}'
    ray start --address 127.0.0.1:6391 --num-gpus 2 --resources '{"accelerator_type:V100": 1}'
    # gpu_pools(ray.nodes()) -> [GpuPool('H100', 2.0, 1), GpuPool('V100', 2.0, 1)]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainlab.config import ConfigError
from trainlab.config.schema import PLACEMENTS, RunConfig
from trainlab.estimate.fit_check import estimate_run, fixes, memory_line
from trainlab.plan.derive_layout import plan_layout
from trainlab.plan.trial_plan import GangShape
from trainlab.precision.capability import check_precision_on_gpu
from trainlab.vocab.gpus import by_ray_type
from trainlab.vocab.nodes import ClusterSpec, NodeSpec

ACCELERATOR_RESOURCE_PREFIX = "accelerator_type:"


class PlacementError(ValueError):
    """No GPU type of the cluster can run the trial; the message gives each type's reason."""


@dataclass(frozen=True)
class GpuPool:
    """The GPUs of one accelerator type in the cluster."""

    type: str
    gpus: float
    nodes: int

    @property
    def capability(self) -> tuple[int, int] | None:
        gpu = by_ray_type(self.type)
        return gpu.capability if gpu else None


@dataclass(frozen=True)
class Placement:
    """Where a trial's gang may go."""

    types: tuple[str, ...]
    """Accelerator types the workers may use (one for same_type)."""
    strategy: str
    """Ray placement-group strategy: PACK or SPREAD."""


ACCELERATOR_LABEL = "ray.io/accelerator-type"
"""The node label Ray sets from a GPU node's accelerator type (label selectors match on it)."""


def scaling_options(placement: Placement, *, all_types: tuple[str, ...] = ()) -> dict:
    """Ray Train ScalingConfig keywords for a placement: one type through `accelerator_type`
    (Ray adds a sliver of ``accelerator_type:<TYPE>`` to every worker's bundle), several
    through a label selector ``in(A, B)`` on the accelerator-type label, none when the
    placement may use every type the cluster has."""
    options = {"placement_strategy": placement.strategy}
    if len(placement.types) == 1:
        options["accelerator_type"] = placement.types[0]
    elif set(all_types) - set(placement.types):
        options["label_selector"] = {ACCELERATOR_LABEL: f"in({', '.join(placement.types)})"}
    return options


def accelerator_type(resources: dict) -> str:
    """A node's GPU type from its Ray resources (``accelerator_type:<TYPE>``); '' if none."""
    types = [k[len(ACCELERATOR_RESOURCE_PREFIX):] for k in resources
             if k.startswith(ACCELERATOR_RESOURCE_PREFIX)]
    return types[0] if types else ""


def gpu_pools(nodes: list[dict]) -> list[GpuPool]:
    """GPU pools from `ray.nodes()` (alive nodes only), largest first. A GPU node that
    declares no accelerator type counts as type ''."""
    gpus: dict[str, float] = {}
    count: dict[str, int] = {}
    for node in nodes:
        if not node.get("Alive", True):
            continue
        resources = node.get("Resources", {})
        if resources.get("GPU", 0) <= 0:
            continue
        kind = accelerator_type(resources)
        gpus[kind] = gpus.get(kind, 0) + resources["GPU"]
        count[kind] = count.get(kind, 0) + 1
    return sorted((GpuPool(k, gpus[k], count[k]) for k in gpus), key=lambda p: (-p.gpus, p.type))


def parse_capability(text: str) -> tuple[int, int]:
    """'8.9' -> (8, 9); ValueError naming cluster.min_capability otherwise."""
    major, dot, minor = text.partition(".")
    if not (major.isdigit() and (not dot or minor.isdigit())):
        raise ValueError(f"cluster.min_capability={text!r} is not MAJOR.MINOR; write e.g. "
                         "cluster.min_capability=8.9")
    return int(major), int(minor or 0)


def why_not(run: RunConfig, pool: GpuPool) -> str | None:
    """Why `pool` cannot run the trial, or None if it can (precision and the trial's asks)."""
    c = run.cluster
    if c.accelerator_type and pool.type != c.accelerator_type:
        return f"cluster.accelerator_type={c.accelerator_type} asks for another type"
    cap = pool.capability
    if cap is None:
        return (f"its compute capability is unknown (add {pool.type or 'the type'} to "
                "trainlab.vocab.gpus.GPUS, or start the node with "
                "--resources '{\"accelerator_type:H100\": 1}')")
    if c.min_capability and cap < parse_capability(c.min_capability):
        return f"compute capability {cap[0]}.{cap[1]} < cluster.min_capability={c.min_capability}"
    try:
        check_precision_on_gpu(run.precision, capability=cap, device_name=pool.type)
    except ValueError as e:
        return str(e)
    return memory_reason(run, pool)  # last (it builds the model on meta): the estimate must fit the type's memory


def place(run: RunConfig, pools: list[GpuPool]) -> Placement:
    """The accelerator types this trial's gang may use, or PlacementError with every reason."""
    c = run.cluster
    reasons = {p.type: why_not(run, p) for p in pools}
    fit = [p for p in pools if reasons[p.type] is None]
    need = c.num_workers
    if c.placement == "same_type":
        # the least capable type that holds the whole gang: keep FP8/BF16-capable GPUs free
        # for the trials that need them
        whole = sorted((p for p in fit if p.gpus >= need), key=lambda p: (p.capability, -p.gpus))
        if whole:
            return Placement(types=(whole[0].type,), strategy="PACK")
        for p in fit:
            reasons[p.type] = (f"{p.gpus:g} GPU(s) < cluster.num_workers={need} with "
                               "cluster.placement=same_type (allow a mix with placement=pack)")
    elif fit and sum(p.gpus for p in fit) >= need:
        return Placement(types=tuple(p.type for p in fit), strategy=c.placement.upper())
    elif fit:
        reasons[""] = (f"the eligible types ({', '.join(p.type for p in fit)}) have "
                       f"{sum(p.gpus for p in fit):g} GPU(s) < cluster.num_workers={need}")
    if not pools:
        raise PlacementError(f"precision={run.precision.name} on cluster.device=cuda: the cluster "
                             "has no GPU nodes; use cluster.device=cpu or add GPU nodes")
    lines = [f"{t or 'all'}: {r}" for t, r in reasons.items() if r]
    raise PlacementError(f"no GPU type of the cluster can run this trial "
                         f"(precision={run.precision.name}, cluster.num_workers={need}):\n  "
                         + "\n  ".join(lines))


__all__ = ["PLACEMENTS", "GpuPool", "Placement", "PlacementError",
           "gpu_pools", "parse_capability", "place", "scaling_options", "why_not"]


def pool_cluster(run: RunConfig, pool: GpuPool) -> ClusterSpec:
    """The trial's gang wholly on `pool`'s type, its nodes as the pool has them (as many more as
    the gang needs: whether the pool has enough GPUs is placement's question, not memory's)."""
    per_node = max(1, int(pool.gpus // max(pool.nodes, 1)))
    count = max(pool.nodes, math.ceil(run.cluster.num_workers / per_node))
    c = run.cluster
    return ClusterSpec(nodes=tuple(NodeSpec(pool.type, per_node) for _ in range(count)),
                       nvlink_gb_s=c.nvlink_gb_s, network_gb_s=c.network_gb_s, source="ray")


def memory_reason(run: RunConfig, pool: GpuPool) -> str | None:
    """Why the trial's estimate does not fit `pool`'s GPUs, or None (it fits, or the type is one
    the estimate has no numbers for: placement's other checks decide then)."""
    try:
        est = estimate_run(run, pool_cluster(run, pool), trial_layout=plan_layout(run))
    except ConfigError as e:  # more than the whole pool holds in any layout (fit_check.size_refusal)
        return str(e)
    except (ValueError, NotImplementedError):  # a type or layout it has no numbers for
        return None
    if est.fits:
        return None
    return f"by its estimate, {memory_line(est)}; fix: {'; or '.join(fixes(run, est))}"


def scaling(gang: GangShape) -> dict:
    """Ray Train ScalingConfig keywords; an elastic trial asks for (min, max) workers."""
    resources = {"CPU": gang.cpus_per_worker, **({"GPU": 1} if gang.gpus else {})}
    options = {"num_workers": gang.elastic or gang.num_workers, "use_gpu": gang.gpus,
               "resources_per_worker": resources, "placement_strategy": "PACK"}
    if gang.elastic:
        options["elastic_resize_monitor_interval_s"] = gang.resize_interval_s
    if gang.accelerator_types:
        options |= scaling_options(Placement(types=gang.accelerator_types, strategy=gang.strategy),
                                   all_types=gang.all_types)
    return options
