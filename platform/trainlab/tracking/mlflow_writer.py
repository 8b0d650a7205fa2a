"""The MLflow writer process: `python -m trainlab.tracking.mlflow_writer RUN_ID URI`.

Reads JSON lines on stdin (written by MlflowTracker in the training process) and turns them
into batched MLflow calls, so the training process never spends CPU or the GIL on a store
write. Also hosts MLflow's system-metrics sampler for the run.

A thread reads stdin into memory whatever the server does, so the training process's pipe
never fills; the main thread delivers (trainlab.tracking.outbox): while the server is
unreachable it holds the records, in memory and then in the `--spill` file, and delivers
them in order when it answers. When stdin closes it goes on for at most
`--close-timeout-s`, then leaves the rest in the spill file for `trainlab import-spill`.
A `sync` record (a checkpoint) is answered on stdout once all before it is safe.
With `--resume` it first drops the points of steps the run already has (a trial resumed
from a checkpoint replays the steps after it).

Priority: its start (importing MLflow and opening the store, ~2-3 s of CPU) runs at the
training process's priority, during the trial's setup; after it the writer runs
WRITER_NICE steps lower, so its steady work (a batch every flush_every_s, ~0.3 ms per
metric point, a system-metrics sample every SYSTEM_METRICS_INTERVAL_S) gives way to
training on a busy core. (Lowered from the start, its start would be pushed behind training
and into the trial's close, which waits for it.) Ctrl-C (sent to the whole process group)
leaves it running: it ends when the training process closes its stdin, after delivering
what it holds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading

from trainlab.tracking.delivery import SHORT_HTTP_RETRIES, Delivery, warn
from trainlab.tracking.outbox import Outbox
from trainlab.tracking.spill import SpillError

ACK = "trainlab-synced"
WRITER_NICE = 5
"""Added to the writer's niceness once MLflow is up: Linux then gives it about a third of a
training process's share of a contended core (CFS weights 335 : 1024). Not lower: what it
still has to do when training waits on it (a checkpoint's sync, the close, noticing an
outage) must not take minutes on a busy machine (at 10, closing took 11 s at load 5)."""
SYSTEM_METRICS_INTERVAL_S = 10.0
"""Seconds between system-metrics samples (MLflow's default); a run shorter than that still
gets one sample, taken at its end."""


def _read_stdin(outbox: Outbox, stamp: dict) -> None:
    try:
        for line in sys.stdin:
            outbox.put({**json.loads(line), **stamp})
    finally:
        outbox.end_input()


def _ack(sync_id: int) -> None:
    """Answer the tracker's sync: every record before it is in the store or the spill file."""
    print(f"{ACK} {sync_id}", flush=True)


def _start(args: argparse.Namespace):
    """What starting costs (importing MLflow, opening the store, the system-metrics sampler:
    ~2-3 s of CPU), done at the training process's priority, during the trial's setup;
    returns the sampler, not started, if asked for."""
    from mlflow.entities import Metric, RunTag  # noqa: F401 - what every delivery builds
    from mlflow.tracking import MlflowClient

    with contextlib.suppress(Exception):  # a store that fails here fails the first delivery, which says so
        MlflowClient(tracking_uri=args.tracking_uri)  # MLflow keeps the store for the deliveries
    if not args.system_metrics:
        return None
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    return SystemMetricsMonitor(args.run_id, sampling_interval=SYSTEM_METRICS_INTERVAL_S,
                                samples_before_logging=1, tracking_uri=args.tracking_uri)


def _yield_to_training() -> None:
    """Every thread of this process WRITER_NICE steps lower: on Linux each thread has its own
    niceness (os.nice lowers the calling one; threads started later inherit it)."""
    tasks = f"/proc/{os.getpid()}/task"
    if not os.path.isdir(tasks):  # elsewhere the process has one
        os.nice(WRITER_NICE)
        return
    for tid in map(int, os.listdir(tasks)):
        with contextlib.suppress(ProcessLookupError):  # a thread that just ended
            os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + WRITER_NICE)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_id", nargs="?")
    ap.add_argument("--spare", action="store_true",
                    help="import MLflow first, then take the command line (and the store's environment) "
                         "as JSON from the first stdin line; none: exit (mlflow_tracker.prestart_writer)")
    ap.add_argument("--system-metrics", action="store_true")
    ap.add_argument("--spill", default=None, help="where records wait while the server is unreachable")
    ap.add_argument("--resume", action="store_true", help="drop points of steps the run already has")
    ap.add_argument("--outage-buffer", type=int, default=100_000, help="points held in memory before spilling")
    ap.add_argument("--close-timeout-s", type=float, default=30.0)
    args = ap.parse_args()
    if args.spare:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        from mlflow.tracking import MlflowClient  # the start's cost, paid before it is needed

        if os.environ.get("MLFLOW_TRACKING_URI"):  # the store the next run is likely in: opened now
            with contextlib.suppress(Exception):
                MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
        line = sys.stdin.readline()
        if not line:  # not needed after all
            return
        spec = json.loads(line)
        os.environ.update(spec["env"])
        args = ap.parse_args(spec["argv"])
    if not args.run_id:
        ap.error("the run id is required")
    args.tracking_uri = os.environ["MLFLOW_TRACKING_URI"]  # set by MlflowTracker (not in argv: ps shows it)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the end of stdin ends it, after a last delivery
    for k, v in SHORT_HTTP_RETRIES.items():
        os.environ.setdefault(k, v)
    logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # no start/stop chatter
    stamp = {"run_id": args.run_id, "uri": args.tracking_uri}
    options = dict(uri=args.tracking_uri, spill_path=args.spill, max_points=args.outage_buffer,
                   close_timeout_s=args.close_timeout_s, ack=_ack)
    try:
        outbox = Outbox(delivery=Delivery(), **options)
    except SpillError as e:  # never block tracking on an old file: set it aside
        os.replace(args.spill, args.spill + ".unreadable")
        warn(f"{e}; moved it to {args.spill}.unreadable")
        outbox = Outbox(delivery=Delivery(), **options)
    if args.resume:
        outbox.put({"op": "resume", **stamp})
    # reading first, so the training process's pipe never fills while MLflow starts
    threading.Thread(target=_read_stdin, args=(outbox, stamp), name="stdin", daemon=True).start()
    monitor = _start(args)
    _yield_to_training()
    if monitor is not None:
        monitor.start()
    try:
        outbox.run()
    finally:
        if monitor is not None:
            monitor.finish()
            if monitor._logging_step == 0 and not outbox.held_points():
                # MLflow drops the samples of a run shorter than one interval; keep them
                try:
                    monitor.collect_metrics()
                    monitor.publish_metrics(monitor.aggregate_metrics())
                    monitor.mlflow_logger.flush()
                except Exception as e:  # noqa: BLE001 - the server went away just now
                    warn(f"system metrics of run {args.run_id} not logged: {e}")


if __name__ == "__main__":
    main()
    # everything is delivered (synchronous calls) or on disk (the spill file, fsynced): finalizing
    # an interpreter that imported MLflow and SQLAlchemy takes ~0.5 s, which every close waits for
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
