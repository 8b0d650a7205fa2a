"""A trial on Ray: a Ray Train gang of N torch.distributed workers, progress streamed back.

The driver starts (or joins) the Ray cluster, asks Ray Train for N workers placed together
(its placement group: all or nothing), and each worker runs trainlab.engine.run_trial.
Rank 0 sends progress events and the final result through a small Ray actor (launch.event_stream,
whose calls never fail); the driver renders them while `fit()` runs in a thread.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path
from typing import Callable

from trainlab.config import RunConfig
from trainlab.events import ProgressEvent, TrialFinished, TrialResult
from trainlab.launch.interrupt import GangStop, StopRequest, follow_stop_flag, handling, rearm
from trainlab.launch.placement import accelerator_type, scaling
from trainlab.launch.ray_reaper import reap, start_reaper
from trainlab.plan.trial_plan import TrialPlan
from trainlab.tracking.trial_tracking import TrackingTarget, rank0_tracker

_RAY_TRAIN_ENV = {
    # Ray Train's health checks poll every 2 s by default; a trial's end is noticed sooner
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
    # Ray Train's PreemptionWatcher (an actor, a process, per gang start) reports cloud preemption
    # notices to ray.train.get_preemption_info, which trainlab does not read: a stop signal reaches
    # a trial through the driver (launch.interrupt) and engine.preemption's vote
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    # Ray starts its workers 15 nicer than its raylet, to yield to the GCS and raylet: a trial's
    # workers then yield to every other process of the machine too (a data job, a trial under
    # torchrun, another test), starved to a few per cent of a core beside busy ones (a 3-step trial
    # waited 5 min for its gang beside 3). Here they keep the raylet's priority (the command's, or
    # `ray start`'s on a joined cluster), as torchrun's ranks keep theirs; Ray's job supervisor does
    # the same for a job's driver
    "RAY_worker_niceness": "0",
}


def trial_runtime_env() -> dict:
    """The runtime env of every Ray process a trainlab command starts (its job's, given to
    ray.init): _RAY_TRAIN_ENV, each value as this process's environment already has it, else
    trainlab's. Also what the tests' own cluster (tests/conftest.ray_cluster) is started with."""
    for k, v in _RAY_TRAIN_ENV.items():
        os.environ.setdefault(k, v)
    return {"env_vars": {k: os.environ[k] for k in _RAY_TRAIN_ENV}}


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


def start_local_cluster(*, num_cpus: int, host: str = "127.0.0.1", include_dashboard: bool = True,
                        runtime_env: dict | None = None):
    """ray.init of a local cluster of this process's own, listening on `host`: never one that
    `ray start` runs on this machine, RAY_ADDRESS names, or a crashed one's `ray_current_cluster`
    file in Ray's temp folder points at (joining one is cluster.address's, connect()). The one
    way trainlab, and the tests' fixtures, start Ray here."""
    node = local_node_options(host)  # before Ray is imported
    import ray

    # a terminal that closes sends SIGHUP to every process of the command, Ray's services
    # included, which would die at once: started with it blocked (a thread's mask is inherited),
    # they leave it to the driver, whose handler stops the trials after a checkpoint and then
    # ends them (launch.interrupt)
    hangup = [signal.SIGHUP] if hasattr(signal, "SIGHUP") else []
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, hangup)
    try:
        for attempt in range(1, LOCAL_STARTS + 1):
            ours = _own_sessions()
            try:
                with driver_keeps_sigterm():
                    context = ray.init(address="local", num_cpus=num_cpus, include_dashboard=include_dashboard,
                                       runtime_env=runtime_env, log_to_driver=False, **node)
                break
            except Exception as e:  # Ray raises a bare Exception for it
                if RAY_START_TIMED_OUT not in str(e) or attempt == LOCAL_STARTS:
                    raise
                for session in _own_sessions() - ours:  # the GCS, raylet and dashboard it left
                    reap(str(session))
                from trainlab.console import warn

                warn(f"Ray's local cluster did not start in its 30 s (a busy machine?): starting it again "
                     f"(try {attempt + 1} of {LOCAL_STARTS})")
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    start_reaper(context.address_info["session_dir"])  # ends what a SIGKILLed driver leaves of it
    return context


