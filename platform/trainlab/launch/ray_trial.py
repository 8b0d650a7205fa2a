"""A trial on Ray: a Ray Train gang of N torch.distributed workers, progress streamed back.

The driver starts (or joins) the Ray cluster, asks Ray Train for N workers placed together
(its placement group: all or nothing), and each worker runs trainlab.engine.run_trial.
Rank 0 sends progress events and the final result through a small Ray queue; the driver
renders them while `fit()` runs in a thread.
"""

from __future__ import annotations

import dataclasses
import os
import queue as std_queue
import threading
from dataclasses import asdict, dataclass

from trainlab.config import RunConfig
from trainlab.config.validate import elastic_range
from trainlab.launch.interrupt import GangStop, TrialHandle, follow_stop_flag, rearm, stop_flag
from trainlab.launch.placement import Placement, accelerator_type, gpu_pools, place, scaling_options

_RAY_TRAIN_ENV = {
    # Ray Train's health checks poll every 2 s by default; a trial's end is noticed sooner
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
}


# Ray reads this when it is imported; "0" switches multi-node clusters off, as on macOS
_SINGLE_NODE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def local_node_options(host: str) -> dict:
    """ray.init keywords that make a local cluster listen on cluster.host (see ClusterConfig.host)."""
    if is_loopback(host):
        # ray.init swaps a loopback _node_ip_address for the machine's routable IP, and the GCS,
        # raylet and workers then listen on every interface; only with multi-node clusters off
        # (set before Ray is imported) does the node keep 127.0.0.1 and every service bind there
        os.environ.setdefault(_SINGLE_NODE_ENV, "0")
        return {"dashboard_host": "127.0.0.1", "_node_ip_address": "127.0.0.1"}
    if host in ("0.0.0.0", "::"):  # every interface: Ray picks the node IP for its services
        return {"dashboard_host": host}
    return {"dashboard_host": host, "_node_ip_address": host}


def connect(run: RunConfig) -> None:
    """ray.init: join cluster.address, or start a local cluster sized to this machine that
    listens on cluster.host (loopback unless told otherwise)."""
    node = {} if run.cluster.address else local_node_options(run.cluster.host)
    import ray

    if ray.is_initialized():
        return
    for k, v in _RAY_TRAIN_ENV.items():
        os.environ.setdefault(k, v)
    runtime_env = {"env_vars": {k: os.environ[k] for k in _RAY_TRAIN_ENV}}
    # worker stdout is Ray's internal chatter; what a person needs (progress, warnings,
    # errors with tracebacks) comes back through the event queue and Ray Train's exception
    if run.cluster.address:
        ray.init(address=run.cluster.address, runtime_env=runtime_env, log_to_driver=False)
        rearm()  # ray.init set its own SIGTERM handler: the driver's stops trials after a checkpoint
        return
    need = run.cluster.num_workers * run.cluster.cpus_per_worker
    context = ray.init(
        address="local",  # a cluster of our own, even when `ray start` left one on this machine
        num_cpus=max(os.cpu_count() or 1, need),  # logical CPUs: oversubscribe rather than hang
        include_dashboard=True, runtime_env=runtime_env, log_to_driver=False, **node,
    )
    rearm()
    node_ip = context.address_info.get("node_ip_address", "")
    if is_loopback(run.cluster.host) and not is_loopback(node_ip):
        from trainlab.console import console

        console.print(f"[yellow]warning:[/] cluster.host={run.cluster.host} but Ray was imported before "
                      f"trainlab could keep its services on loopback: they listen on {node_ip} too")


@dataclass(frozen=True)
class Gang:
    """How a trial's workers are asked of Ray, decided on the driver before any worker starts."""

    device: str
    """What the engine computes on: cpu or cuda."""
    gpus: bool
    """Each worker reserves one GPU (real, or logical with cluster.logical_gpus)."""
    placement: Placement | None = None
    """The GPU types the gang may use (None without GPUs)."""
    all_types: tuple[str, ...] = ()
    """Every GPU type of the cluster: a placement that may use all of them needs no selector."""

    def scaling(self, run: RunConfig) -> dict:
        """Ray Train ScalingConfig keywords; an elastic trial asks for (min, max) workers."""
        resources = {"CPU": run.cluster.cpus_per_worker, **({"GPU": 1} if self.gpus else {})}
        span = elastic_range(run)
        options = {"num_workers": span or run.cluster.num_workers, "use_gpu": self.gpus,
                   "resources_per_worker": resources, "placement_strategy": "PACK"}
        if span:
            options["elastic_resize_monitor_interval_s"] = run.cluster.resize_interval_s
        if self.placement is not None:
            options |= scaling_options(self.placement, all_types=self.all_types)
        return options


def plan_gang(run: RunConfig, device: str) -> Gang:
    """Join the cluster, resolve cluster.device=auto against its resources, and route a GPU
    trial to the GPU types that can run it; PlacementError (with each type's reason) if none."""
    connect(run)  # first: Ray must not be imported before it keeps a local cluster on loopback
    import ray

    if device == "auto":
        device = "cuda" if ray.cluster_resources().get("GPU", 0) > 0 and not run.cluster.logical_gpus else "cpu"
    gpus = device == "cuda" or run.cluster.logical_gpus
    if not gpus:
        return Gang(device=device, gpus=False)
    pools = gpu_pools(ray.nodes())
    return Gang(device=device, gpus=True, placement=place(run, pools),
                all_types=tuple(p.type for p in pools))


