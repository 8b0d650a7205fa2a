"""The README's own forms through the real CLI: relative paths reach Ray workers that run in another
directory, tracking URIs MLflow would misread are refused at the door, and a tracking server's
credentials reach it the way MLflow's client sends them, and are shown and stored nowhere.

Credentials are tested against a real `mlflow server` (tests/conftest.py) behind a small real
HTTP proxy on 127.0.0.1 that demands basic auth on every request, as nginx in front of MLflow
would (`mlflow server --app-name basic-auth` needs Flask-Login and Flask-WTF, not installed here).
"""

from __future__ import annotations

import base64
import http.client
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from trainlab import names
from trainlab.data import write_token_file

VOCAB = 100
TINY = ["model=tiny", "train.seq_len=32", "train.global_batch_size=4", "train.micro_batch_size=2",
        "data=tokens", "data.path=tok.bin", f"data.vocab_size={VOCAB}"]
USER, PASSWORD = "trainer", "pw-7f3kQ9zX"


# ------------------------------------------------------------------------------ a basic-auth proxy
class BasicAuthProxy:
    """An HTTP proxy on 127.0.0.1 that forwards a request to `upstream` only with the right
    `Authorization: Basic` header, and answers 401 to every other (health checks included)."""

    def __init__(self, upstream_port: int, *, user: str, password: str):
        expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.refused = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().strip(), 16)
                        if size == 0:
                            self.rfile.readline()
                            return b"".join(chunks)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _forward(self) -> None:
                body = self._body()
                if self.headers.get("Authorization") != expected:
                    proxy.refused += 1
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="mlflow"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("authorization", "host", "transfer-encoding", "connection")}
                headers["Content-Length"] = str(len(body))
                conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=60)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    conn.close()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def uri(self, *, user: str | None = None, password: str | None = None) -> str:
        auth = f"{user}:{password}@" if user else ""
        return f"http://{auth}127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def auth_proxy(mlflow_server):
    proxy = BasicAuthProxy(mlflow_server.port, user=USER, password=PASSWORD)
    yield proxy
    proxy.close()


# ------------------------------------------------------------------------------ running the CLI
@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    ray_session: list[str]

    @property
    def shown(self) -> str:
        return f"\n--- stdout\n{self.stdout[-3000:]}\n--- stderr\n{self.stderr[-3000:]}"


def _env(**extra: str) -> dict:
    """This environment without MLflow, Ray and Hydra settings, and with loopback kept off any
    HTTP proxy (requests, and so MLflow's client, honour *_proxy variables)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MLFLOW_", "RAY_", "HYDRA_")) and not k.lower().endswith("_proxy")}
    return {**env, "PYTHONUNBUFFERED": "1", "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
            **extra}


def trainlab_train(cwd: Path, *args: str, env: dict | None = None, timeout: float = 120) -> Outcome:
    """`python -m trainlab.cli train ARGS` started in `cwd`, as a user types it there."""
    with tempfile.TemporaryDirectory(prefix="tlpaths-") as ray_tmp:  # a Ray session would start here
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "trainlab.cli", "train", *args], cwd=cwd, text=True,
                              capture_output=True, timeout=timeout,
                              env={**(env or _env()), "RAY_TMPDIR": ray_tmp, "TMPDIR": ray_tmp})
        seconds = time.perf_counter() - start
        session = [str(p) for p in Path(ray_tmp).rglob("session_*")]
    return Outcome(proc.returncode, proc.stdout, proc.stderr, seconds, session)


def assert_refused(out: Outcome, *says: str) -> None:
    """Exit 2, one `error:` line holding `says`, no traceback, no Ray session, within seconds."""
    assert out.returncode == 2, out.shown
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, out.shown
    for part in says:
        assert part in errors[0], f"{part!r} not in the message{out.shown}"
    assert "Traceback" not in out.stdout + out.stderr, out.shown
    assert not out.ray_session, f"a Ray session was started: {out.ray_session}"
    assert out.seconds < 60, f"took {out.seconds:.0f} s to refuse"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A user's folder: a token file (tok.bin) and nothing else."""
    work = tmp_path_factory.mktemp("work")
    write_token_file(work / "tok.bin", np.random.default_rng(0).integers(0, VOCAB, 20_000), "uint16")
    return work


