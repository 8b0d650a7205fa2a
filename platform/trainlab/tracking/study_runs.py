"""What a study adds to its MLflow runs: the sweeper and objectives on the parent, and on each
trial run the values its sweeper got (`objective/<name>`, what compare's Pareto front reads)."""

from __future__ import annotations

import math
import time

from trainlab import names


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def tag_parent(*, tracking_uri: str, parent_run_id: str, tags: dict[str, str]) -> None:
    """The study's sweeper, sampler, seed, directions and objectives on its parent run."""
    from mlflow.entities import RunTag

    _client(tracking_uri).log_batch(parent_run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])


def log_objectives(*, tracking_uri: str, run_id: str, values: dict[str, float]) -> None:
    """A trial's objective values on its run (ended by then: MLflow takes metrics on a finished
    run). A non-finite value (a diverged trial's worst) is logged as it is: MLflow keeps inf."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    metrics = [Metric(names.objective_metric(k), float(v), now, 0) for k, v in values.items()
               if not math.isnan(v)]
    if metrics:
        _client(tracking_uri).log_batch(run_id, metrics=metrics)


def log_study_size(*, tracking_uri: str, parent_run_id: str, trials: int) -> None:
    from mlflow.entities import Metric

    _client(tracking_uri).log_batch(parent_run_id, metrics=[
        Metric(names.TRIALS_TOTAL, float(trials), int(time.time() * 1000), 0)])
