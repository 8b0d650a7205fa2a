"""A resumed trial goes on in the MLflow run it started in, not in a new one.

The driver writes ``trial.json`` (run id and tracking URI) beside the trial's checkpoints
when it opens the run. When a trial starts from a checkpoint (a rerun of its sweep, a
`trainlab train ... train.resume=PATH`), the run named there is reopened, if it is in the
same store, and the rest of the trial's steps land in it; the tracker then drops the steps
the run already has (MlflowTracker(resume=True)), so the curve has no gap and no duplicates.
"""

from __future__ import annotations

import json
from pathlib import Path

from trainlab import names
from trainlab.config import RunConfig
from trainlab.redact import redact
from trainlab.tracking.runs import TrialRun, open_trial_run

TRIAL_RECORD = "trial.json"


def record_trial(root: Path, trial: TrialRun) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / TRIAL_RECORD).write_text(json.dumps(
        # masked: a database URI's password stays out of the output folder (compared masked too)
        {"run_id": trial.run_id, "experiment_id": trial.experiment_id, "tracking_uri": redact(trial.tracking_uri)}))


def recorded_trial(root: Path, tracking_uri: str) -> TrialRun | None:
    """The run recorded beside the checkpoints under `root`, if it is in `tracking_uri`'s store."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        record = json.loads((root / TRIAL_RECORD).read_text())
    except (OSError, ValueError):
        return None
    if record.get("tracking_uri") not in (tracking_uri, redact(tracking_uri)):
        return None
    try:
        MlflowClient(tracking_uri=tracking_uri).get_run(record["run_id"])
    except MlflowException:
        return None
    return TrialRun(run_id=record["run_id"], experiment_id=record["experiment_id"], tracking_uri=tracking_uri)


def reopen_trial_run(trial: TrialRun) -> None:
    """Mark a run that stopped (failed, killed, preempted) as running again."""
    from mlflow.entities import RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=trial.tracking_uri)
    client.log_batch(trial.run_id, tags=[RunTag(names.TAG_STATUS, names.STATUS_RUNNING)])
    client.update_run(trial.run_id, status="RUNNING")


def open_or_resume_trial_run(run: RunConfig, *, tracking_uri: str, tags: dict[str, str], root: Path,
                             resuming: bool, parent_run_id: str | None = None) -> tuple[TrialRun, bool]:
    """(the trial's run, whether it was reopened): the recorded run when the trial resumes from a
    checkpoint under `root`, else a new run; either way recorded there for the next resume."""
    trial = recorded_trial(root, tracking_uri) if resuming else None
    reopened = trial is not None
    if reopened:
        reopen_trial_run(trial)
    else:
        trial = open_trial_run(run, tracking_uri=tracking_uri,
                               tags={**tags, names.TAG_CHECKPOINT_DIR: str(root)}, parent_run_id=parent_run_id)
    record_trial(root, trial)
    return trial, reopened
