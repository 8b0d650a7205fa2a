"""The MLflow writer process gets its store from the environment, not its command line: anyone on
the machine can read a process's argv (`ps`), and a database URI carries its password."""

from __future__ import annotations

from pathlib import Path

from trainlab.tracking.mlflow_tracker import MlflowTracker


def test_the_writer_command_line_holds_no_store_uri():
    uri = "postgresql://trainer:hunter2@127.0.0.1:1/runs"  # loopback, closed: nothing is delivered
    tracker = MlflowTracker(run_id="0" * 32, tracking_uri=uri, close_timeout_s=1.0)
    try:
        pid = tracker._proc.pid
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    finally:
        tracker.close()
    assert "trainlab.tracking.mlflow_writer" in argv
    assert "hunter2" not in argv and "127.0.0.1:1" not in argv, argv
    assert f"MLFLOW_TRACKING_URI={uri}".encode() in environ  # readable by its own user only
