"""The driver plans a trial once, before any of its workers starts (plan.trial_plan.TrialPlan).

    plan = plan_launch(run)            # ConfigError (field, value, fix) if it cannot run
    train(plan)                        # launch.lifecycle: the MLflow run, the gang, the summary

In order, each decided once: every path absolute; the environment checks (launch.preflight)
and, for a local cluster, cluster.device; the checkpoint folder (a stopped single trial found
again goes on in its own) and the checkpoint train.resume starts from, read back against its
digests; then, joining Ray, cluster.device=auto of a joined cluster and the GPU types the gang
may use (launch.placement); last, the trial's estimate on those devices (trainlab.estimate),
refused if it does not fit them. A sweep plans each trial this way before the first one starts.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

from trainlab.config import ConfigError, RunConfig
from trainlab.config.checkpoints import CheckpointError, checkpoint_root
from trainlab.config.convert import hashed_config
from trainlab.console import console
from trainlab.devices import resolve_device
from trainlab.engine.resume import resolve_resume, verify_here
from trainlab.launch.estimate_cluster import placed_cluster
from trainlab.launch.lease import check_free
from trainlab.launch.paths import resolve_paths
from trainlab.launch.placement import PlacementError, gpu_pools, place
from trainlab.launch.preflight import check_comm_backend, check_gang_cpus, preflight
from trainlab.launch.ray_trial import connect
from trainlab.plan.derive_layout import plan_layout
from trainlab.plan.trial_plan import GangShape, TrialPlan, Where, plan_trial
from trainlab.tracking.continued_run import end_orphaned_runs, unfinished_trial
from trainlab.tracking.store import ensure_store, resolve_tracking_uri


def plan_launch(run: RunConfig, *, parent_run_id: str | None = None, services: bool = True,
                claim: Callable[[Path], None] | None = None) -> TrialPlan:
    """The trial's plan, or ConfigError before anything of it starts. `parent_run_id`: the
    sweep's run (its trials are found again by the sweep, not one by one); `services=False`:
    the sweep checked its cluster and store once already (preflight.check_sweep_services);
    `claim(root)`: the lifecycle's lease on the checkpoint folder, taken before Ray starts
    (without it, a held folder is refused here and the lifecycle takes the lease later)."""
    run = resolve_paths(run)  # workers run elsewhere: absolute paths (a no-op for the CLI's, resolved already)
    layout = plan_layout(run)  # a layout that cannot run is refused before anything else
    uses_mlflow = run.tracking.name == "mlflow"
    uri = resolve_tracking_uri(run.tracking.uri) if uses_mlflow else None
    device = preflight(run, tracking_uri=uri, services=services)  # 'auto' is left for a joined cluster
    if uri is not None:  # the driver's first touch of the store: a new sqlite one made once, locked
        ensure_store(uri)
    found = unfinished_trial(run, tracking_uri=uri, parent_run_id=parent_run_id) if uses_mlflow else None
    if uses_mlflow and not parent_run_id:  # a driver killed with SIGKILL left its run RUNNING
        for line in end_orphaned_runs(run, tracking_uri=uri, keep=found.run_id if found else None):
            console.print(f"[yellow]warning:[/] {line}", soft_wrap=True)
    root = found.root if found else checkpoint_root(run)  # a rerun goes on where the trial stopped
    run = dataclasses.replace(run, train=dataclasses.replace(run.train, checkpoint_dir=str(root)))
    try:  # every file read back against its digest at save; another config's checkpoint refused
        start = resolve_resume(run.train.resume, root, expect_config=hashed_config(run), verify=verify_here,
                               warn=lambda m: console.print(f"[yellow]warning:[/] {m}"))
    except CheckpointError as e:  # damaged, missing or another trial's: refused before any worker starts
        raise ConfigError(str(e)) from None
    (claim or check_free)(root)  # another driver trains this trial now: refused before Ray starts
    decided = device
    device, gang = plan_gang(run, device)
    if decided == "auto":  # what preflight could not check before the cluster said what it has
        try:
            check_comm_backend(run, device)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    where = Where(device=device, checkpoint_root=str(root), gang=gang, tracking_uri=uri,
                  resume_from=str(start.path) if start else "", resume_step=start.step if start else 0,
                  continues_run=found.run_id if found else "",
                  estimate_on=lambda: placed_cluster(run, gang))  # refused where it does not fit its GPUs
    return plan_trial(run, where, layout=layout, warn=lambda m: console.print(f"[yellow]warning:[/] {m}"))


def plan_gang(run: RunConfig, device: str) -> tuple[str, GangShape]:
    """Join the cluster, resolve cluster.device=auto against its resources, and route a GPU
    trial to the GPU types that can run it: (device, gang). ConfigError, with each type's
    reason, for a trial no GPU type can run, instead of a gang pending forever."""
    connect(run)  # first: Ray must not be imported before it keeps a local cluster on loopback
    import ray

    device = resolve_device(device, gpus=ray.cluster_resources().get("GPU", 0) > 0,
                            logical_gpus=run.debug.logical_gpus)
    gpus = device == "cuda" or run.debug.logical_gpus
    gang = GangShape.of(run, gpus=gpus)
    if not gpus:
        if run.cluster.address:  # a joined cluster's CPUs, now that it says what it has (local: preflight)
            try:
                check_gang_cpus(run, cluster_cpus=ray.cluster_resources().get("CPU", 0))
            except ValueError as e:
                raise ConfigError(str(e)) from None
        return device, gang
    pools = gpu_pools(ray.nodes())
    try:
        placement = place(run, pools)
    except PlacementError as e:
        raise ConfigError(str(e)) from None
    return device, dataclasses.replace(gang, accelerator_types=placement.types, strategy=placement.strategy,
                                       all_types=tuple(p.type for p in pools))
