"""tracking.store.TrackingStore: one answer to "what kind of store, where does it live, does it
answer" for preflight, compare and the driver's close. Only 127.0.0.1 is ever contacted."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path

import pytest

from conftest import closed_port
from trainlab.tracking.store import TrackingStore


@pytest.mark.parametrize(("uri", "kind", "path"), [
    ("sqlite:////tmp/x/mlflow.db", "sqlite", Path("/tmp/x/mlflow.db")),
    ("file:///tmp/x/mlruns", "file", Path("/tmp/x/mlruns")),
    ("http://127.0.0.1:5000", "server", None),
    ("https://mlflow.example:443/prefix", "server", None),
    ("postgresql+psycopg2://u@db:5432/mlflow", "database", None),
    ("databricks", "other", None),
])
def test_a_store_is_classified_once_with_its_local_path(uri, kind, path):
    store = TrackingStore.of(uri)
    assert (store.kind, store.local_path) == (kind, path)


def test_a_local_store_needs_no_probe_and_a_closed_port_says_why():
    assert TrackingStore.of("sqlite:////tmp/nowhere/mlflow.db").probe(timeout_s=0.5) is None
    why = TrackingStore.of(f"http://127.0.0.1:{closed_port()}").probe(timeout_s=1)
    assert why and "refused" in why.lower()


def test_a_server_that_refuses_the_request_still_answers():
    """An authenticating proxy answers 401 to a request without credentials: it is there."""
    class Deny(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(401)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Deny)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert TrackingStore.of(f"http://127.0.0.1:{server.server_port}").probe(timeout_s=5) is None
    finally:
        server.shutdown()
        server.server_close()


# issue 28: refusals
def test_the_printed_mlflow_ui_command_survives_a_store_path_with_spaces(tmp_path):
    """The `view it` line is pasted into a shell: a path with a space must stay one argument."""
    import shlex

    from trainlab.tracking.store import ui_command

    uri = f"sqlite:///{tmp_path}/my runs/mlflow.db"
    argv = shlex.split(ui_command(uri))
    assert argv[:3] == ["mlflow", "ui", "--backend-store-uri"] and argv[3] == uri


@pytest.mark.slow  # two Python start-ups importing MLflow and migrating a store: seconds
def test_two_processes_making_the_same_new_sqlite_store_at_once_both_succeed(tmp_path):
    """Two sweeps started together used to race MLflow's migrations on a new store (alembic:
    'Online migration expected to match one row'); tracking.store.ensure_store makes it once."""
    import os
    import subprocess
    import sys

    uri = f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}"
    (tmp_path / "new").mkdir()
    go = tmp_path / "go"
    script = ("import os, sys, time\n"
              "from trainlab.tracking.store import ensure_store\n"
              "import mlflow.store.tracking.sqlalchemy_store  # imported before the start line: a real race\n"
              f"open({str(tmp_path)!r} + '/ready' + sys.argv[1], 'w').close()\n"
              f"while not os.path.exists({str(go)!r}): time.sleep(0.01)\n"
              f"ensure_store({uri!r})\n"
              "from mlflow.tracking import MlflowClient\n"
              f"MlflowClient(tracking_uri={uri!r}).create_experiment('e' + sys.argv[1])\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [subprocess.Popen([sys.executable, "-c", script, str(i)], env=env, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    import time
    deadline = time.monotonic() + 300
    while not all((tmp_path / f"ready{i}").exists() for i in range(2)):  # both imported and waiting
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "not both ready in 300 s"
        time.sleep(0.05)
    go.touch()
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    from mlflow.tracking import MlflowClient

    assert {e.name for e in MlflowClient(tracking_uri=uri).search_experiments()} >= {"e0", "e1"}


@pytest.mark.parametrize("setting", ["tracking.uri", "MLFLOW_TRACKING_URI"])
def test_a_folder_store_mlflow_no_longer_writes_is_refused_with_a_sqlite_store_beside_it(tmp_path, monkeypatch,
                                                                                          setting):
    """MLFLOW_TRACKING_URI=/some/path (a file store) used to pass, then MLflow 3 raised a traceback."""
    from trainlab.tracking.store_check import check_tracking_uri

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    uri = (tmp_path / "runs").as_uri()
    with pytest.raises(ValueError) as e:
        check_tracking_uri(uri, setting=setting)
    msg = str(e.value)
    assert msg.startswith(f"{setting}={uri!r}") and "MLflow 3" in msg, msg
    assert f"sqlite:///{tmp_path}/runs.db" in msg and "MLFLOW_ALLOW_FILE_STORE=true" in msg, msg
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    check_tracking_uri(uri, setting=setting)  # the user's opt-in is kept


@pytest.mark.parametrize("blank", [" ", "\t"])
def test_a_blank_environment_uri_is_refused_naming_unset(tmp_path, blank):
    """MLFLOW_TRACKING_URI=' ' used to become a folder store named '%20' in the working directory."""
    from trainlab.tracking.store import tracking_store

    with pytest.raises(ValueError) as e:
        tracking_store("", environ={"MLFLOW_TRACKING_URI": blank}, cwd=str(tmp_path))
    msg = str(e.value)
    assert msg.startswith(f"MLFLOW_TRACKING_URI={blank!r} is blank") and "unset MLFLOW_TRACKING_URI" in msg, msg


def test_a_run_from_a_deleted_working_directory_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    """Hydra's config loader used to end in a FileNotFoundError traceback from os.getcwd()."""
    from trainlab.cli import main

    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    with pytest.raises(SystemExit) as e:
        main(["train", "model=tiny"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("error: ") == 1 and "Traceback" not in err, err
    assert "working directory" in err and "no longer exists" in err and "cd " in err, err
