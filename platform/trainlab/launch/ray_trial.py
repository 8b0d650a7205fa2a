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
from dataclasses import asdict

from trainlab.config import RunConfig

_RAY_TRAIN_ENV = {
    # Ray Train's health checks poll every 2 s by default; a trial's end is noticed sooner
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
}


def connect(run: RunConfig) -> None:
    """ray.init: join cluster.address, or start a local cluster sized to this machine."""
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
        return
    need = run.cluster.num_workers * run.cluster.cpus_per_worker
    ray.init(
        num_cpus=max(os.cpu_count() or 1, need),  # logical CPUs: oversubscribe rather than hang
        include_dashboard=True, dashboard_host="127.0.0.1",
        runtime_env=runtime_env, log_to_driver=False,
    )


def _worker(payload: dict) -> None:
    """Runs in every Ray Train worker (its process group is already initialised)."""
    import ray.train

    from trainlab.config import from_dict
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

    result = run_trial(run, tracker_factory=_tracker_factory(payload), local_rank=ctx.get_local_rank(),
                       progress=progress if rank0 else None)
    if rank0:
        events.put({"kind": "result", "result": dataclasses.asdict(result)})


def _tracker_factory(payload: dict):
    mlflow_run = payload.get("mlflow")

    def factory(dist_info):
        if mlflow_run:
            from trainlab.tracking.mlflow_tracker import MlflowTracker

            return MlflowTracker(**mlflow_run)
        from trainlab.tracking import JsonlTracker

        return JsonlTracker(os.path.join(payload["output_dir"], "metrics.jsonl"))
    return factory


def run_on_ray(run: RunConfig, *, device: str, storage_path: str, name: str,
               mlflow_run: dict | None, on_event) -> dict | None:
    """Run one trial as a Ray Train gang; returns rank 0's result dict (None if it never came).

    Raises the Ray Train error if a worker failed.
    """
    import ray
    from ray.train import FailureConfig, ScalingConfig
    from ray.train import RunConfig as RayRunConfig
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.util.queue import Empty as QueueEmpty
    from ray.util.queue import Queue

    from trainlab.engine.distributed import backend_for

    connect(run)
    if device == "auto":
        device = "cuda" if ray.cluster_resources().get("GPU", 0) > 0 else "cpu"
        run = dataclasses.replace(run, cluster=dataclasses.replace(run.cluster, device=device))
    use_gpu = device == "cuda"
    events = Queue(maxsize=10_000, actor_options={"num_cpus": 0})
    payload = {"config": asdict(run), "events": events, "mlflow": mlflow_run,
               "output_dir": run.output_dir}
    trainer = TorchTrainer(
        _worker,
        train_loop_config=payload,
        torch_config=TorchConfig(backend=backend_for(device)),
        scaling_config=ScalingConfig(
            num_workers=run.cluster.num_workers, use_gpu=use_gpu,
            resources_per_worker={"CPU": run.cluster.cpus_per_worker, **({"GPU": 1} if use_gpu else {})},
            placement_strategy="PACK",
        ),
        run_config=RayRunConfig(name=name, storage_path=storage_path,
                                failure_config=FailureConfig(max_failures=0)),
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
    while True:
        try:
            event = events.get(timeout=0.5)
        except (std_queue.Empty, QueueEmpty):
            if not thread.is_alive() and events.empty():
                break
            continue
        if event.get("kind") == "result":
            result = event["result"]
        else:
            on_event(event)
    thread.join()
    ray.kill(events.actor)
    if "error" in outcome:
        raise outcome["error"]
    return result
