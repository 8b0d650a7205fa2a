"""A sweep's parent MLflow run: found again by its definition hash, so a rerun never duplicates it."""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

from trainlab import names
from trainlab.config.checkpoints import latest_checkpoint
from trainlab.ray_job import job_run_name, submission_id
from trainlab.tracking.mlflow_ui import training_experiment
from trainlab.tracking.runs import mlflow_status


def sweep_id(*, sweep_name: str, experiment: str, job_overrides: list[list[str]]) -> str:
    """Same name, experiment and set of jobs -> same id (job order does not matter)."""
    jobs = sorted(" ".join(sorted(o)) for o in job_overrides)
    blob = json.dumps({"sweep": sweep_name, "experiment": experiment, "jobs": jobs})
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
    found = client.search_runs(
        [exp_id],
        filter_string=f"tags.{names.TAG_SWEEP_ID} = '{sid}' and tags.`{names.TAG_ROLE}` = '{names.ROLE_SWEEP}'",
        max_results=1, order_by=["attributes.start_time ASC"],
    )
    if found:
        run_id = found[0].info.run_id
        client.update_run(run_id, status="RUNNING")
        return run_id, True
    job_id = submission_id()
    run = client.create_run(exp_id, run_name=job_run_name(sweep_name), tags={
        names.TAG_ROLE: names.ROLE_SWEEP, names.TAG_SWEEP: sweep_name, names.TAG_SWEEP_ID: sid,
        names.TAG_STATUS: names.STATUS_RUNNING,
        **({names.TAG_RAY_JOB: job_id} if job_id else {}),
    })
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "definition.json"
        path.write_text(json.dumps(definition, indent=2))
        client.log_artifact(run.info.run_id, str(path), artifact_path=names.ARTIFACT_SWEEP_DIR)
    return run.info.run_id, False


def job_key(tags: dict[str, str]) -> str:
    """Which job of its sweep a trial run is: its config hash and its overrides. Two jobs may
    train the same config (a sweep over `cluster.max_failures` or a `debug.*` field, which the
    hash leaves out): only both together tell them apart, in a rerun and in `trainlab compare`."""
    return f"{tags.get(names.TAG_CONFIG_HASH, '')} {tags.get(names.TAG_OVERRIDES, '')}"


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


def log_sweep_result(*, tracking_uri: str, parent_run_id: str, result) -> None:
    """The sweep's result (a compare.records.Answer) on its parent run: the winner as a tag, its
    val loss, speedup and Δ val loss and the trials per status as metrics, so the parent's row in
    MLflow's runs table says what won. A rerun logs again at the same step, a later value: MLflow
    shows the newest; a winner that no longer is one is overwritten with NaN, never left stale."""
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
