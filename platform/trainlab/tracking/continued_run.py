"""A resumed trial goes on in the MLflow run it started in, not in a new one (unless it resumes
with another train.max_steps: tracking.changed_resume).

The driver writes ``trial.json`` (run id and tracking URI) beside the trial's checkpoints
when it opens the run. When a trial starts from a checkpoint (a rerun of its sweep, a
`trainlab train ... train.resume=PATH`), the run named there is reopened, if it is in the
same store, and the rest of the trial's steps land in it; the tracker then drops the steps
the run already has (MlflowTracker(resume=True)), so the curve has no gap and no duplicates.
A single trial stopped before its end is found again by its config hash (find_unfinished_trial).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from trainlab import names
from trainlab.config import RunConfig, config_hash
from trainlab.config.checkpoints import checkpoint_root, latest_checkpoint, remove_unfinished_saves
from trainlab.redact import redact
from trainlab.tracking.changed_resume import changed_fields, continue_in_new_run
from trainlab.tracking.runs import TrialRun, open_trial_run, tracker_options, trial_tags
from trainlab.vocab.files import CONFIG_FILE_MAX_BYTES, read_text
from trainlab.vocab.processes import process_gone, process_id

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
        # bounded and checked: a FIFO or a device there is no record, never waited on
        record = json.loads(read_text(root / TRIAL_RECORD, field=TRIAL_RECORD, fix="", max_bytes=CONFIG_FILE_MAX_BYTES))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("tracking_uri") not in (tracking_uri, redact(tracking_uri)):
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
    client.log_batch(trial.run_id, tags=[RunTag(names.TAG_STATUS, names.STATUS_RUNNING),
                                         RunTag(names.TAG_DRIVER, process_id())])
    client.update_run(trial.run_id, status="RUNNING")


def open_or_resume_trial_run(run: RunConfig, *, tracking_uri: str, tags: dict[str, str], root: Path,
                             resuming: bool, parent_run_id: str | None = None) -> tuple[TrialRun, bool]:
    """(the trial's run, whether it was reopened): the recorded run when the trial resumes from a
    checkpoint under `root`, else a new run; either way recorded there for the next resume."""
    trial = recorded_trial(root, tracking_uri) if resuming else None
    changed = changed_fields(run, tracking_uri=tracking_uri, run_id=trial.run_id) if trial is not None else ""
    reopened = trial is not None and not changed
    if reopened:
        reopen_trial_run(trial)
    else:
        left, trial = trial, open_trial_run(run, tracking_uri=tracking_uri,
                                            tags={**tags, names.TAG_CHECKPOINT_DIR: str(root)},
                                            parent_run_id=parent_run_id)
        ckpt = latest_checkpoint(root) if left is not None else None
        if left is not None and ckpt is not None:  # another schedule: a run of its own (tracking.changed_resume)
            continue_in_new_run(left, trial, through_step=ckpt.step, why=changed)
    record_trial(root, trial)
    return trial, reopened


@dataclass(frozen=True)
class UnfinishedTrial:
    """A trial of the same config that stopped before its end, and where it goes on from."""

    run_id: str
    root: Path
    """Its checkpoint folder (the run's checkpoint_dir tag)."""
    step: int
    """The step of its latest complete checkpoint."""


def find_unfinished_trial(run: RunConfig, *, tracking_uri: str) -> UnfinishedTrial | None:
    """The newest run of a single trial (not a sweep's) of this config (by its config hash) in
    the experiment that stopped before its end (interrupted, failed, its driver killed) and left
    a complete checkpoint: `trainlab train ...` run again goes on from there, in that run,
    though Hydra gives each command a new output folder. A sweep finds its own trials by its
    parent run (tracking.sweep_runs)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(run.tracking.experiment)
    if exp is None:
        return None
    found = client.search_runs([exp.experiment_id], filter_string=f"tags.{names.TAG_CONFIG_HASH} = '{config_hash(run)}'",
                               max_results=100, order_by=["attributes.start_time DESC"])
    for r in found:
        tags = r.data.tags
        if names.TAG_PARENT_RUN_ID in tags or tags.get(names.TAG_STATUS) in names.DONE_STATUSES:
            continue
        root = Path(tags.get(names.TAG_CHECKPOINT_DIR, ""))
        ckpt = latest_checkpoint(root) if root.is_absolute() else None
        if ckpt is not None:
            return UnfinishedTrial(run_id=r.info.run_id, root=root, step=ckpt.step)
    return None


def end_orphaned_runs(run: RunConfig, *, tracking_uri: str, keep: str | None = None) -> list[str]:
    """Runs of this config (a single trial's, not a sweep's: tracking.sweep_runs finds those) left
    RUNNING by a process of this machine that is gone: end_left_running, by the next start of
    the same config, keeping `keep` (the run this start goes on in). One line per run ended."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(run.tracking.experiment)
    if exp is None:
        return []
    found = client.search_runs([exp.experiment_id], max_results=100,
                               filter_string=f"tags.{names.TAG_CONFIG_HASH} = '{config_hash(run)}' "
                                             "and attributes.status = 'RUNNING'")
    single = [r for r in found if names.TAG_PARENT_RUN_ID not in r.data.tags]
    return end_left_running(client, single, keep={keep} if keep else set(), by="the next start of the same config")


def end_left_running(client, found: list, *, keep: set[str], by: str) -> list[str]:
    """Of the MLflow runs `found`, those still RUNNING whose driver (tag trainlab.driver) is a
    process of this machine that is gone (SIGKILLed or crashed: no handler ran): each loses the
    half-written step_N.tmp its checkpoint folder holds and, unless its id is in `keep` (a run
    this start goes on in), ends FAILED with a note saying its driver left it and `by` whom it
    was ended. A run whose driver runs, or ran on another host, is never touched. Returns one
    line per run ended."""
    from mlflow.entities import RunTag

    said = []
    for r in found:
        tags = r.data.tags
        driver = tags.get(names.TAG_DRIVER, "")
        if r.info.status != "RUNNING" or not driver or not process_gone(driver):
            continue
        root = Path(tags.get(names.TAG_CHECKPOINT_DIR, ""))
        if root.is_absolute():  # its driver is gone: nothing writes there any more
            remove_unfinished_saves(root)
        if r.info.run_id in keep:
            continue
        pid = driver.split(" ")[1]
        note = f"its driver (pid {pid}) ended without closing it (SIGKILL or a crash); ended by {by}"
        client.log_batch(r.info.run_id, tags=[RunTag(names.TAG_STATUS, names.STATUS_FAILED),
                                              RunTag(names.TAG_ERROR, note)])
        client.set_terminated(r.info.run_id, status="FAILED")
        said.append(f"run {r.info.run_id} was left RUNNING: {note}; marked FAILED")
    return said


def may_continue(run: RunConfig, *, parent_run_id: str | None) -> bool:
    """Whether the store may say where this trial goes on (unfinished_trial): a single trial (a
    sweep's parent finds its own) with train.resume=auto, no train.checkpoint_dir (an explicit
    folder is resumed from as it is) and no checkpoint in its own default folder (a fixed
    output_dir: resumed from there). Otherwise its checkpoint folder is known without the store."""
    if parent_run_id or run.train.checkpoint_dir or run.train.resume != "auto":
        return False
    return latest_checkpoint(checkpoint_root(run)) is None


def unfinished_trial(run: RunConfig, *, tracking_uri: str, parent_run_id: str | None) -> UnfinishedTrial | None:
    """find_unfinished_trial where the trial would otherwise start afresh (may_continue)."""
    if not may_continue(run, parent_run_id=parent_run_id):
        return None
    return find_unfinished_trial(run, tracking_uri=tracking_uri)


def start_trial_tracking(run: RunConfig, *, tracking_uri: str, tags: dict[str, str] | None = None,
                         parent_run_id: str | None = None, checkpoint_root: Path | None = None,
                         resumed: bool = False):
    """Open the trial's run (or, `resumed` from a checkpoint under `checkpoint_root`, reopen
    the run it started in) and start rank 0's tracker on it, in this process (torchrun, bench).

    Returns (TrialRun, MlflowTracker); under Ray the tracker starts in the worker instead."""
    from trainlab.tracking.mlflow_tracker import MlflowTracker

    tags = {**trial_tags(run), **(tags or {})}
    if checkpoint_root is None:
        trial = open_trial_run(run, tracking_uri=tracking_uri, tags=tags, parent_run_id=parent_run_id)
    else:
        trial, resumed = open_or_resume_trial_run(run, tracking_uri=tracking_uri, tags=tags, root=checkpoint_root,
                                                  resuming=resumed, parent_run_id=parent_run_id)
    tracker = MlflowTracker(run_id=trial.run_id, tracking_uri=tracking_uri, **tracker_options(run), resume=resumed)
    return trial, tracker
