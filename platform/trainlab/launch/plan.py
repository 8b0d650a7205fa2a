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
from trainlab.console import warn
from trainlab.devices import resolve_device
from trainlab.engine.resume import resolve_resume, verify_here
from trainlab.launch import interrupt
from trainlab.launch.estimate_cluster import placed_cluster
from trainlab.launch.lease import check_free
from trainlab.launch.paths import resolve_paths
from trainlab.launch.placement import PlacementError, gpu_pools, place
from trainlab.launch.preflight import TrialChecks, check_comm_backend, gang_refusals, preflight, sweep_refusal
from trainlab.launch.ray_trial import connect
from trainlab.plan.derive_layout import plan_layout
from trainlab.plan.trial_plan import GangShape, TrialPlan, Where, plan_trial
from trainlab.tracking.continued_run import end_orphaned_runs, may_continue, unfinished_trial
from trainlab.tracking.store import ensure_store, resolve_tracking_uri


def plan_launch(run: RunConfig, *, parent_run_id: str | None = None, services: bool = True,
                claim: Callable[[Path], None] | None = None, swept: TrialChecks | None = None) -> TrialPlan:
    """The trial's plan, or ConfigError before anything of it starts. `parent_run_id`: the
    sweep's run (its trials are found again by the sweep, not one by one); `services=False`:
    the sweep checked its cluster and store once already (preflight.check_sweep_services);
    `claim(root)`: the lifecycle's lease on the checkpoint folder, taken before Ray starts
    (without it, a held folder is refused here and the lifecycle takes the lease later);
    `swept`: what the sweep's checks found of this trial (preflight.check_sweep_trials), its gang
    checked against a joined cluster too (check_joined_gangs): none of it is checked again."""
    run = resolve_paths(run)  # workers run elsewhere: absolute paths (a no-op for the CLI's, resolved already)
    layout = plan_layout(run)  # a layout that cannot run is refused before anything else
    uses_mlflow = run.tracking.name == "mlflow"
    uri = resolve_tracking_uri(run.tracking.uri) if uses_mlflow else None
    with interrupt.admitting():  # the checks may take long (data, the estimate): a stop signal ends them at once
        checks = preflight(run, tracking_uri=uri, services=services, swept=swept)  # 'auto' is left for a joined cluster
    # the driver's first touch of the store (a new sqlite one made once, locked: seconds of MLflow's
    # imports and migrations) only once the checkpoint refusals are behind, unless the store says
    # where the checkpoint folder is (a stopped single trial run again)
    looks_up = uri is not None and may_continue(run, parent_run_id=parent_run_id)
    if looks_up:
        ensure_store(uri)
    found = unfinished_trial(run, tracking_uri=uri, parent_run_id=parent_run_id) if looks_up else None
    root = found.root if found else checkpoint_root(run)  # a rerun goes on where the trial stopped
    run = dataclasses.replace(run, train=dataclasses.replace(run.train, checkpoint_dir=str(root)))
    try:  # every file read back against its digest at save; another config's checkpoint refused
        with interrupt.admitting():  # reading a large checkpoint back takes its time: a signal stops it
            start = resolve_resume(run.train.resume, root, expect_config=hashed_config(run), verify=verify_here,
                                   warn=warn)
    except CheckpointError as e:  # damaged, missing or another trial's: refused before any worker starts
        raise ConfigError(str(e)) from None
    (claim or check_free)(root)  # another driver trains this trial now: refused before Ray starts
    if uri is not None and not looks_up:
        ensure_store(uri)
    if uses_mlflow and not parent_run_id:  # a driver killed with SIGKILL left its run RUNNING
        for line in end_orphaned_runs(run, tracking_uri=uri, keep=found.run_id if found else None):
            warn(line)
    device, gang = plan_gang(run, checks.device, gang_checked=swept is not None)
    if checks.device == "auto":  # what preflight could not check before the cluster said what it has
        try:
            check_comm_backend(run, device)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    # estimated once: on this machine by preflight (a local cluster; a logical-GPU gang is estimated
    # on the GPU types Ray placed it on), else on the joined cluster's nodes it was placed on
    here = not run.cluster.address and not run.debug.logical_gpus
    where = Where(device=device, checkpoint_root=str(root), gang=gang, tracking_uri=uri,
                  resume_from=str(start.path) if start else "", resume_step=start.step if start else 0,
                  continues_run=found.run_id if found else "", estimate=checks.estimate if here else None,
                  estimate_on=None if here else lambda: placed_cluster(run, gang))  # refused where it does not fit
    return plan_trial(run, where, layout=layout, warn=warn)


def plan_gang(run: RunConfig, device: str, *, gang_checked: bool = False) -> tuple[str, GangShape]:
    """Join the cluster, resolve cluster.device=auto against its resources, and route a GPU
    trial to the GPU types that can run it: (device, gang). ConfigError, with each type's
    reason, for a trial no GPU type can run, instead of a gang pending forever, and for a CPU
    gang beyond a joined cluster's CPUs (check_joined_gangs; `gang_checked`: the sweep did)."""
    connect(run)  # first: Ray must not be imported before it keeps a local cluster on loopback
    import ray

    resources = ray.cluster_resources()
    device, gpus = _on_cluster(run, device, resources)
    gang = GangShape.of(run, gpus=gpus)
    if not gpus:
        if not gang_checked:
            check_joined_gangs([run], resources=resources)
        return device, gang
    pools = gpu_pools(ray.nodes())
    try:
        placement = place(run, pools)
    except PlacementError as e:
        raise ConfigError(str(e)) from None
    return device, dataclasses.replace(gang, accelerator_types=placement.types, strategy=placement.strategy,
                                       all_types=tuple(p.type for p in pools))


def _on_cluster(run: RunConfig, device: str, resources: dict) -> tuple[str, bool]:
    """`device` (preflight's: cluster.device on a joined cluster) resolved against the cluster's
    resources, and whether its gang holds GPUs (real, or logical with debug.logical_gpus)."""
    device = resolve_device(device, gpus=resources.get("GPU", 0) > 0, logical_gpus=run.debug.logical_gpus)
    return device, device == "cuda" or run.debug.logical_gpus


def check_joined_gangs(runs: list[RunConfig], labels: list[str] | None = None, *,
                       resources: dict | None = None) -> None:
    """Each CPU gang of `runs` on a joined cluster against the CPUs it says it has, once
    connected (a local cluster's: preflight, before Ray starts; a GPU gang is placed by its GPUs:
    launch.placement), before any of them starts. ConfigError: for a single trial, the numbers
    and the fix (preflight.check_gang_cpus); for a sweep's trials (`labels`), one such line per
    trial that cannot fit, and the sweep is refused whole."""
    if resources is None:
        import ray

        resources = ray.cluster_resources()
    joined = [i for i, run in enumerate(runs)
              if run.cluster.address and not _on_cluster(run, run.cluster.device, resources)[1]]
    refusals = gang_refusals([runs[i] for i in joined], cluster_cpus=resources.get("CPU", 0))
    refused = [(i, why) for i, why in zip(joined, refusals) if why]
    if not refused:
        return
    if labels is None:
        raise ConfigError(refused[0][1])
    raise sweep_refusal([f"{labels[i]}: {why}" for i, why in refused])
