"""The plan of a trial that has no driver (torchrun, a test, a benchmark): made in-process.

Under Ray the driver plans each trial (launch.plan) and its workers execute that plan; a
process started by torchrun, or a caller that hands the engine a RunConfig, makes the same
plan here, deciding what the driver would: cluster.device against this machine's GPUs, the
checkpoint folder the config names and the trial's estimate (refused where it cannot fit its
GPUs). The resume is decided by the ranks together when they start
(engine.resume.agreed_resume), as every start of a Ray gang does too.
"""

from __future__ import annotations

import warnings

import torch

from trainlab.config import RunConfig
from trainlab.config.checkpoints import checkpoint_root
from trainlab.devices import resolve_device
from trainlab.estimate.fit_check import torchrun_cluster
from trainlab.plan.trial_plan import TrialPlan, Where, plan_trial


def plan_here(run: RunConfig, *, tracking_uri: str | None = None) -> TrialPlan:
    """`run` (validated) planned in this process; every rank of one machine makes the same plan.
    `tracking_uri`: the MLflow store rank 0 opens the trial's run in (None: no run). Its estimate
    is on the gang torchrun started (refused where it does not fit its GPUs, warned on CPU)."""
    device = resolve_device(run.cluster.device, gpus=torch.cuda.is_available(),
                            logical_gpus=run.debug.logical_gpus)
    return plan_trial(run, Where(device=device, checkpoint_root=str(checkpoint_root(run)), tracking_uri=tracking_uri,
                                 estimate_on=lambda: torchrun_cluster(run, device=device)),
                      warn=lambda m: warnings.warn(m, stacklevel=4))
