"""One way to track a trial, the same under Ray and under torchrun.

    trial = open_trial(plan, resuming=...)          # its MLflow run, opened or reopened
    tracker = rank0_tracker(plan, TrackingTarget(trial))   # rank 0 logs into it
    close_trial(plan, trial, status=..., result=..., error=...)

Under Ray the driver opens the run before any worker starts (it can then mark it failed
even if every worker dies) and hands the TrackingTarget to the workers; under torchrun there
is no driver, and rank 0 opens it once the ranks agreed on the checkpoint they start from.
Either way the same tags, params, checkpoint record (tracking.resume) and closing tags.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from trainlab import names
from trainlab.events import TrialResult
from trainlab.plan.trial import TrialPlan
from trainlab.tracking.detail import DetailTracker, leftover_rows, write_parquet
from trainlab.tracking.resume import open_or_resume_trial_run
from trainlab.tracking.runs import TrialRun, close_trial_run, closing_tags, tracker_options, trial_tags
from trainlab.vocab.tracker import JsonlTracker, Tracker


@dataclass(frozen=True)
class TrackingTarget:
    """Where rank 0 logs: the trial's open MLflow run, or (None) the plan's JSONL file."""

    run: TrialRun | None
    credentials: dict[str, str] = field(default_factory=dict)
    """The tracking server's credentials (tracking.store_uri.credentials_env): a worker on
    another node lacks the driver's environment."""


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
