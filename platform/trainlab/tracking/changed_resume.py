"""A resume with another train.max_steps goes on in a run of its own, never in the run it left.

A trial resumed from a checkpoint goes on in the MLflow run it started in (tracking.continued_run),
and its tracker drops the steps that run already has: a replay of the same computation. With
another train.max_steps (the one field a resume may change: engine.resume.EXTENDS) it is not the
same computation: the learning-rate schedule decays to the new end, and the run's `train.max_steps`
param (which MLflow never changes) would name the old one. Worse, the run may hold steps an
attempt logged after the checkpoint and that the resumed trial throws away (killed at 10,679 after
a checkpoint at 10,500, resumed with train.max_steps=10600): its last loss, val loss and learning
rate would be the discarded attempt's, not the trained model's.

So such a resume opens a new run with the new config, holding the old run's history up to the
checkpoint's step (what the model it resumes from was trained through), tagged with the run it
continues; the old run keeps what it logged, is tagged with the run that continues it and, if it
was left open, ends KILLED.
"""

from __future__ import annotations

from trainlab import names
from trainlab.config import RunConfig
from trainlab.tracking.runs import TrialRun

BATCH = 1000
"""MLflow's limit of metrics per log_batch."""


def changed_fields(run: RunConfig, *, tracking_uri: str, run_id: str) -> str:
    """'train.max_steps 20000 -> 10600' where `run` trains to another end than the run `run_id`
    recorded; '' where it is the same trial going on (or the run names no max_steps)."""
    from mlflow.tracking import MlflowClient

    was = MlflowClient(tracking_uri=tracking_uri).get_run(run_id).data.params.get("train.max_steps")
    now = str(run.train.max_steps)
    return f"train.max_steps {was} -> {now}" if was is not None and was != now else ""


def continue_in_new_run(old: TrialRun, new: TrialRun, *, through_step: int, why: str) -> int:
    """Copy `old`'s metric history up to `through_step` (the checkpoint's) into `new`, and link the
    two runs; `old` ends KILLED if it was left open. Returns the points copied."""
    from mlflow.entities import Metric, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=old.tracking_uri)
    before = client.get_run(old.run_id)
    points = []
    for key in before.data.metrics:
        points += [Metric(key, m.value, m.timestamp, m.step)
                   for m in client.get_metric_history(old.run_id, key) if m.step <= through_step]
    for i in range(0, len(points), BATCH):
        client.log_batch(new.run_id, metrics=points[i:i + BATCH])
    client.log_batch(new.run_id, tags=[RunTag(names.TAG_CONTINUES, old.run_id)])
    note = (f"continued in run {new.run_id} from the checkpoint of step {through_step} with {why}; "
            f"this run's steps after {through_step} were not trained into that model")
    client.log_batch(old.run_id, tags=[RunTag(names.TAG_CONTINUED_IN, new.run_id), RunTag(names.TAG_NOTE, note)])
    if before.info.status == "RUNNING":
        client.log_batch(old.run_id, tags=[RunTag(names.TAG_STATUS, names.STATUS_PREEMPTED)])
        client.set_terminated(old.run_id, status="KILLED")
    return len(points)


__all__ = ["changed_fields", "continue_in_new_run"]
