"""The plan of a trial that has no driver (torchrun, a test, a benchmark): made in-process.

Under Ray the driver plans each trial (launch.plan) and its workers execute that plan; a
process started by torchrun, or a caller that hands the engine a RunConfig, makes the same
plan here, deciding what the driver would: cluster.device against this machine's GPUs, the
checkpoint folder the config names and the trial's estimate (refused where it cannot fit its
GPUs). The resume is decided by the ranks together when they start
(engine.resume.agreed_resume), as every start of a Ray gang does too.
"""

from __future__ import annotations

import dataclasses
import warnings

import torch

from trainlab.config import RunConfig
from trainlab.config.checkpoints import checkpoint_root
from trainlab.config.layout import TrialLayout
from trainlab.devices import resolve_device
from trainlab.estimate.fits import checked_estimate, estimate_run, torchrun_cluster
from trainlab.plan.trial import TrialPlan, plan_trial


def plan_here(run: RunConfig, *, tracking_uri: str | None = None) -> TrialPlan:
    """`run` (validated) planned in this process; every rank of one machine makes the same plan.
    `tracking_uri`: the MLflow store rank 0 opens the trial's run in (None: no run)."""
    device = resolve_device(run.cluster.device, gpus=torch.cuda.is_available(),
                            logical_gpus=run.debug.logical_gpus)
    plan = plan_trial(run, device=device, checkpoint_root=str(checkpoint_root(run)), tracking_uri=tracking_uri)
    return dataclasses.replace(plan, estimate=local_estimate(run, device=device, trial_layout=plan.layout))


def local_estimate(run: RunConfig, *, device: str, trial_layout: TrialLayout):
    """The trial's estimate on the gang torchrun started (estimate.fits.checked_estimate: refused
    where it does not fit its GPUs, warned on CPU, None where it cannot be made)."""
    return checked_estimate(run, lambda: estimate_run(run, torchrun_cluster(run, device=device), trial_layout=trial_layout),
                            gpus=device == "cuda", warn=lambda m: warnings.warn(m, stacklevel=3))