LOCAL_STARTS = 2
"""Tries at starting a local cluster. Ray waits a fixed 30 s for its raylet to register with the
GCS (ray 2.60, ray._private.node.Node: not configurable) and then fails the start; on a busy
2-core machine it did not make it once in a CI run (2026-12-07, a sweep's second command)."""
RAY_START_TIMED_OUT = "timed out during startup"
"""In the message of Ray's exception for it."""


def _own_sessions() -> set[Path]:
    """The session folders of local clusters this process started (Ray names them
    session_<time>_<pid> in its temp folder): never another process's."""
    from trainlab.launch.preflight import ray_address_file

    return set(ray_address_file().parent.glob(f"session_*_{os.getpid()}"))


@contextlib.contextmanager
def driver_keeps_sigterm():
    """ray.init (and the head node it starts) sets a SIGTERM handler that exits at once,
    sys.exit(15): a SIGTERM while Ray starts (seconds on a small machine) ended the command with
    no line. While the driver's handlers take the stop signals (launch.interrupt), Ray's is not
    set: the signal is recorded, and the lifecycle ends the trial before it starts, in its line.
    Ray sets it through one function (ray._private.utils.set_sigterm_handler, ray 2.60), made a
    no-op for the call; its atexit hook still ends the processes it started."""
    if not handling():
        yield
        return
    import ray._private.utils as ray_utils

    original = ray_utils.set_sigterm_handler
    ray_utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        ray_utils.set_sigterm_handler = original
        rearm()


def connect(run: RunConfig) -> None:
    """ray.init: join cluster.address, or start a local cluster sized to this machine that
    listens on cluster.host (loopback unless told otherwise)."""
    if not run.cluster.address:
        local_node_options(run.cluster.host)  # before Ray is imported
    elif is_loopback(run.cluster.address.rpartition(":")[0] or run.cluster.address):
        # a cluster on this machine's loopback: ray.init swaps a loopback address for the machine's
        # routable IP (services.resolve_ip_for_localhost) unless multi-node clusters are off
        os.environ.setdefault(_SINGLE_NODE_ENV, "0")
    import ray

    if ray.is_initialized():
        return
    runtime_env = trial_runtime_env()
    # worker stdout is Ray's internal chatter; what a person needs (progress, warnings,
    # errors with tracebacks) comes back through the event queue and Ray Train's exception
    if run.cluster.address:
        with driver_keeps_sigterm():
            ray.init(address=run.cluster.address, runtime_env=runtime_env, log_to_driver=False)
        return
    need = run.cluster.num_workers * run.cluster.cpus_per_worker
    context = start_local_cluster(num_cpus=max(os.cpu_count() or 1, need),  # logical CPUs: oversubscribe rather than hang
                                  host=run.cluster.host, include_dashboard=True, runtime_env=runtime_env)
    node_ip = context.address_info.get("node_ip_address", "")
    if is_loopback(run.cluster.host) and not is_loopback(node_ip):
        from trainlab.console import console

        console.print(f"[yellow]warning:[/] cluster.host={run.cluster.host} but Ray was imported before "
                      f"trainlab could keep its services on loopback: they listen on {node_ip} too")


def _worker(payload: dict) -> None:
    """Runs in every Ray Train worker (its process group is already initialised)."""
    import ray
    import ray.train

    ctx = ray.train.get_context()
    plan: TrialPlan = payload["plan"]  # as the driver resolved it: nothing here validates or decides it again
    events = payload["events"]
    rank0 = ctx.get_world_rank() == 0

    def progress(event: ProgressEvent) -> None:
        try:
            ray.get(events.put.remote(event))
        except Exception:  # a gone stream must never stop training
            pass

    result = execute_on_worker(plan, payload["tracking"], local_rank=ctx.get_local_rank(), rank0=rank0,
                               progress=progress, follow=lambda: follow_stop_flag(payload["stop"]))
    if rank0:
        ray.get(events.put.remote(TrialFinished(result), final=True))


