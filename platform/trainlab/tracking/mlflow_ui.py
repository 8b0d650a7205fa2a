"""Where a person looks at trainlab's runs in MLflow's UI: experiments marked as model training,
and links that land on a sweep's trials and on MLflow's compare page of them.

MLflow 3.17's UI shows one of two workflows, GenAI (traces, evaluations) and model training
(runs, charts), chosen by a switch in its sidebar that a URL sets with `workflowType=` and that
defaults to GenAI; so every link says `workflowType=machine_learning`. Experiments also carry
MLflow's `mlflow.experimentKind` tag, which MLflow's clients and other 3.x UIs read to choose
the view, set when trainlab creates or next writes to an experiment and never over a kind
someone chose (names.TAG_EXPERIMENT_KIND).

The runs page reads its search box and sort from the URL (`searchFilter`, `orderByKey`,
`orderByAsc`, as the UI writes them itself); filtered and sorted by a metric it lists runs
flat, so the sweep's trials show at once, best val loss first, not folded under their parent.
"""

from __future__ import annotations

import json
from urllib.parse import quote, urlparse

from trainlab import names
from trainlab.redact import redact
from trainlab.tracking.store import TrackingStore, ui_command

MLFLOW_UI_DEFAULT = "http://127.0.0.1:5000"
"""Where `mlflow ui --host 127.0.0.1` serves a local store (its default port)."""
WORKFLOW = "workflowType=machine_learning"


def training_experiment(client, name: str) -> str:
    """The id of experiment `name`, created if missing, marked as model training unless it
    says what it is already (a kind a user chose stays)."""
    kind = {names.TAG_EXPERIMENT_KIND: names.EXPERIMENT_KIND_TRAINING}
    exp = client.get_experiment_by_name(name)
    if exp is None:
        return client.create_experiment(name, tags=kind)
    if not exp.tags.get(names.TAG_EXPERIMENT_KIND):  # made by an older trainlab, or by hand
        client.set_experiment_tag(exp.experiment_id, names.TAG_EXPERIMENT_KIND, names.EXPERIMENT_KIND_TRAINING)
    return exp.experiment_id


def ui_base(tracking_uri: str) -> str:
    """The UI's address: the tracking server itself (credentials masked), or `mlflow ui`'s
    default address for a local store."""
    if TrackingStore.of(tracking_uri).local_path is not None:
        return MLFLOW_UI_DEFAULT
    parsed = urlparse(redact(tracking_uri))
    return f"{parsed.scheme}://{parsed.netloc.rpartition('@')[2]}{parsed.path.rstrip('/')}"


def _q(text: str) -> str:
    return quote(text, safe="")


def run_link(tracking_uri: str, *, experiment_id: str, run_id: str) -> str:
    """One run's page (its metrics, params and charts)."""
    return f"{ui_base(tracking_uri)}/#/experiments/{experiment_id}/runs/{run_id}?{WORKFLOW}"


def sweep_runs_link(tracking_uri: str, *, experiment_id: str, parent_run_id: str) -> str:
    """The runs page of the experiment showing the sweep's trials (the children of its parent
    run), best val loss first."""
    where = _q(f"tags.{names.TAG_PARENT_RUN_ID}='{parent_run_id}'")
    order = _q(f"metrics.`{names.VAL_LOSS}`")
    return (f"{ui_base(tracking_uri)}/#/experiments/{experiment_id}/runs?{WORKFLOW}"
            f"&searchFilter={where}&orderByKey={order}&orderByAsc=true")


def compare_link(tracking_uri: str, *, experiment_id: str, run_ids: list[str]) -> str:
    """MLflow's compare page of `run_ids` (parallel coordinates of the params that differ, the
    metrics side by side). Quotes are escaped: terminals end a link at a bare quote."""
    runs = quote(json.dumps(list(run_ids), separators=(",", ":")), safe="[],")
    return (f"{ui_base(tracking_uri)}/#/compare-runs?runs={runs}"
            f"&experiments=[%22{experiment_id}%22]&{WORKFLOW}")


def sweep_link_lines(tracking_uri: str, *, parent_run_id: str, run_ids: list[str],
                     experiment_id: str | None = None) -> list[str]:
    """What the end of a sweep and `trainlab compare` print: how to open the UI (a local store
    needs `mlflow ui`), the sweep's trials, and the compare page of its trials (those with a run)."""
    if experiment_id is None:
        from mlflow.tracking import MlflowClient

        experiment_id = MlflowClient(tracking_uri=tracking_uri).get_run(parent_run_id).info.experiment_id
    lines = []
    if TrackingStore.of(tracking_uri).local_path is not None:
        lines.append(f"MLflow UI: {ui_command(tracking_uri)}")
    lines.append(f"trials: {sweep_runs_link(tracking_uri, experiment_id=experiment_id, parent_run_id=parent_run_id)}")
    ids = [r for r in run_ids if r]
    if len(ids) >= 2:  # MLflow compares two runs or more
        lines.append(f"compare: {compare_link(tracking_uri, experiment_id=experiment_id, run_ids=ids)}")
    return lines
