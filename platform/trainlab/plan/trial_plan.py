"""A trial planned once: what the driver decides before any worker starts, typed and frozen.

    plan = plan_trial(run, Where(device="cpu", checkpoint_root="/abs/out/checkpoints"))
    plan.device, plan.dims, plan.grad_accum_steps, plan.gang, plan.paths.checkpoint_root, ...

The Ray driver (launch.plan.plan_launch) resolves it from a validated RunConfig and the
cluster it joined; a process with no driver (torchrun, a test, a benchmark) resolves it
itself the same way (plan.here.plan_here). Workers execute it: they never rebuild the config
from a dict, validate it again or decide its device, paths or identity. What a worker still
decides is what only it can see: the checkpoint it starts from when Ray Train restarts its gang
(newer than the one the driver found), the gang it was given (an elastic trial runs on fewer
workers) and a rollback's precision.

The plan layer sits below the engine, tracking and launch: each reads the plan, none re-derives it.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

from trainlab import names
from trainlab.config.checkpoints import checkpoint_root as default_checkpoint_root
from trainlab.config.convert import config_hash, hashed_config
from trainlab.config.layout_types import ParallelDims, TrialLayout
from trainlab.config.schema import RunConfig
from trainlab.estimate.fit_check import checked_estimate, estimate_run
from trainlab.plan.derive_layout import compile_unit, elastic_range, plan_layout
from trainlab.vocab.nodes import ClusterSpec
from trainlab.vocab.precision import PrecisionSpec, emulates, spec_of

if TYPE_CHECKING:
    from trainlab.estimate.result import Estimate

METRICS_FILE = "metrics.jsonl"
"""tracking=none: rank 0's metrics, one JSON line each, in the trial's output folder."""


@dataclass(frozen=True)
class GangShape:
    """What a trial's gang asks of Ray: its workers, their resources and where they may go."""

    num_workers: int
    cpus_per_worker: int
    gpus: bool
    """Each worker reserves one GPU (real, or logical with debug.logical_gpus)."""
    accelerator_types: tuple[str, ...] = ()
    """The GPU types the gang may use (launch.placement.place); empty without GPUs."""
    strategy: str = "PACK"
    """Ray placement-group strategy: PACK or SPREAD."""
    all_types: tuple[str, ...] = ()
    """Every GPU type of the cluster: a placement that may use all of them needs no selector."""
    elastic: tuple[int, int] | None = None
    """(fewest, most) workers of an elastic trial; None for a fixed gang."""
    resize_interval_s: float = 60.0

    @classmethod
    def of(cls, run: RunConfig, *, gpus: bool) -> GangShape:
        """The gang of `run` with no placement among GPU types (torchrun, a CPU trial)."""
        c = run.cluster
        return cls(num_workers=c.num_workers, cpus_per_worker=c.cpus_per_worker, gpus=gpus,
                   elastic=elastic_range(run), resize_interval_s=c.resize_interval_s)


@dataclass(frozen=True)
class TrialPaths:
    """Every file and folder of the trial, absolute (workers run in folders of Ray's choosing)."""

    output_dir: str
    checkpoint_root: str
    """Where its checkpoints go and a resume looks (train.checkpoint_dir as chosen)."""
    ray_storage: str
    """Ray Train's storage_path for the trial's gang."""
    spill: str
    """MLflow records held while the tracking server is unreachable."""
    metrics: str
    """tracking=none: rank 0's JSONL metrics."""


@dataclass(frozen=True)
class TrialPlan:
    """Everything a trial needs, decided once. Read it; never change its `run`."""

    run: RunConfig
    """The validated config as composed, paths absolute and train.checkpoint_dir the chosen
    root; cluster.device stays as the user gave it (the trial's identity): read `device`."""
    device: str
    """cpu or cuda: what every worker computes on (devices.resolve_device)."""
    dims: ParallelDims
    """The parallel degrees of the full gang."""
    grad_accum_steps: int
    """Micro-batches per rank per optimizer step on the full gang."""
    pp_microbatches: int
    """Pipeline micro-batches per step (1 without a pipeline)."""
    pp_virtual_stages: int
    precision: PrecisionSpec
    gang: GangShape
    paths: TrialPaths
    config_hash: str
    """The trial's identity: tagged on its run, written into its checkpoints, the key by which
    a sweep skips it or goes on with it. Of `run`, so equal under torchrun and Ray."""
    hashed_fields: Mapping[str, Any]
    """The fields config_hash covers; a checkpoint records them, a resume names those that differ."""
    tracking_uri: str | None = None
    """The MLflow store every process uses (None with tracking=none)."""
    resume_from: str = ""
    """The checkpoint the driver found for train.resume ('' = the trial starts at step 0)."""
    resume_step: int = 0
    continues_run: str = ""
    """The MLflow run of this trial that stopped before its end and goes on here ('' = none)."""
    estimate: Estimate | None = None
    """Memory and time of the trial on the devices it was placed on (trainlab.estimate), decided
    by the driver before any worker starts; None where nothing estimated it."""
    compile_unit: str = ""
    """What the trial compiles on `device`: '' (nothing), 'model' or 'block' (train.compile and
    train.compile_unit with auto resolved: plan.derive_layout.compile_unit)."""

    @property
    def resuming(self) -> bool:
        return bool(self.resume_from)

    @property
    def layout(self) -> TrialLayout:
        """The layout decisions, as the estimate and parallelize() are handed them."""
        return TrialLayout(dims=self.dims, grad_accum_steps=self.grad_accum_steps,
                           pp_microbatches=self.pp_microbatches, pp_virtual_stages=self.pp_virtual_stages,
                           elastic=self.gang.elastic)


