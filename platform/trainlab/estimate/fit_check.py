"""A trial's estimate where the trial is planned, and its refusal when it cannot fit.

    cluster = config_cluster(run) or local_cluster(run, device="cpu")   # cluster.nodes, or here
    est = estimate_run(run, cluster)          # estimate_trial with cluster.calibration's efficiencies
    msg = refusal(run, est)                   # None if every rank fits its device, else the numbers and the fix

Who calls it: `trainlab estimate` (a cluster from config, this machine or a running Ray
cluster: launch.estimate_cluster), the Ray driver before any worker starts (launch.plan) and
torchrun's in-process plan (plan.here). Nothing here imports Ray: torchrun runs
without it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable

from trainlab.config import ConfigError
from trainlab.estimate.calibration import load_calibration
from trainlab.estimate.trial_estimate import estimate_trial
from trainlab.vocab.gpus import ray_type_of
from trainlab.vocab.nodes import CPU, ClusterSpec, NodeSpec

if TYPE_CHECKING:
    from trainlab.config import RunConfig
    from trainlab.config.layout_types import TrialLayout
    from trainlab.estimate.calibration import Calibration
    from trainlab.estimate.result import Estimate

def config_cluster(run: RunConfig) -> ClusterSpec | None:
    """The cluster described by cluster.nodes (with its links); None when the list is empty."""
    c = run.cluster
    if not c.nodes:
        return None
    return ClusterSpec.of_nodes(list(c.nodes), nvlink_gb_s=c.nvlink_gb_s, network_gb_s=c.network_gb_s)


def local_cluster(run: RunConfig, *, device: str) -> ClusterSpec:
    """This machine as the trial would use it: `device` cpu = cluster.num_workers gloo ranks on
    the host; cuda = its GPUs (one node of torch's device count, named as Ray names them)."""
    c = run.cluster
    if device != "cuda":
        return ClusterSpec(nodes=(NodeSpec(CPU, c.num_workers),), source="local")
    import torch

    node = NodeSpec(ray_type_of(torch.cuda.get_device_name(0)), torch.cuda.device_count())
    return ClusterSpec(nodes=(node,), nvlink_gb_s=c.nvlink_gb_s, network_gb_s=c.network_gb_s, source="local")


def torchrun_cluster(run: RunConfig, *, device: str) -> ClusterSpec:
    """The gang torchrun started: WORLD_SIZE ranks, LOCAL_WORLD_SIZE per node (every node
    alike: torchrun's --nproc-per-node), on this node's device type."""
    world = int(os.environ.get("WORLD_SIZE", run.cluster.num_workers))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world)) or world
    kind = CPU
    if device == "cuda":
        import torch

        kind = ray_type_of(torch.cuda.get_device_name(0))
    nodes = tuple(NodeSpec(kind, per_node) for _ in range(max(1, world // per_node)))
    c = run.cluster
    return ClusterSpec(nodes=nodes, nvlink_gb_s=c.nvlink_gb_s, network_gb_s=c.network_gb_s, source="local")


def calibration_of(run: RunConfig) -> Calibration | None:
    """cluster.calibration's efficiencies (None = the defaults); ValueError naming the field
    for a file that cannot be read."""
    path = run.cluster.calibration
    if not path:
        return None
    return load_calibration(path)  # its ValueErrors name cluster.calibration, the path and the fix


def estimate_run(run: RunConfig, cluster: ClusterSpec, *, trial_layout: TrialLayout) -> Estimate:
    """estimate_trial with cluster.calibration, for the layout the plan decided
    (plan.derive_layout.plan_layout); ValueError (field, value, fix) if it cannot; ConfigError
    (too_large) for a model whose weights alone overfill the whole cluster."""
    too_large = weights_refusal(run, cluster)
    if too_large:  # the estimate builds the model on the meta device: minutes for 10,000 layers
        raise ConfigError(too_large)
    return estimate_trial(run, cluster, trial_layout=trial_layout, calibration=calibration_of(run))


def weights_refusal(run: RunConfig, cluster: ClusterSpec) -> str | None:
    """None unless the model's parameters, counted from its dimensions at 2 bytes each (the least
    any precision keeps), exceed the memory of every device of `cluster` together (a host's once,
    however many CPU ranks share it): a model no layout can hold, refused in microseconds."""
    from trainlab.estimate.hardware import hardware
    from trainlab.estimate.shape import model_shape

    try:
        total_gb = sum(hardware(n.type).memory_gb * (1 if n.type == CPU else n.count) for n in cluster.nodes)
    except ValueError:
        return None  # a device the estimate does not know: estimate_trial says so
    params = model_shape(run).params
    need_gb = 2 * params / GB_SHOWN
    if need_gb <= total_gb:
        return None
    m = run.model
    where = " + ".join(sorted({n.type for n in cluster.nodes}))
    return (f"model.n_layers={m.n_layers} model.dim={m.dim} makes a model of {params:.3g} parameters: "
            f"{need_gb:,.1f} GB at 2 bytes each before gradients, optimizer state or activations, but "
            f"the devices it would run on ({where}) hold {total_gb:,.1f} GB together; fix: a smaller model "
            f"(lower model.n_layers or model.dim, or a model=OPTION such as model=small)")


# ---- refusal ------------------------------------------------------------------------------------

GB_SHOWN = 1e9


def memory_line(est: Estimate) -> str:
    """The tightest rank's memory by kind against its device: what a refusal shows."""
    r = est.tightest
    m = r.memory
    kinds = [("parameters", m.params), ("gradients", m.grads), ("optimizer state", m.optim_state),
             ("fp8 state", m.fp8_state), ("activations", m.activations), ("buffers", m.buffers),
             ("runtime", m.runtime)]
    parts = ", ".join(f"{name} {b / GB_SHOWN:.1f}" for name, b in kinds if b)
    return (f"rank {r.rank} needs {m.total_gb:.1f} GB ({parts}) but its {r.device.name} holds "
            f"{r.device.memory_gb:.1f} GB (short by {-r.headroom_gb:.1f} GB)")


def fixes(run: RunConfig, est: Estimate) -> list[str]:
    """What would shrink the tightest rank, largest share first: more shards of the state, activation
    checkpointing, a smaller micro-batch (only those the config does not already use)."""
    m = est.tightest.memory
    state, acts = m.state, m.activations + m.buffers
    layout = run.parallel.name
    shard = {"ddp": "parallel=fsdp (or parallel=zero1 / zero2: optimizer state and gradients sharded)",
             "zero1": "parallel=zero2 or parallel=fsdp (gradients and parameters sharded too)",
             "zero2": "parallel=fsdp (parameters sharded too)"}.get(
        layout, f"more ranks to shard over (cluster.num_workers={run.cluster.num_workers} now) or parallel=fsdp_tp")
    if run.cluster.num_workers == 1:  # one rank has nothing to shard over
        shard = "parallel=fsdp over more GPUs (cluster.num_workers=1 now)"
    act = []
    if run.parallel.activation_checkpoint != "block":
        act.append(f"parallel.activation_checkpoint=block (now {run.parallel.activation_checkpoint})")
    if run.train.micro_batch_size > 1:
        act.append(f"a smaller train.micro_batch_size (now {run.train.micro_batch_size})")
    fixes = [shard, *act] if state >= acts else [*act, shard]
    ranks = len(est.ranks)
    if m.params / ranks > est.tightest.device.memory_gb * GB_SHOWN:  # not even its weights, spread over every rank
        mc = run.model
        fixes.insert(0, f"a smaller model (model.n_layers={mc.n_layers}, model.dim={mc.dim} now: its parameters "
                        f"alone, spread over all {ranks} ranks, overfill them)")
    return fixes


def refusal(run: RunConfig, est: Estimate) -> str | None:
    """None if every rank's estimate fits its device; else one message with the numbers and the fix."""
    if est.fits:
        return None
    where = " + ".join(sorted({f"{r.device.name}" for r in est.ranks}))
    return (f"the trial does not fit its devices ({where}), by its estimate (trainlab estimate): "
            f"{memory_line(est)}; fix: {'; or '.join(fixes(run, est))}")


def checked_estimate(run: RunConfig, estimate: Callable[[], Estimate], *,
                     warn: Callable[[str], None]) -> Estimate | None:
    """`estimate()` where a trial is planned (the Ray driver's preflight for this machine, launch.plan
    for a joined cluster, torchrun): ConfigError with the numbers and the fix when it does not fit
    its devices, GPUs or a CPU host's memory alike (a trial that overfills a host fails in its
    workers, or takes the machine down with it). None, warned, where it cannot be made (a device
    or layout it has no numbers for): the trial goes on unestimated."""
    try:
        est = estimate()
    except ConfigError:
        raise
    except (ValueError, NotImplementedError) as e:
        warn(f"no estimate of the trial: {e}")
        return None
    why = refusal(run, est)
    if why:
        raise ConfigError(why)
    return est
