"""The MLflow writer process: `python -m trainlab.tracking.mlflow_writer RUN_ID URI`.

Reads JSON lines on stdin (written by MlflowTracker in the training process) and turns them
into batched MLflow calls, so the training process never spends CPU or the GIL on a store
write. Also hosts MLflow's system-metrics sampler for the run. Ends when stdin closes,
after a last flush.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from mlflow.entities import Metric, RunTag
from mlflow.tracking import MlflowClient

_MAX_BATCH = 1000  # MLflow's limit of metrics per log_batch call


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_id")
    ap.add_argument("tracking_uri")
    ap.add_argument("--system-metrics", action="store_true")
    args = ap.parse_args()
    logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # no start/stop chatter
    client = MlflowClient(tracking_uri=args.tracking_uri)
    monitor = None
    if args.system_metrics:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        monitor = SystemMetricsMonitor(args.run_id, sampling_interval=2, samples_before_logging=1,
                                       tracking_uri=args.tracking_uri)
        monitor.start()
    try:
        for line in sys.stdin:
            msg = json.loads(line)
            op = msg["op"]
            if op == "metrics":
                metrics = [Metric(k, float(v), ts, step) for k, v, ts, step in msg["items"]]
                for i in range(0, len(metrics), _MAX_BATCH):
                    client.log_batch(args.run_id, metrics=metrics[i:i + _MAX_BATCH], synchronous=True)
            elif op == "tags":
                client.log_batch(args.run_id, tags=[RunTag(k, v) for k, v in msg["tags"].items()],
                                 synchronous=True)
            elif op == "artifact":
                client.log_artifact(args.run_id, msg["path"])
    finally:
        if monitor is not None:
            monitor.finish()
            if monitor._logging_step == 0:
                # MLflow drops the samples of a run shorter than one interval; keep them
                monitor.collect_metrics()
                monitor.publish_metrics(monitor.aggregate_metrics())
                monitor.mlflow_logger.flush()


if __name__ == "__main__":
    main()