@dataclass(frozen=True)
class Where:
    """What the executor found out about where a trial runs, before it is planned: the Ray driver
    from the cluster it joined (launch.plan.plan_launch), a torchrun rank or an in-process run
    from this machine (plan.here.plan_here). Everything else of the plan is derived from the config."""

    device: str
    """cpu or cuda, resolved (devices.resolve_device)."""
    checkpoint_root: str = ""
    """Where its checkpoints go and a resume looks ('' = the folder the config names)."""
    gang: GangShape | None = None
    """The gang and the GPU types it may use (None = the config's gang, no placement)."""
    tracking_uri: str | None = None
    """The MLflow store every process uses (None: no run)."""
    resume_from: str = ""
    """The checkpoint the driver found for train.resume ('' = the trial starts at step 0)."""
    resume_step: int = 0
    continues_run: str = ""
    """The MLflow run of this trial that stopped before its end and goes on here ('' = none)."""
    estimate_on: Callable[[], ClusterSpec] | None = None
    """The devices the trial runs on, for its estimate (a joined Ray cluster's nodes, this
    machine's GPUs); None: no estimate made here (`estimate`, if any, is the plan's)."""
    estimate: Estimate | None = None
    """The trial's estimate, made and checked already where the trial was checked (the Ray driver's
    preflight on this machine, for a local cluster): the plan's as it is, not made again."""


def plan_trial(run: RunConfig, where: Where, *, layout: TrialLayout | None = None,
               warn: Callable[[str], None] | None = None) -> TrialPlan:
    """The plan of a validated `run` on `where`; derives the rest from the config, once
    (`layout`: plan_layout(run), where the caller checked it already, before anything started).
    The estimate is `where.estimate`, or made on `where.estimate_on` (estimate.fit_check.checked_estimate:
    ConfigError where it does not fit its devices, GPUs or a CPU host; `warn`ed where it cannot be made)."""
    device = where.device
    assert device in ("cpu", "cuda"), f"resolve the device first: {device!r}"
    layout = layout or plan_layout(run)  # ConfigError (field, value, fix) for a layout that cannot run
    out = os.path.abspath(run.output_dir or ".")
    root = str(where.checkpoint_root or default_checkpoint_root(run))
    paths = TrialPaths(output_dir=out, checkpoint_root=root, ray_storage=os.path.join(out, "ray"),
                       spill=os.path.join(out, names.SPILL_FILE), metrics=os.path.join(out, METRICS_FILE))
    gang = where.gang or GangShape.of(run, gpus=device == "cuda")
    estimate = where.estimate
    if estimate is None and where.estimate_on is not None:
        estimate = checked_estimate(run, lambda: estimate_run(run, where.estimate_on(), trial_layout=layout),
                                    warn=warn or (lambda m: None))
    return TrialPlan(
        run=run, device=device, dims=layout.dims, grad_accum_steps=layout.grad_accum_steps,
        pp_microbatches=layout.pp_microbatches, pp_virtual_stages=layout.pp_virtual_stages,
        precision=spec_of(run.precision.name), gang=gang,
        paths=paths, config_hash=config_hash(run), hashed_fields=hashed_config(run), tracking_uri=where.tracking_uri,
        resume_from=where.resume_from, resume_step=where.resume_step, continues_run=where.continues_run,
        estimate=estimate, compile_unit=_compiled(run, device))


def replan(plan: TrialPlan, *, run: RunConfig) -> TrialPlan:
    """`plan` for `run`, a changed config of the same trial: an elastic gang's resized one
    (engine.elastic.fit_to_gang) or a rollback's retry precision (engine.rollback.attempt_config).
    Its layout, precision spec and compile unit are derived again, here; its identity (config hash and fields),
    paths, resume and gang stay the trial's as it was launched."""
    if run is plan.run:
        return plan
    layout = plan_layout(run)
    return dataclasses.replace(plan, run=run, dims=layout.dims, grad_accum_steps=layout.grad_accum_steps,
                               pp_microbatches=layout.pp_microbatches, pp_virtual_stages=layout.pp_virtual_stages,
                               precision=spec_of(run.precision.name), compile_unit=_compiled(run, plan.device))


def _compiled(run: RunConfig, device: str) -> str:
    """compile_unit on `device`, the recipe's emulation read from the precision spec (as the
    recipe itself reads it: vocab.precision.emulates)."""
    return compile_unit(run, device_type=device, emulated=emulates(run.precision, device_type=device))