def _worker(payload: dict) -> None:
    """Runs in every Ray Train worker (its process group is already initialised)."""
    import ray.train

    from trainlab.config import from_dict
    from trainlab.engine.preemption import listen_outside
    from trainlab.engine.run import run_trial

    ctx = ray.train.get_context()
    run = from_dict(payload["config"])
    events = payload["events"]
    rank0 = ctx.get_world_rank() == 0

    def progress(event: dict) -> None:
        try:
            events.put_nowait(event)
        except Exception:  # a full or gone queue must never stop training
            pass

    listen_outside()  # every rank votes on the driver's stop request; rank 0 polls it
    polling = follow_stop_flag(payload["stop"]) if rank0 else None
    try:
        result = run_trial(run, tracker_factory=_tracker_factory(payload), local_rank=ctx.get_local_rank(),
                           progress=progress if rank0 else None, where=_where(run))
    finally:
        if polling is not None:
            polling.set()
    if rank0:
        events.put({"kind": "result", "result": dataclasses.asdict(result)})


def _where(run: RunConfig) -> tuple[str, str] | None:
    """(Ray node id, the node's accelerator type) for a worker holding a GPU; None (host and
    device name) otherwise."""
    import ray

    if run.cluster.device != "cuda" and not run.cluster.logical_gpus:
        return None
    node_id = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node["NodeID"] == node_id:
            return node_id, accelerator_type(node["Resources"]) or "GPU"
    return None


def _tracker_factory(payload: dict):
    mlflow_run = payload.get("mlflow")

    def factory(dist_info, resumed: bool = False):
        if mlflow_run:
            from trainlab.tracking.mlflow_tracker import MlflowTracker

            # the driver's tracker options, its spill file included (its close uses the same one).
            # Every attempt Ray Train starts logs into the one run the driver opened, and one started
            # again before a first checkpoint was complete replays steps 1.. from scratch: each drops
            # the steps the run already has (on the first attempt, none), resumed or not
            options = dict(mlflow_run)
            # the server's credentials, as MLflow's client (in the writer this starts) reads them
            os.environ.update(options.pop("credentials", None) or {})
            return MlflowTracker(**options, resume=True)
        from trainlab.tracking import JsonlTracker

        return JsonlTracker(os.path.join(payload["output_dir"], "metrics.jsonl"))
    return factory


def run_on_ray(run: RunConfig, *, gang: Gang, storage_path: str, name: str,
               mlflow_run: dict | None, on_event, handle: TrialHandle | None = None) -> dict | None:
    """Run one trial as a Ray Train gang of its own; returns rank 0's result dict (None if it
    never came). A sweep's trials share warm gangs instead (launch.gang_pool).

    Raises the Ray Train error if a worker failed. Interrupted (launch.interrupt), the gang
    stops after a checkpoint (rank 0's result says `preempted`), or is let go (None).
    `handle` stops this one trial (its rank 0 polls the same flag).
    """
    connect(run)  # before Ray is imported (see plan_gang)
    import ray
    from ray.train import FailureConfig, ScalingConfig
    from ray.train import RunConfig as RayRunConfig
    from ray.train.torch import TorchTrainer
    from ray.util.queue import Empty as QueueEmpty
    from ray.util.queue import Queue
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from trainlab.engine.distributed import backend_for
    from trainlab.launch.rendezvous import BoundTorchConfig

    run = dataclasses.replace(run, cluster=dataclasses.replace(run.cluster, device=gang.device))
    # on the driver's node, as Ray Train's controller is: a lost worker node must not take it along
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    events = Queue(maxsize=10_000, actor_options={"num_cpus": 0, "scheduling_strategy": here})
    stop = GangStop(stop_flag(scheduling_strategy=here))
    if handle is not None:
        handle.bind(lambda reason: stop.flag.raise_.remote())
    payload = {"config": asdict(run), "events": events, "mlflow": mlflow_run,
               "output_dir": run.output_dir, "stop": stop.flag}
    trainer = TorchTrainer(
        _worker,
        train_loop_config=payload,
        torch_config=BoundTorchConfig(backend=backend_for(gang.device)),  # listens on the node's IP only
        scaling_config=ScalingConfig(**gang.scaling(run)),
        run_config=RayRunConfig(name=name, storage_path=storage_path,
                                failure_config=FailureConfig(max_failures=run.cluster.max_failures)),
    )
    outcome: dict = {}

    def fit() -> None:
        try:
            trainer.fit()
        except BaseException as e:  # re-raised in the driver's thread below
            outcome["error"] = e

    thread = threading.Thread(target=fit, name="ray-train-fit", daemon=True)
    thread.start()
    result = None
    while not stop.give_up():
        try:
            event = events.get(timeout=0.5)
        except (std_queue.Empty, QueueEmpty):
            if not thread.is_alive() and events.empty():
                break
            continue
        if event.get("kind") == "result":
            result = event["result"]
        else:
            stop.saw(event)
            on_event(event)
    if handle is not None:
        handle.bind(None)
    if stop.abandoned:  # the driver's release of the cluster ends the gang
        return result
    thread.join()
    ray.kill(events.actor)
    ray.kill(stop.flag)
    if "error" in outcome:
        raise outcome["error"]
    return result
