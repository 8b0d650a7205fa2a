"""A sweep's parent MLflow run: found again by its definition hash, so a rerun never duplicates it.

A rerun of a sweep whose driver was SIGKILLed (no handler ran) ends what that driver left
RUNNING (end_orphaned_sweep_runs): the trials it does not resume and any parent it does not
continue end FAILED with a note; it goes on in the rest."""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from trainlab import names
from trainlab.config.checkpoints import latest_checkpoint
from trainlab.ray_job import job_run_name, submission_id
from trainlab.tracking.continued_run import end_left_running
from trainlab.tracking.mlflow_ui import training_experiment
from trainlab.tracking.runs import mlflow_status
from trainlab.tracking.study_owner import check_parent_free
from trainlab.vocab.processes import process_id


def sweep_id(*, sweep_name: str, experiment: str, job_overrides: list[list[str]], study: dict | None = None) -> str:
    """Same name, experiment and set of jobs -> same id (job order does not matter). A search
    (launch.study) passes its first batch's jobs and `study`, its sweeper's identity and objectives:
    a seeded sampler proposes the same first batch again, so a rerun finds the study it continues."""
    jobs = sorted(" ".join(sorted(o)) for o in job_overrides)
    blob = json.dumps({"sweep": sweep_name, "experiment": experiment, "jobs": jobs,
                       **({"study": study} if study is not None else {})}, sort_keys=study is not None)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def open_sweep_parent(*, tracking_uri: str, experiment: str, sweep_name: str, sid: str,
                      definition: dict) -> tuple[str, bool]:
    """The parent run of this sweep: the existing one (set running again) or a new one.

    Returns (run_id, reused)."""
    client = _client(tracking_uri)
    exp_id = training_experiment(client, experiment)
    found = _parents(client, exp_id, sid)[:1]
    if found:
        run_id = found[0].info.run_id
        client.set_tag(run_id, names.TAG_DRIVER, process_id())  # this driver holds it open now
        client.update_run(run_id, status="RUNNING")
        return run_id, True
    job_id = submission_id()
    run = client.create_run(exp_id, run_name=job_run_name(sweep_name), tags={
        names.TAG_ROLE: names.ROLE_SWEEP, names.TAG_SWEEP: sweep_name, names.TAG_SWEEP_ID: sid,
        names.TAG_STATUS: names.STATUS_RUNNING, names.TAG_DRIVER: process_id(),
        **({names.TAG_RAY_JOB: job_id} if job_id else {}),
    })
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "definition.json"
        path.write_text(json.dumps(definition, indent=2))
        client.log_artifact(run.info.run_id, str(path), artifact_path=names.ARTIFACT_SWEEP_DIR)
    return run.info.run_id, False


