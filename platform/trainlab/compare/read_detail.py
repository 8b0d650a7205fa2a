"""Read a trial's per-layer and per-rank detail (names.ARTIFACT_DETAIL) back from MLflow.

Through MLflow's artifact API, so it works wherever the run's artifacts are: a local store,
or an `mlflow server` that proxies them (mlflow-artifacts:/). Runs logged before the table
existed (or with tracking.detail=full and no artifact) are read from their per-layer metrics.
"""

from __future__ import annotations

import tempfile

from trainlab import names
from trainlab.tracking.detail_table import COLUMNS


def read_detail(*, tracking_uri: str, run_id: str, client=None):
    """The run's detail table as a pandas DataFrame with trainlab.tracking.detail_table.COLUMNS, or
    None when the run has neither the artifact nor per-layer/per-rank metrics."""
    import pandas as pd
    from mlflow.artifacts import download_artifacts
    from mlflow.tracking import MlflowClient

    client = client or MlflowClient(tracking_uri=tracking_uri)
    if names.ARTIFACT_DETAIL in {a.path for a in client.list_artifacts(run_id)}:
        with tempfile.TemporaryDirectory() as tmp:
            path = download_artifacts(run_id=run_id, artifact_path=names.ARTIFACT_DETAIL, dst_path=tmp,
                                      tracking_uri=tracking_uri)
            return pd.read_parquet(path)
    keys = [k for k in client.get_run(run_id).data.metrics if names.detail_of(k)]
    if not keys:
        return None
    rows = []
    for key in keys:  # one call per metric: older runs only
        kind, name, stat = names.detail_of(key)
        rows += [(m.step, None, kind, name, stat, m.value, key) for m in client.get_metric_history(run_id, key)]
    df = pd.DataFrame(rows, columns=list(COLUMNS)).astype({"tokens": "Int64"})
    return df.drop_duplicates(["step", "metric"], keep="last").sort_values(["step", "metric"], ignore_index=True)


__all__ = ["read_detail"]
