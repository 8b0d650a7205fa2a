"""One way to track a trial, the same under Ray, under torchrun and in-process.

    tracking = TrialTracking(plan)                  # the lifecycle's start (launch.lifecycle)
    target = tracking.open(resuming=...)            # its MLflow run, opened or reopened, once
    tracker = rank0_tracker(plan, target)           # rank 0 logs into it
    tracking.close(status=..., result=..., error=...)

Under Ray the driver opens the run before any worker starts (it can then mark it failed
even if every worker dies) and hands the TrackingTarget to the workers; under torchrun and
in-process there is no driver, and rank 0 opens it (TrialTracking.tracker, its engine's
tracker factory) once the ranks agreed on the checkpoint they start from.
Either way the same tags, params, checkpoint record (tracking.continued_run) and closing tags.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from trainlab import names
from trainlab.events import TrialResult
from trainlab.plan.trial_plan import TrialPlan
from trainlab.tracking.continued_run import open_or_resume_trial_run
from trainlab.tracking.detail_table import DetailTracker, leftover_rows, write_parquet
from trainlab.tracking.runs import TrialRun, close_trial_run, closing_tags, tracker_options, trial_tags
from trainlab.tracking.store import credentials_env
from trainlab.vocab.tracker import JsonlTracker, Tracker


@dataclass(frozen=True)
class TrackingTarget:
    """Where rank 0 logs: the trial's open MLflow run, or (None) the plan's JSONL file."""

    run: TrialRun | None
    credentials: dict[str, str] = field(default_factory=dict)
    """The tracking server's credentials (tracking.store.credentials_env): a worker on
    another node lacks the driver's environment."""


class TrialTracking:
    """A trial's tracking from its start to its finish: its MLflow run (none with tracking=none),
    opened once, where the trial is started (the Ray driver, or rank 0 of a gang that has no
    driver), and closed there with the trial's status."""

    def __init__(self, plan: TrialPlan, *, tags: dict[str, str] | None = None,
                 parent_run_id: str | None = None) -> None:
        self.plan, self.tags, self.parent_run_id = plan, tags, parent_run_id
        self.started = False
        """Whether this process started the trial's tracking (a run, or none with tracking=none):
        of a torchrun gang's ranks, rank 0 alone, which finishes the trial."""
        self.run: TrialRun | None = None
        """The open MLflow run; None with tracking=none or before the start."""

    def open(self, *, resuming: bool) -> TrackingTarget:
        """Open the trial's run (again when it resumes from a checkpoint) the first time; the
        target rank 0 logs into, with the credentials a worker on another node lacks."""
        if not self.started:
            self.started = True
            if self.plan.tracking_uri is not None:
                self.run = open_trial(self.plan, resuming=resuming, tags=self.tags,
                                      parent_run_id=self.parent_run_id)
        return TrackingTarget(self.run, credentials=credentials_env() if self.run else {})

    def tracker(self, dist_info, resumed: bool) -> Tracker:
        """The engine's tracker factory on rank 0 of a gang without a driver: the run is opened
        once the ranks agreed whether they resume (engine.run.run_trial calls it then)."""
        return rank0_tracker(self.plan, self.open(resuming=resumed))

    def close(self, *, status: str, result: TrialResult | None, error: str = "", pruned_reason: str = "") -> None:
        close_trial(self.plan, self.run, status=status, result=result, error=error, pruned_reason=pruned_reason)


def open_trial(plan: TrialPlan, *, resuming: bool, tags: dict[str, str] | None = None,
               parent_run_id: str | None = None) -> TrialRun:
    """The trial's MLflow run, with its params, tags and config: the run it started in when it
    resumes from a checkpoint (recorded beside them), else a new one, recorded there."""
    assert plan.tracking_uri is not None, "tracking=none opens no run"
    trial, _ = open_or_resume_trial_run(plan.run, tracking_uri=plan.tracking_uri,
                                        tags={**trial_tags(plan.run), **(tags or {})},
                                        root=Path(plan.paths.checkpoint_root), resuming=resuming,
                                        parent_run_id=parent_run_id)
    return trial


def rank0_tracker(plan: TrialPlan, target: TrackingTarget) -> Tracker:
    """Rank 0's tracker. Every start of the trial (a Ray Train restart, a torchrun restart, a
    resume) logs into the one run, dropping the steps it already has (none on the first)."""
    if target.run is None:
        return JsonlTracker(plan.paths.metrics)
    from trainlab.tracking.mlflow_tracker import MlflowTracker

    os.environ.update(target.credentials)  # as MLflow's client (in the writer this starts) reads them
    inner = MlflowTracker(run_id=target.run.run_id, tracking_uri=target.run.tracking_uri,
                          **tracker_options(plan.run), resume=True)
    # per-layer / per-rank numbers into the run's detail.parquet (the JSONL file above keeps all)
    return DetailTracker(inner, output_dir=plan.paths.output_dir, level=plan.run.tracking.detail)


def close_trial(plan: TrialPlan, trial: TrialRun | None, *, status: str, result: TrialResult | None,
                error: str = "", pruned_reason: str = "") -> None:
    """End the trial's run with its status, and the error, where it diverged or why it was
    pruned; metrics the tracker could not deliver go first, from the plan's spill file."""
    if trial is not None:
        log_leftover_detail(plan, trial)
        close_trial_run(trial, status=status, tags=closing_tags(result, error, pruned_reason=pruned_reason),
                        spill=plan.paths.spill)


def log_leftover_detail(plan: TrialPlan, trial: TrialRun) -> None:
    """Rank 0 died before its close made the trial's detail.parquet: make it from the rows it
    left in the output dir (where this process sees that folder) and log it."""
    rows = leftover_rows(plan.paths.output_dir)
    if rows is None:
        return
    try:
        from mlflow.tracking import MlflowClient

        parquet = Path(plan.paths.output_dir) / names.ARTIFACT_DETAIL
        if write_parquet(rows, parquet):
            MlflowClient(tracking_uri=trial.tracking_uri).log_artifact(trial.run_id, str(parquet))
    except Exception as e:  # noqa: BLE001 - closing the run matters more; the rows stay on disk
        warnings.warn(f"per-layer/per-rank detail of run {trial.run_id} not logged ({e}); its rows are in {rows}",
                      stacklevel=2)