# ------------------------------------------------------------------------------ tracking URI forms
@pytest.mark.parametrize("args, env, says", [
    pytest.param(["tracking.uri=sqlite://mlflow2.db"], {},
                 ["tracking.uri='sqlite://mlflow2.db'", "sqlite:///mlflow2.db", "sqlite:////", "absolute"],
                 marks=pytest.mark.slow),  # file:// is the same check in the gate
    (["tracking.uri=file://mlruns"], {}, ["tracking.uri='file://mlruns'", "file:///", "mlruns"]),
    pytest.param([], {"MLFLOW_TRACKING_URI": "garbage:::x"},
                 ["MLFLOW_TRACKING_URI='garbage:::x'", "scheme 'garbage'", "http://HOST:PORT"],
                 marks=pytest.mark.slow),  # the unit tests check the scheme; one CLI start-up fewer in the gate
    ([f"tracking.uri=postgresql://user:{PASSWORD}@127.0.0.1:1/db"], {},
     ["tracking.uri='postgresql://user:***@127.0.0.1:1/db'", "127.0.0.1:1", "within 5 s"]),
], ids=["sqlite_two_slashes", "file_two_slashes", "env_garbage", "postgresql_unreachable"])
def test_bad_tracking_uri_is_refused(work, args, env, says):
    out = trainlab_train(work, *TINY, "train.max_steps=2", *args, env=_env(**env))
    assert_refused(out, *says)
    assert PASSWORD not in out.stdout + out.stderr, out.shown
    assert not (work / "mlflow2.db").exists() and not list(work.glob("*.db"))


@pytest.mark.slow  # a real mlflow server
def test_wrong_credentials_are_refused_without_echo(work, auth_proxy):
    out = trainlab_train(work, *TINY, "train.max_steps=2",
                         f"tracking.uri={auth_proxy.uri(user=USER, password='wrong-' + PASSWORD)}")
    assert_refused(out, "tracking.uri=", "refused the credentials (HTTP 401)", "MLFLOW_TRACKING_PASSWORD")
    assert PASSWORD not in out.stdout + out.stderr, out.shown


@pytest.mark.slow  # a real mlflow server
@pytest.mark.parametrize("env_form", ["uri", "variables"])
def test_credentials_in_the_environment_reach_the_server(work, auth_proxy, env_form):
    """MLFLOW_TRACKING_URI=http://user:pw@... and MLFLOW_TRACKING_USERNAME/_PASSWORD pass the
    server check: the command goes on to the next check (a missing checkpoint, refused after
    the store was found reachable), and the password is not shown."""
    env = (_env(MLFLOW_TRACKING_URI=auth_proxy.uri(user=USER, password=PASSWORD)) if env_form == "uri" else
           _env(MLFLOW_TRACKING_URI=auth_proxy.uri(), MLFLOW_TRACKING_USERNAME=USER,
                MLFLOW_TRACKING_PASSWORD=PASSWORD))
    out = trainlab_train(work, *TINY, "train.max_steps=2", "train.resume=no_such_checkpoint", env=env)
    assert_refused(out, "no_such_checkpoint")
    assert "does not answer" not in out.stderr and "refused the credentials" not in out.stderr, out.shown
    assert PASSWORD not in out.stdout + out.stderr, out.shown


