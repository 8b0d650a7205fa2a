"""The MLflow writer process gets its store from the environment, not its command line: anyone on
the machine can read a process's argv (`ps`), and a database URI carries its password."""

from __future__ import annotations

import subprocess

from trainlab.tracking.mlflow_tracker import MlflowTracker


def test_the_writer_command_line_holds_no_store_uri(monkeypatch):
    """What the writer is started with, as Popen was asked (its /proc entry is gone as soon as a
    writer that cannot reach its store exits, which it does at once since it ends with os._exit)."""
    started = []
    real_popen = subprocess.Popen

    def popen(args, **kwargs):
        started.append((list(args), dict(kwargs.get("env") or {})))
        return real_popen(args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", popen)
    uri = "postgresql://trainer:hunter2@127.0.0.1:1/runs"  # loopback, closed: nothing is delivered
    tracker = MlflowTracker(run_id="0" * 32, tracking_uri=uri, close_timeout_s=1.0)
    tracker.close()
    (argv, env), = started
    argv = " ".join(argv)
    assert "trainlab.tracking.mlflow_writer" in argv
    assert "hunter2" not in argv and "127.0.0.1:1" not in argv, argv
    assert env.get("MLFLOW_TRACKING_URI") == uri  # readable by its own user only
