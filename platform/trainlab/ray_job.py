"""A `trainlab train` that runs as a Ray job's driver (`trainlab submit`, `ray job submit`).

Ray starts a job's entrypoint in the job's working directory, a copy of the uploaded project
under the node's Ray temp dir (`.../runtime_resources/working_dir_files/_ray_pkg_<hash>`) that
Ray deletes when it cleans its runtime resources; Hydra's default run folder (outputs/...,
multirun/...) and MLflow's default store (sqlite:///mlflow.db) are relative to it, so a job's
outputs and checkpoints vanished with it. As a job's driver, the app writes instead to

    $TRAINLAB_OUTPUT_ROOT/<submission id>/     (default ~/trainlab-outputs/<submission id>/)

(`trainlab submit --output-root DIR` sets it; on a multi-node cluster give shared storage
mounted at the same path on every node: the workers write checkpoints there), unless the
command names hydra.run.dir / hydra.sweep.dir itself; MLflow's default store becomes
<that folder>/mlflow.db when MLFLOW_TRACKING_URI is not set. Its MLflow runs say they were a
job: the run name ends in `(job <submission id>)` and the tag `ray_job` holds the id.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping

OUTPUT_ROOT_ENV = "TRAINLAB_OUTPUT_ROOT"
DEFAULT_OUTPUT_ROOT = "~/trainlab-outputs"
JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
"""What Ray's job supervisor sets for the entrypoint: JSON whose metadata holds the submission id."""
_FOLDER_KEYS = ("hydra.run.dir", "hydra.sweep.dir")


def submission_id(environ: Mapping[str, str] | None = None) -> str:
    """The Ray job's submission id (raysubmit_...) when this process is a job's driver, else ''."""
    environ = os.environ if environ is None else environ
    try:
        meta = json.loads(environ.get(JOB_CONFIG_ENV, "") or "{}").get("metadata") or {}
    except (ValueError, AttributeError):
        return ""
    return str(meta.get("job_submission_id", "") or "")


def job_folder(job_id: str, environ: Mapping[str, str] | None = None) -> str:
    """Where a job's outputs go: <output root>/<submission id>, absolute."""
    environ = os.environ if environ is None else environ
    root = environ.get(OUTPUT_ROOT_ENV) or DEFAULT_OUTPUT_ROOT
    return os.path.normpath(os.path.join(os.path.expanduser(root), job_id))


def _hydra_value(path: str) -> str:
    """`path` as a Hydra override value: quoted unless it is plain."""
    if re.fullmatch(r"[\w/.~+-]+", path):
        return path
    return "'" + path.replace("\\", "\\\\").replace("'", "\\'") + "'"


def job_overrides(overrides: list[str], *, environ: dict[str, str] | None = None) -> list[str]:
    """`overrides` of `trainlab train`, with the job's output folder added when this process is a
    job's driver (and the default MLflow store moved there, in `environ`); unchanged otherwise."""
    environ = os.environ if environ is None else environ
    job_id = submission_id(environ)
    if not job_id:
        return overrides
    folder = job_folder(job_id, environ)
    os.makedirs(folder, exist_ok=True)  # before Hydra and MLflow's store look for it
    given = {o.lstrip("+~").split("=", 1)[0] for o in overrides if "=" in o}
    extra = [f"{key}={_hydra_value(folder)}" for key in _FOLDER_KEYS if key not in given]
    if not environ.get("MLFLOW_TRACKING_URI"):  # MLflow's default store is relative to the job's cwd too
        environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{os.path.join(folder, 'mlflow.db')}"
    return [*overrides, *extra]


def job_run_name(name: str) -> str:
    """An MLflow run name that says the run was a Ray job (unchanged outside a job)."""
    job_id = submission_id()
    return f"{name} (job {job_id})" if job_id else name
