"""Records (see trainlab.tracking.spill) turned into MLflow calls, one call at a time.

Shared by the writer process, the driver's close and `trainlab import-spill`. A failure
that a returning server fixes (no connection, a timeout, a 5xx or 429) raises Unreachable
and consumes nothing; any other failure (the run was deleted, a value MLflow refuses) is
printed and the record dropped, since sending it again cannot succeed.

Sending a batch again after an ambiguous failure (the server stored it, then died before
answering) stores nothing twice on MLflow's SQL stores: a metric point is keyed by
(run, key, step, timestamp, value) and each point keeps the timestamp it was logged with.
"""

from __future__ import annotations

import os
import sys

from trainlab import names
from trainlab.redact import redact
from trainlab.tracking.spill import MAX_BATCH

SHORT_HTTP_RETRIES = {
    # MLflow retries a failed request 7 times with backoff (minutes) before raising; an
    # outage should be noticed in seconds, the callers retry on their own terms
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}
"""Set (unless already set) in processes whose MLflow calls all go through a Delivery."""


class Unreachable(Exception):
    """The tracking server did not answer; the same call may succeed later."""


def transient(e: BaseException) -> bool:
    """Would the same call succeed once the server is back?"""
    from mlflow.exceptions import MlflowException

    if isinstance(e, MlflowException):  # REST errors and wrapped connection errors alike
        status = e.get_http_status_code()
        return status >= 500 or status == 429
    return isinstance(e, OSError | TimeoutError) or type(e).__name__ == "OperationalError"


def warn(message: str) -> None:
    print(f"trainlab: {redact(message)}", file=sys.stderr, flush=True)


class Delivery:
    """Sends records to MLflow; `tracking_uri` (if set) replaces the URI the records name."""

    def __init__(self, *, tracking_uri: str | None = None):
        self._uri = tracking_uri
        self._clients: dict = {}
        self._last_steps: dict[str, dict[str, int]] = {}
        """Per resumed run: the last step each metric key had in the store when it resumed."""

    def send(self, records: list[dict]) -> int:
        """Deliver the first batch of `records` (one MLflow call: consecutive metrics records
        of one run up to MAX_BATCH points, or one other record); returns how many records it
        consumed. Raises Unreachable when the server did not take them."""
        first = records[0]
        n = 1
        if first["op"] == "metrics":
            total = len(first["items"])
            while (n < len(records) and records[n]["op"] == "metrics" and records[n]["run_id"] == first["run_id"]
                   and records[n]["uri"] == first["uri"] and total + len(records[n]["items"]) <= MAX_BATCH):
                total += len(records[n]["items"])
                n += 1
        try:
            self._call(records[:n])
        except Exception as e:
            if transient(e):
                raise Unreachable(str(e).splitlines()[0][:300]) from e
            warn(f"MLflow refused a {first['op']} record of run {first['run_id']} and it is dropped: {e}")
        return n

    def keep(self, record: dict) -> dict:
        """The record without points a resumed run already has (steps at or below the last
        step its key had when the run resumed); the once-per-start keys are kept (names.PER_START)."""
        last = self._last_steps.get(record["run_id"])
        if record["op"] != "metrics" or not last:
            return record
        items = [it for it in record["items"] if it[0] in names.PER_START or it[3] > last.get(it[0], -1)]
        return record if len(items) == len(record["items"]) else {**record, "items": items}

    def resume(self, run_id: str, uri: str) -> None:
        """Read, per metric key the run has, its last logged step (the `resume` record)."""
        client = self._client(uri)
        keys = client.get_run(run_id).data.metrics
        self._last_steps[run_id] = {
            key: max(m.step for m in client.get_metric_history(run_id, key)) for key in keys}

    # -- internals -------------------------------------------------------------------------
    def _client(self, uri: str):
        from mlflow.tracking import MlflowClient

        uri = self._uri or uri
        if uri not in self._clients:
            self._clients[uri] = MlflowClient(tracking_uri=uri)
        return self._clients[uri]

    def _call(self, records: list[dict]) -> None:
        from mlflow.entities import Metric, RunTag

        first = records[0]
        op, run_id, client = first["op"], first["run_id"], self._client(first["uri"])
        if op == "metrics":
            items = [it for r in records for it in self.keep(r)["items"]]
            if items:
                client.log_batch(run_id, metrics=[Metric(k, float(v), int(ts), int(step))
                                                  for k, v, ts, step in items], synchronous=True)
        elif op == "tags":
            client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in first["tags"].items()],
                             synchronous=True)
        elif op == "artifact":
            if not os.path.exists(first["path"]):
                warn(f"artifact {first['path']} of run {run_id} no longer exists; not logged")
                return
            if os.path.isdir(first["path"]):  # a folder (train.export's hf_model): its files under its name
                client.log_artifacts(run_id, first["path"], artifact_path=os.path.basename(first["path"]))
            else:
                client.log_artifact(run_id, first["path"])
        elif op == "resume":
            self.resume(run_id, first["uri"])
        elif op == "terminate":
            client.set_terminated(run_id, status=first["status"])
        else:
            warn(f"unknown record {op!r} of run {run_id} skipped")