def test_a_refused_sweep_keeps_the_password_out_of_its_files(work):
    """Hydra saves a sweep's overrides (multirun.yaml, each job's .hydra/) before trainlab runs,
    with ':' escaped; a job refused at composition quotes its overrides in the error."""
    uri = f"http://{USER}:{PASSWORD}@127.0.0.1:1"
    out = trainlab_train(work, "-m", *TINY, "train.max_steps=2", "seed=0,1", f"tracking.uri={uri}",
                         "train.global_batch_size=6", "hydra.sweep.dir=refused_sweep")
    assert_refused(out, "the sweep has invalid jobs")
    assert "train.global_batch_size=6" in out.stderr and "trainer\\:***@127.0.0.1" in out.stderr, out.shown
    assert PASSWORD not in out.stdout + out.stderr, out.shown
    written = [p for p in (work / "refused_sweep").rglob("*") if p.is_file()]
    assert any(p.name == "multirun.yaml" for p in written) and any(p.parts[-2] == ".hydra" for p in written)
    leaked = [str(p) for p in written if PASSWORD.encode() in p.read_bytes()]
    assert not leaked, leaked


# ------------------------------------------------------------------------------ one trial on Ray
@pytest.fixture(scope="module")
def resumed_trial(work, auth_proxy, mlflow_server):
    """The README's forms, each relative to the folder the command runs in: a checkpoint made
    there by the engine alone (torchrun's environment, no Ray), then a trial on a local Ray
    cluster that reads `data.path=tok.bin`, resumes from `train.resume=first/checkpoints/
    step_00000002`, writes to `output_dir=second`, and reports to an MLflow server behind basic
    auth whose password is in tracking.uri."""
    first = trainlab_train(work, *TINY, "train.max_steps=4", "train.checkpoint_every=2", "cluster.num_workers=1",
                           "tracking=none", "output_dir=first",
                           env=_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0",
                                    WORLD_SIZE="1", LOCAL_RANK="0"))
    assert first.returncode == 0, first.shown
    assert (work / "first" / "checkpoints" / "step_00000002").is_dir(), first.shown
    out = trainlab_train(work, *TINY, "train.max_steps=4", "cluster.num_workers=1",
                         "train.resume=first/checkpoints/step_00000002", "output_dir=second",
                         f"tracking.uri={auth_proxy.uri(user=USER, password=PASSWORD)}",
                         "tracking.experiment=driver_paths", timeout=420)
    return out


@pytest.mark.ray
@pytest.mark.slow
def test_relative_paths_train_and_resume_on_ray(resumed_trial, mlflow_server):
    out = resumed_trial
    assert out.returncode == 0, out.shown
    assert "resumed from" in out.stdout and "step_00000002 at step 2" in out.stdout, out.shown
    assert "finished" in out.stdout, out.shown
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_server.uri)  # the server itself, behind the proxy
    runs = client.search_runs([client.get_experiment_by_name("driver_paths").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED", runs
    steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, names.LOSS)]
    assert sorted(steps) == [3, 4], steps  # the steps after the checkpoint, once each


@pytest.mark.ray
@pytest.mark.slow
def test_password_is_shown_and_stored_nowhere(resumed_trial, work, mlflow_server, auth_proxy):
    out = resumed_trial
    assert out.returncode == 0, out.shown
    assert PASSWORD not in out.stdout + out.stderr, out.shown
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_server.uri)
    run = client.search_runs([client.get_experiment_by_name("driver_paths").experiment_id])[0]
    # the URI without its credentials (a per-run key: a tag, names.PER_RUN_KEYS)
    assert run.data.tags[names.config_tag("tracking.uri")] == auth_proxy.uri()
    stored = {**run.data.params, **run.data.tags}
    assert not [k for k, v in stored.items() if PASSWORD in v], stored
    artifacts = Path(client.download_artifacts(run.info.run_id, "", dst_path=str(work / "artifacts")))
    leaked = [str(p) for p in artifacts.rglob("*") if p.is_file() and PASSWORD.encode() in p.read_bytes()]
    assert not leaked, leaked
    assert (artifacts / names.ARTIFACT_CONFIG).is_file()
    # every file the command wrote in its folder: Hydra's .hydra/ of the run, the trial's output
    # folder (checkpoints, trial.json, Ray's storage), and nothing else holds the password
    written = [p for p in work.rglob("*") if p.is_file() and "artifacts" not in p.parts]
    assert any(p.parts[-2] == ".hydra" for p in written), written
    leaked = [str(p) for p in written if PASSWORD.encode() in p.read_bytes()]
    assert not leaked, leaked

