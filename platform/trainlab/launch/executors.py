"""How a trial's workers run: the executors of the one trial lifecycle (launch.lifecycle.train).

As Lightning's launchers, they differ only in how processes start; planning, the MLflow run,
progress, interrupts and the summary are the lifecycle's, written once:

    RayGang     the driver starts a Ray Train gang (launch.ray_trial, or a sweep's warm gang)
    Torchrun    this process is one rank of a torchrun gang: rank 0 plays the driver's part
                for tracking and the summary, the other ranks only execute
    InProcess   this process alone, world size 1, no Ray (tests, benchmarks, notebooks)

An executor says where its trial is planned (`where`: the cluster the driver joins, or this
process's device), who takes Ctrl-C / SIGTERM (`signals`), whether this process is one of the
ranks that each run the lifecycle (`ranked`), and runs the planned trial (`execute`),
returning rank 0's result (None if the workers ended without one).
"""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager, Protocol

from trainlab.events import ProgressEvent, TrialResult
from trainlab.launch import interrupt
from trainlab.names import ray_name
from trainlab.plan.trial_plan import TrialPlan
from trainlab.tracking.runs import default_run_name
from trainlab.tracking.trial_tracking import TrialTracking

CLUSTER = "cluster"
"""Planned by the driver against the Ray cluster it joins (its devices, GPU types, resume)."""
HERE = "here"
"""Planned in this process against its own device; the ranks agree on the resume as they start."""

Runner = Callable[..., TrialResult | None]
"""run_on_ray's signature: (plan, *, name, tracking, on_event, stop) -> rank 0's result."""


class Executor(Protocol):
    where: str
    """CLUSTER or HERE: what the lifecycle plans the trial against (launch.lifecycle.plan_for)."""
    ranked: bool
    """This process is one of the ranks that each run the lifecycle (torchrun): rank 0, which
    started the trial's tracking, finishes it (closes the run, prints the summary), the others
    only execute; an error leaves the process (after rank 0 closed the run failed), as its exit
    status is how torchrun learns of it. Otherwise this process is the trial's driver: an error
    becomes the trial's `failed` outcome."""

    def signals(self) -> ContextManager:
        """Who takes Ctrl-C / SIGTERM while the command's trial runs."""

    def execute(self, plan: TrialPlan, tracking: TrialTracking, *, on_event: Callable[[ProgressEvent], None],
                stop: interrupt.StopRequest | None) -> TrialResult | None:
        """Run the planned trial's workers; rank 0's result."""


class RayGang:
    """A gang of Ray Train workers: its own (launch.ray_trial.run_on_ray) or, with `runner`, a
    sweep's warm one (launch.gang_pool). The driver opened the run before: the workers log
    into the TrackingTarget they are handed."""

    where = CLUSTER
    ranked = False

    def __init__(self, runner: Runner | None = None) -> None:
        self.runner = runner

    def signals(self) -> ContextManager:
        # the workers run in Ray's threads, which cannot take signals: the driver stops them
        # after a checkpoint through a flag (launch.interrupt), and the run ends KILLED
        return interrupt.interruptible()

    def execute(self, plan, tracking, *, on_event, stop):
        from trainlab.launch.ray_trial import run_on_ray

        return (self.runner or run_on_ray)(plan, name=ray_name(default_run_name(plan.run)), tracking=tracking.open(
            resuming=plan.resuming), on_event=on_event, stop=stop)


class _ThisProcess:
    """Executes in this process: planned against its device, and its trainer takes SIGTERM
    itself (engine.preemption); rank 0 opens the run when its engine asks for a tracker."""

    where = HERE

    def signals(self) -> ContextManager:
        return contextlib.nullcontext()


class InProcess(_ThisProcess):
    """The trial's one worker in this process: world size 1, no Ray, no process group."""

    ranked = False

    def execute(self, plan, tracking, *, on_event, stop):
        # imported here: a Ray driver never loads the engine
        from trainlab.engine.run import run_trial

        return run_trial(plan, tracker_factory=tracking.tracker, progress=on_event)


class Torchrun(_ThisProcess):
    """This process is one rank of the gang torchrun started (WORLD_SIZE, RANK in the
    environment): every rank executes, rank 0 also tracks and summarises (the lifecycle
    finishes only where TrialTracking started)."""

    ranked = True

    def execute(self, plan, tracking, *, on_event, stop):
        from trainlab.distributed import close_distributed
        from trainlab.engine.run import run_trial

        result = run_trial(plan, tracker_factory=tracking.tracker, progress=on_event)
        close_distributed()  # every rank got here: no backend thread is left to abort the exit
        return result