def execute_on_worker(plan: TrialPlan, target: TrackingTarget, *, local_rank: int, rank0: bool,
                      progress: Callable[[ProgressEvent], None], follow: Callable[[], threading.Event]) -> TrialResult:
    """One Ray Train worker's part of a planned trial, in a gang of its own (_worker) or a warm
    one (launch.gang_worker): every rank votes on the driver's stop request and rank 0 polls it
    (`follow`: launch.interrupt.follow_stop_flag on the trial's flag), sends the progress events
    and logs into the run the driver opened."""
    from trainlab.engine.preemption import listen_outside
    from trainlab.engine.run import run_trial

    listen_outside()
    polling = follow() if rank0 else None
    try:
        return run_trial(plan, tracker_factory=_tracker_factory(plan, target), local_rank=local_rank,
                         progress=progress if rank0 else None, where=_where(plan))
    finally:
        if polling is not None:
            polling.set()


def _where(plan: TrialPlan) -> tuple[str, str] | None:
    """(Ray node id, the node's accelerator type) for a worker holding a GPU; None (host and
    device name) otherwise."""
    import ray

    if not plan.gang.gpus:
        return None
    node_id = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node["NodeID"] == node_id:
            return node_id, accelerator_type(node["Resources"]) or "GPU"
    return None


def _tracker_factory(plan: TrialPlan, target: TrackingTarget):
    def factory(dist_info, resumed: bool = False):
        # Every attempt Ray Train starts logs into the one run the driver opened, and one started
        # again before a first checkpoint was complete replays steps 1.. from scratch: each drops
        # the steps the run already has (on the first attempt, none), resumed or not
        return rank0_tracker(plan, target)
    return factory


def run_on_ray(plan: TrialPlan, *, name: str, tracking: TrackingTarget,
               on_event: Callable[[ProgressEvent], None], stop: StopRequest | None = None) -> TrialResult | None:
    """Run one trial as a Ray Train gang of its own; returns rank 0's result (None if it never
    came). A sweep's trials share warm gangs instead (launch.gang_pool).

    Raises the Ray Train error if a worker failed. Interrupted (launch.interrupt), the gang
    stops after a checkpoint (rank 0's result says `preempted`), or is let go (None); stopped
    through `stop` (the sweep's pruner), it ends after its step without one (`pruned`).
    """
    run = plan.run
    connect(run)  # before Ray is imported (see launch.plan.plan_gang)
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from trainlab.launch.event_stream import end_gracefully, start_stream
    from trainlab.launch.kept_gang import make_room
    from trainlab.launch.ray_train_run import gang_run

    make_room(scaling(plan.gang))  # a free kept gang (an earlier sweep's) must not hold what this one needs
    # on the driver's node, as Ray Train's controller is: a lost worker node must not take it along
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    events = start_stream(scheduling_strategy=here)  # also the trial's stop flag
    stop = GangStop(events, request=stop)  # signals, and the pruner's request
    payload = {"plan": plan, "events": events, "tracking": tracking, "stop": stop.flag}
    trainer = gang_run(_worker, payload, device=plan.device, scaling=scaling(plan.gang), name=name,
                       storage_path=plan.paths.ray_storage, max_failures=run.cluster.max_failures)
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
        ended = not thread.is_alive()  # before the take: what rank 0 sent before fit() returned is in it
        batch = ray.get(events.take.remote(0.5))
        for event in batch:
            if isinstance(event, TrialFinished):
                result = event.result
            else:
                stop.saw(event)
                on_event(event)
        if ended and not batch:
            break
    if stop.abandoned:  # the driver's release of the cluster ends the gang
        return result
    thread.join()
    end_gracefully(events)  # the stream and the stop flag
    if "error" in outcome:
        raise outcome["error"]
    return result
