"""Logging a trial's metrics to its MLflow run from rank 0, batched off the hot path.

`log_metrics` only appends to a list; a background thread sends `log_batch` calls every
`flush_every_s` (at most 1000 metrics a call, MLflow's limit), so a training step never
waits on a database write or an HTTP round trip.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

_MAX_BATCH = 1000


class MlflowTracker:
    def __init__(self, *, run_id: str, tracking_uri: str, flush_every_s: float = 2.0,
                 system_metrics: bool = False):
        self.run_id = run_id
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self._pending: list[Metric] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._flush_every_s = flush_every_s
        self._thread = threading.Thread(target=self._loop, name="mlflow-flush", daemon=True)
        self._thread.start()
        self._sysmon = _start_system_metrics(run_id, tracking_uri) if system_metrics else None

    # -- Tracker protocol ------------------------------------------------------------------
    def log_metrics(self, metrics: dict[str, float], *, step: int) -> None:
        ts = int(time.time() * 1000)
        batch = [Metric(k, float(v), ts, step) for k, v in metrics.items()]
        with self._lock:
            self._pending.extend(batch)

    def set_tags(self, tags: dict[str, Any]) -> None:
        for k, v in tags.items():
            self.client.set_tag(self.run_id, k, str(v))

    def log_artifact(self, path: str) -> None:
        self.client.log_artifact(self.run_id, path)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.flush()
        if self._sysmon is not None:
            self._sysmon.finish()

    # -- batching --------------------------------------------------------------------------
    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for i in range(0, len(pending), _MAX_BATCH):
            self.client.log_batch(self.run_id, metrics=pending[i:i + _MAX_BATCH], synchronous=True)

    def _loop(self) -> None:
        while not self._stop.wait(self._flush_every_s):
            self.flush()


def _start_system_metrics(run_id: str, tracking_uri: str):
    """MLflow's own system-metrics sampler (CPU, memory, GPU where present) on this run."""
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    monitor = SystemMetricsMonitor(run_id, sampling_interval=2, samples_before_logging=1,
                                   tracking_uri=tracking_uri)
    monitor.start()
    return monitor
