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
    (size_refusal) for a model that cannot fit the whole cluster in any layout."""
    from trainlab.estimate.shape import check_estimable

    check_estimable(run)
    too_large = size_refusal(run, cluster, trial_layout=trial_layout)
    if too_large:  # the estimate builds the model on the meta device: minutes for 100,000 layers
        raise ConfigError(too_large)
    return estimate_trial(run, cluster, trial_layout=trial_layout, calibration=calibration_of(run))


DEEP_LAYERS = 512
"""Decoder layers beyond which building the model on the meta device for the estimate takes many
seconds (7 ms a layer measured on a loaded 2-core machine: 12 minutes for 100,000). A model that
deep is refused from its arithmetic alone when it cannot fit; a shallower one that can hold its
weights gets the estimate itself: its numbers rank by rank, and fixes by layout."""


def size_refusal(run: RunConfig, cluster: ClusterSpec, *, trial_layout: TrialLayout) -> str | None:
    """None unless the least memory the trial takes, from its config's arithmetic
    (estimate.least_memory: parameters, gradients, optimizer state and activations, each at its
    least), exceeds the memory of every device of `cluster` together (a host's once, however many
    CPU ranks share it), and the model is either deeper than DEEP_LAYERS or its weights alone, at
    2 bytes each, overfill the cluster: a trial no layout can hold, refused in milliseconds before
    anything builds the model."""
    from trainlab.estimate.hardware import hardware
    from trainlab.estimate.least_memory import least_memory

    if run.model._target_:
        return None  # your own module: its size is not known from the config
    try:
        total_gb = sum(hardware(n.type).memory_gb * (1 if n.type == CPU else n.count) for n in cluster.nodes)
    except ValueError:
        return None  # a device the estimate does not know: estimate_trial says so
    cal = calibration_of(run)
    least = least_memory(run, trial_layout=trial_layout, activation_factor=cal.activation_factor if cal else 1.0)
    if least.total / GB_SHOWN <= total_gb or (run.model.n_layers <= DEEP_LAYERS and 2 * least.params / GB_SHOWN <= total_gb):
        return None
    where = " + ".join(sorted({n.type for n in cluster.nodes}))
    acts = f" and {least.activations / GB_SHOWN:,.1f} GB of activations" if least.activations else ""
    return (f"{_model_words(run)} makes a model of {least.params:.3g} parameters: training it takes at least "
            f"{least.state / GB_SHOWN:,.1f} GB for its parameters, gradients and optimizer state{acts}, but the "
            f"devices it would run on ({where}) hold {total_gb:,.1f} GB together; fix: "
            + "; or ".join(_size_fixes(run, state_fits=least.state / GB_SHOWN <= total_gb, local=cluster.source == "local")))


def _model_words(run: RunConfig) -> str:
    """The model's size as the user set it: model.* fields, or model=hf's config.json keys (which
    override model.*: a fix must name them)."""
    m = run.model
    if m.name != "hf":
        return f"model.n_layers={m.n_layers} model.dim={m.dim}"
    value, field = m.hf_source()
    return f"{field}={value!r} (its config.json: num_hidden_layers={m.n_layers}, hidden_size={m.dim})"


def _size_fixes(run: RunConfig, *, state_fits: bool, local: bool) -> list[str]:
    m, p, t = run.model, run.parallel, run.train
    smaller = ("a smaller model (a config.json with fewer num_hidden_layers or a smaller hidden_size)" if m.name == "hf"
               else "a smaller model (lower model.n_layers or model.dim, or a model=OPTION such as model=small)")
    acts = []
    if p.activation_checkpoint != "block":
        acts.append(f"parallel.activation_checkpoint=block (now {p.activation_checkpoint})")
    if t.micro_batch_size > 1:
        acts.append(f"a smaller train.micro_batch_size (now {t.micro_batch_size})")
    fixes = [*acts, smaller] if state_fits else [smaller]
    if local:
        fixes.append("a cluster with more memory (cluster=ray cluster.address=HEAD:6379)")
    return fixes


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
        fixes.insert(0, f"a smaller model ({_model_words(run)} now: its parameters alone, spread over all "
                        f"{ranks} ranks, overfill them)")
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
