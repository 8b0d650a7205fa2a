"""The driver's side of MLflow: resolve the store, open a trial's run, close it with a status.

The driver creates the run (so it knows the run id before any worker starts, and can mark
the run failed even if every worker dies); rank 0 then logs metrics into it.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from trainlab import names
from trainlab.config import RunConfig, config_hash, flatten, to_yaml
from trainlab.events import TrialResult
from trainlab.plan.derive_layout import elastic_range
from trainlab.ray_job import job_run_name, submission_id
from trainlab.redact import redact
from trainlab.tracking.delivery import Delivery, Unreachable, warn
from trainlab.tracking.import_spill import import_spill
from trainlab.tracking.mlflow_ui import training_experiment
from trainlab.tracking.spill import Spill
from trainlab.tracking.store import TrackingStore
from trainlab.vocab.precision import spec_of
from trainlab.vocab.processes import process_id


@dataclass(frozen=True)
class TrialRun:
    run_id: str
    experiment_id: str
    tracking_uri: str


def trial_tags(run: RunConfig) -> dict[str, str]:
    """Tags known from the config alone; rank 0 adds device, corpus and emulation tags."""
    tags = {
        names.TAG_PRECISION: run.precision.name,
        names.TAG_PARALLEL: run.parallel.name,
        names.TAG_MODEL: run.model.name,
        names.TAG_WORLD_SIZE: str(run.cluster.num_workers),
        names.TAG_SEED: str(run.seed),
        names.TAG_CONFIG_HASH: config_hash(run),
        names.TAG_CORPUS: run.data.name,
        names.TAG_STATUS: names.STATUS_RUNNING,
        names.TAG_DRIVER: process_id(),
    }
    if spec_of(run.precision.name).low_precision_params:  # its update variants train differently
        tags[names.TAG_BF16_UPDATE] = run.precision.bf16_update
    job_id = submission_id()
    if job_id:  # a Ray job's run: found by its job id
        tags[names.TAG_RAY_JOB] = job_id
    span = elastic_range(run)
    if span:  # rank 0 sets world_size to its own start's gang; fault/workers holds every start's
        tags[names.TAG_ELASTIC] = f"{span[0]}-{span[1]}"
    return tags


def default_run_name(run: RunConfig) -> str:
    return run.tracking.run_name or (
        f"{run.model.name}-{run.precision.name}-{run.parallel.name}{run.cluster.num_workers}-s{run.seed}"
    )


def split_config(run: RunConfig) -> tuple[dict, dict[str, str]]:
    """The flattened config as (params, tags): the knobs, and the per-run keys (names.PER_RUN_KEYS:
    paths, addresses, names) under their config tags, set ones only."""
    flat = flatten(run)
    per_run = {names.config_tag(k): str(flat.pop(k)) for k in names.PER_RUN_KEYS if k in flat}
    return flat, {k: v for k, v in per_run.items() if v}


def config_of(params: dict[str, str], tags: dict[str, str]) -> dict[str, str]:
    """A run's flattened config as open_trial_run logged it (params, and the per-run keys from
    their tags; '' where unset), whatever the version: older runs logged every key as a param."""
    per_run = {k: tags.get(names.config_tag(k), "") for k in names.PER_RUN_KEYS if k not in params}
    return {**params, **per_run}


def open_trial_run(run: RunConfig, *, tracking_uri: str, tags: dict[str, str],
                   parent_run_id: str | None = None) -> TrialRun:
    """Create the trial's MLflow run with params (flattened config), tags and config.yaml."""
    from mlflow.entities import Param
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp_id = training_experiment(client, run.tracking.experiment)
    knobs, per_run = split_config(run)
    all_tags = {k: redact(str(v)) for k, v in {**per_run, **tags}.items()}  # a tag may quote an override or an error
    if parent_run_id:
        all_tags["mlflow.parentRunId"] = parent_run_id
    name = default_run_name(run)
    if not parent_run_id and not run.tracking.run_name:  # a job's trial is told from a sweep's children
        name = job_run_name(name)
    created = client.create_run(exp_id, run_name=name, tags=all_tags)
    run_id = created.info.run_id
    params = [Param(k, redact(str(v))) for k, v in sorted(knobs.items())]
    for i in range(0, len(params), 100):  # MLflow's limit of params per batch
        client.log_batch(run_id, params=params[i:i + 100])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / names.ARTIFACT_CONFIG
        path.write_text(redact(to_yaml(run)))
        client.log_artifact(run_id, str(path))
    return TrialRun(run_id=run_id, experiment_id=exp_id, tracking_uri=tracking_uri)


