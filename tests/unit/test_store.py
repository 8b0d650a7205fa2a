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
