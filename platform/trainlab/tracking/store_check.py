"""Before any worker starts: can this process write to the MLflow store the trial reports to?

Every wait is bounded (CHECK_TIMEOUT_S, named in the message) and every message masks
credentials (trainlab.redact). A server is asked the way MLflow's client asks it: through
MLflow's own HTTP layer, with the credentials MLflow reads (the URI's, moved to
MLFLOW_TRACKING_USERNAME / _PASSWORD by tracking.store_uri, a token, ~/.mlflow/credentials).
"""

from __future__ import annotations

import socket
import tempfile
from urllib.parse import urlsplit

from trainlab.redact import redact
from trainlab.tracking.store_uri import DATABASE_PORTS, SERVER_SCHEMES

CHECK_TIMEOUT_S = 5.0
"""How long the check waits for a tracking server or database to answer."""
_PROBE = "/api/2.0/mlflow/experiments/get-by-name"
"""An API call that needs the same rights as logging (a bare /health may be open to anyone)."""


def check_tracking_uri(uri: str, *, setting: str = "tracking.uri", timeout_s: float = CHECK_TIMEOUT_S) -> None:
    """ValueError naming `setting`, the URI (masked) and the fix if the store cannot be used."""
    from trainlab.tracking.runs import local_store_path

    where = f"{setting}={redact(uri)!r}"
    scheme = urlsplit(uri).scheme.split("+")[0].lower()
    path = local_store_path(uri)
    if path is not None:
        _check_writable(path, sqlite=scheme == "sqlite", where=where)
    elif scheme in SERVER_SCHEMES:
        _check_server(uri, where=where, timeout_s=timeout_s)
    elif scheme in DATABASE_PORTS:
        _check_database(uri, scheme=scheme, where=where, timeout_s=timeout_s)


def _check_writable(path, *, sqlite: bool, where: str) -> None:
    folder = path.parent if sqlite else path
    try:  # create it as MLflow would, then prove a file can be written there
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".trainlab-probe"):
            pass
        if path.exists() and sqlite:
            with path.open("r+b"):
                pass
    except OSError as e:
        raise ValueError(
            f"{where} cannot be written ({e.strerror or e}: {e.filename or folder}); "
            "choose a location you can write (e.g. tracking.uri=sqlite:///mlflow.db) or tracking=none"
        ) from None


def _check_server(uri: str, *, where: str, timeout_s: float) -> None:
    from mlflow.exceptions import MlflowException
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request

    try:
        response = http_request(get_default_host_creds(uri), _PROBE, "GET", max_retries=0, backoff_factor=0,
                                timeout=timeout_s, raise_on_status=False,
                                params={"experiment_name": "trainlab-preflight"})
    except MlflowException as e:
        raise ValueError(
            f"{where}: the MLflow server does not answer within {timeout_s:g} s ({_reason(e)}); start it "
            "with `mlflow server --host 127.0.0.1 --port 5000` or fix the URI") from None
    if response.status_code in (401, 403):
        raise ValueError(
            f"{where}: the MLflow server refused the credentials (HTTP {response.status_code}); give them "
            "as MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or http://USER:PASSWORD@HOST:PORT "
            "in the URI)")
    if response.status_code == 200 or _mlflow_error(response) == "RESOURCE_DOES_NOT_EXIST":
        return
    raise ValueError(
        f"{where}: the server answered HTTP {response.status_code} to an MLflow API call; is it an MLflow "
        "tracking server (`mlflow server`)? Fix the URI or use tracking.uri=sqlite:///mlflow.db")


def _check_database(uri: str, *, scheme: str, where: str, timeout_s: float) -> None:
    """A database store: its host answers (bounded), and the Python driver SQLAlchemy will use
    for it is installed (MLflow would fail on the first call otherwise)."""
    parts = urlsplit(uri)
    if parts.hostname:  # no host: a local socket, nothing to wait for
        port = parts.port or DATABASE_PORTS[scheme]
        try:
            with socket.create_connection((parts.hostname, port), timeout=timeout_s):
                pass
        except OSError as e:
            raise ValueError(
                f"{where}: nothing answers at {parts.hostname}:{port} within {timeout_s:g} s "
                f"({e.strerror or e}); start the database, fix the URI, or report to an mlflow server "
                "(tracking.uri=http://HOST:PORT) or a file (tracking.uri=sqlite:///mlflow.db)") from None
    try:
        from sqlalchemy import make_url

        make_url(uri).get_dialect().import_dbapi()
    except ImportError as e:
        raise ValueError(
            f"{where} needs the Python module {e.name or e} (the {scheme} driver SQLAlchemy uses), which "
            f"is not installed; install it (pip install {e.name or 'the driver'}) or name another "
            f"driver ({scheme}+DRIVER://...)") from None
    except Exception as e:  # noqa: BLE001 - SQLAlchemy refuses the URI itself (an unknown driver)
        raise ValueError(f"{where}: SQLAlchemy cannot use it ({redact(str(e)).splitlines()[0]})") from None


def _mlflow_error(response) -> str | None:
    try:
        return response.json().get("error_code")
    except ValueError:
        return None


def _reason(e: BaseException) -> str:
    """The innermost OS-level reason ('Connection refused', 'timed out') behind MLflow's wrapped
    requests error, else its first line."""
    seen, cause = set(), e
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror
        cause = cause.__cause__ or cause.__context__
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    for marker in ("Connection refused", "timed out", "Name or service not known", "No route to host"):
        if marker in text:
            return marker
    return redact(text)[:200]