def spill_path(output_dir: str) -> str:
    """Where a trial's MLflow records wait while the tracking server is unreachable."""
    return os.path.join(os.path.abspath(output_dir or "."), names.SPILL_FILE)


def tracker_options(run: RunConfig) -> dict:
    """MlflowTracker keywords from the config (the run id and URI come from the open run)."""
    return {"flush_every_s": run.tracking.flush_every_s, "system_metrics": run.tracking.system_metrics,
            "spill_path": spill_path(run.output_dir), "outage_buffer": run.tracking.outage_buffer,
            "close_timeout_s": run.tracking.close_timeout_s}


def closing_tags(result: TrialResult | None, error: str, *, pruned_reason: str = "") -> dict[str, str]:
    """The tags a trial's end adds: the error, where and on what it diverged, or where and why
    the sweep's pruner stopped it."""
    tags = {}
    if error:
        tags[names.TAG_ERROR] = error
    if result is not None and result.diverged_step is not None:
        tags[names.TAG_DIVERGED_STEP] = result.diverged_step
        tags[names.TAG_FIRST_NONFINITE] = result.first_nonfinite
    if result is not None and result.status == names.STATUS_PRUNED:
        tags[names.TAG_PRUNED_STEP] = result.steps
        tags[names.TAG_PRUNED_REASON] = pruned_reason or "stopped by the sweep's pruner"
    return tags


def mlflow_status(status: str) -> str:
    """MLflow's run status for a trial status: a preempted trial was KILLED (it resumes)."""
    return {names.STATUS_FAILED: "FAILED", names.STATUS_PREEMPTED: "KILLED"}.get(status, "FINISHED")


def close_trial_run(trial: TrialRun, *, status: str, tags: dict[str, str] | None = None,
                    spill: str | None = None) -> None:
    """Set the status tag (finished / diverged / pruned / failed) and end the run in MLflow's terms.

    With `spill` (the trial's spill file): if the tracking server is unreachable, the status
    goes to the end of that file instead (delivered by `trainlab import-spill`), and if the
    file holds metrics rank 0 could not deliver, they are delivered first, in order."""
    all_tags = {**(tags or {}), names.TAG_STATUS: status}
    stamp = {"run_id": trial.run_id, "uri": trial.tracking_uri}
    records = [{"op": "tags", **stamp, "tags": {k: redact(str(v))[:5000] for k, v in all_tags.items()}},
               {"op": "terminate", **stamp, "status": mlflow_status(status)}]
    held, appended = Spill(spill) if spill else None, False
    try:
        store = TrackingStore.of(trial.tracking_uri)
        if held is None or (not held.exists() and store.probe() is None):
            for record in records:
                Delivery().send([record])
            return
        held.append(records)  # behind the metrics it holds: the run ends after its last step
        appended = True
        if store.probe() is None:
            import_spill(spill, remove=True)
            return
    except Unreachable:
        if held is None:
            raise
        if not appended:  # the server went away during the calls
            held.append(records)
    warn(f"MLflow server {trial.tracking_uri} unreachable: the final status ({status}) of run "
         f"{trial.run_id} is kept in {spill}; deliver it with: trainlab import-spill {spill}")