def check_sweep_free(*, tracking_uri: str, experiment: str, sid: str, sweep_name: str) -> None:
    """StudyHeld where sweep `sid`'s parent run is held by a running driver (tracking.study_owner);
    a store or experiment not made yet holds no parent."""
    client = _client(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    for parent in _parents(client, exp.experiment_id, sid)[:1] if exp is not None else ():
        check_parent_free(parent, sweep_name=sweep_name, tracking_uri=tracking_uri)


def job_key(tags: dict[str, str]) -> str:
    """Which job of its sweep a trial run is: its config hash and its overrides. Two jobs may
    train the same config (a sweep over `cluster.max_failures` or a `debug.*` field, which the
    hash leaves out): only both together tell them apart, in a rerun and in `trainlab compare`."""
    return f"{tags.get(names.TAG_CONFIG_HASH, '')} {tags.get(names.TAG_OVERRIDES, '')}"


def _parents(client, exp_id: str, sid: str) -> list:
    """The parent runs of sweep `sid`, oldest first: a rerun goes on in the oldest."""
    return client.search_runs(
        [exp_id],
        filter_string=f"tags.{names.TAG_SWEEP_ID} = '{sid}' and tags.`{names.TAG_ROLE}` = '{names.ROLE_SWEEP}'",
        max_results=1000, order_by=["attributes.start_time ASC"])


def end_orphaned_sweep_runs(*, tracking_uri: str, sid: str, parent_run_id: str, resumed_roots: set[str]) -> list[str]:
    """The runs of sweep `sid` that an earlier start left RUNNING, its driver a process of this
    machine that is gone (SIGKILLed, crashed): each parent and trial run loses its step_N.tmp
    and ends FAILED with a note (continued_run.end_left_running), except the parent this start
    goes on in (`parent_run_id`) and its trials that this start resumes from their checkpoint
    folders (`resumed_roots`: they go on in their runs). One line per run ended."""
    client = _client(tracking_uri)
    exp_id = client.get_run(parent_run_id).info.experiment_id
    keep, left = {parent_run_id}, []
    for parent in _parents(client, exp_id, sid):
        pid = parent.info.run_id
        trials = client.search_runs([exp_id], max_results=10_000,
                                    filter_string=f"tags.{names.TAG_PARENT_RUN_ID} = '{pid}' and attributes.status = 'RUNNING'")
        if pid == parent_run_id:
            keep |= {r.info.run_id for r in trials if r.data.tags.get(names.TAG_CHECKPOINT_DIR) in resumed_roots}
        left += [*trials, parent]
    return end_left_running(client, left, keep=keep, by="the next start of its sweep")


def _children(tracking_uri: str, parent_run_id: str) -> list:
    client = _client(tracking_uri)
    parent = client.get_run(parent_run_id)
    return client.search_runs([parent.info.experiment_id],
                              filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'",
                              max_results=10_000, order_by=["attributes.start_time ASC"])


def done_children(*, tracking_uri: str, parent_run_id: str) -> dict[str, object]:
    """Children that need no rerun (finished, diverged or pruned: names.DONE_STATUSES), by job_key."""
    done = {}
    for r in _children(tracking_uri, parent_run_id):
        if r.data.tags.get(names.TAG_STATUS) in names.DONE_STATUSES:
            done.setdefault(job_key(r.data.tags), r)
    return done


def unfinished_checkpoints(*, tracking_uri: str, parent_run_id: str) -> dict[str, str]:
    """Children that stopped before their end (the driver was killed, a worker failed past
    cluster.max_failures, preempted) and left a checkpoint folder, by job_key: a rerun
    of the sweep resumes each from there, into the same run. The newest run of a config wins."""
    found = {}
    for r in _children(tracking_uri, parent_run_id):
        tags = r.data.tags
        if tags.get(names.TAG_STATUS) in names.DONE_STATUSES:
            continue
        root = tags.get(names.TAG_CHECKPOINT_DIR)
        if root and latest_checkpoint(Path(root)) is not None:
            found[job_key(tags)] = root
    return found


def close_sweep_parent(*, tracking_uri: str, parent_run_id: str, status: str, summary_md: str) -> None:
    client = _client(tracking_uri)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trials.md"
        path.write_text(summary_md)
        client.log_artifact(parent_run_id, str(path), artifact_path=names.ARTIFACT_SWEEP_DIR)
    client.set_tag(parent_run_id, names.TAG_STATUS, status)
    client.set_terminated(parent_run_id, status=mlflow_status(status))  # an interrupted sweep: KILLED


def log_sweep_result(*, tracking_uri: str, parent_run_id: str, result,
                     trial_labels: Mapping[str, str] | None = None) -> None:
    """The sweep's result (a compare.records.Answer) on its parent run: the winner as a tag, its
    val loss, speedup and Δ val loss and the trials per status as metrics, so the parent's row in
    MLflow's runs table says what won. A rerun logs again at the same step, a later value: MLflow
    shows the newest; a winner that no longer is one is overwritten with NaN, never left stale.
    A study of several objectives (result.pareto_front is not None) gets its Pareto front as well,
    on the parent and on the trial runs of `trial_labels` (run id -> configuration label)."""
    import math
    import time

    from mlflow.entities import Metric, RunTag

    client = _client(tracking_uri)
    now = int(time.time() * 1000)
    best = {names.BEST_VAL_LOSS: result.val_loss, names.BEST_SPEEDUP: result.speedup,
            names.BEST_DELTA_VAL_LOSS: result.delta_val_loss}
    logged = client.get_run(parent_run_id).data.metrics
    values = {k: v for k, v in best.items() if v is not None or k in logged}
    values.update({names.trials_metric(status): n for status, n in result.trials_by_status})
    metrics = [Metric(k, math.nan if v is None else float(v), now, 0) for k, v in values.items()]
    tags = [RunTag(names.TAG_BEST_CONFIG, result.best or "none"),
            RunTag(names.TAG_SWEEP_RESULT, result.line[:5000])]  # MLflow's tag value limit is 8000
    client.log_batch(parent_run_id, metrics=metrics, tags=tags)
    if result.pareto_front is not None:
        log_pareto_front(tracking_uri=tracking_uri, parent_run_id=parent_run_id, front=result.pareto_front,
                         trial_labels=trial_labels or {})


def log_pareto_front(*, tracking_uri: str, parent_run_id: str, front: Sequence[str],
                     trial_labels: Mapping[str, str]) -> None:
    """A study's Pareto front (compare.pareto) where MLflow's UI shows and filters it: its labels
    and size on the parent (names.TAG_PARETO_FRONT, `none` when empty; names.PARETO_SIZE), and on
    each trial run of `trial_labels` names.TAG_PARETO `true` or `false`, as its configuration is on
    the front or not (`tags.pareto = 'true'` lists the front's runs). Every value is written each
    time, so a rerun leaves none stale: a configuration that left the front reads `false`."""
    import time

    from mlflow.entities import Metric, RunTag

    client = _client(tracking_uri)
    labels = "; ".join(front)
    if len(labels) > 5000:  # MLflow's tag value limit is 8000; the size metric still counts them all
        labels = labels[:4990] + " ..."
    client.log_batch(parent_run_id, metrics=[Metric(names.PARETO_SIZE, float(len(front)), int(time.time() * 1000), 0)],
                     tags=[RunTag(names.TAG_PARETO_FRONT, labels or "none")])
    on = set(front)
    for run_id, label in trial_labels.items():
        client.set_tag(run_id, names.TAG_PARETO, "true" if label in on else "false")
