"""Is the MLflow store there, checked before MLflow's client touches it, within a stated bound.

Before any worker starts (check_tracking_uri): can this process write to the store the trial
reports to? A server is asked the way MLflow's client asks it: through MLflow's own HTTP layer,
with the credentials MLflow reads (the URI's, moved to MLFLOW_TRACKING_USERNAME / _PASSWORD by
tracking.store, a token, ~/.mlflow/credentials). Before a store is read (check_store, for
`trainlab compare`): MLflow's HTTP client retries a server that does not answer for minutes
(7 retries with backoff, 120 s a request), and SQLAlchemy meets a damaged sqlite file with a
page of traceback. Every message names the store (credentials masked, trainlab.redact) and the
fix; a sqlite file is opened read-only, so a damaged store is left exactly as it was.
"""

from __future__ import annotations

import errno
import os
import shlex
import socket
import sqlite3
import tempfile
from pathlib import Path
from urllib.parse import quote, urlparse, urlsplit

from trainlab.redact import redact
from trainlab.tracking.store import CHECK_TIMEOUT_S, DATABASE_PORTS, TrackingStore
from trainlab.vocab.files import InputFileError, check_file

_PROBE = "/api/2.0/mlflow/experiments/get-by-name"
"""An API call that needs the same rights as logging (a bare /health may be open to anyone)."""


def check_tracking_uri(uri: str, *, setting: str = "tracking.uri", timeout_s: float = CHECK_TIMEOUT_S) -> None:
    """ValueError naming `setting`, the URI (masked) and the fix if the store cannot be used."""
    where = f"{setting}={redact(uri)!r}"
    store = TrackingStore.of(uri)
    if store.local_path is not None:
        _check_writable(store.local_path, sqlite=store.kind == "sqlite", where=where)
    if store.kind == "file":  # where it could be made: then whether MLflow will write it
        _check_file_store_allowed(store.local_path, where=where)
    elif store.kind == "server":
        _check_server(uri, where=where, timeout_s=timeout_s)
    elif store.kind == "database":
        _check_database(uri, scheme=store.scheme.lower(), where=where, timeout_s=timeout_s)


def _check_file_store_allowed(path: Path, *, where: str) -> None:
    """MLflow 3 refuses a folder (file) store unless MLFLOW_ALLOW_FILE_STORE is set: said here,
    with a sqlite store beside the folder (a new file, nothing overwritten) as the fix."""
    from mlflow.environment_variables import MLFLOW_ALLOW_FILE_STORE

    if MLFLOW_ALLOW_FILE_STORE.get():
        return
    db = f"sqlite:///{path.with_name(path.name + '.db')}"
    migrate = (f" (`mlflow migrate-filestore --source {shlex.quote(str(path))} --target {shlex.quote(db)}` "
               "moves the runs it holds)" if path.is_dir() and any(path.iterdir()) else "")
    raise ValueError(f"{where} is a folder (MLflow's file store), which MLflow 3 no longer writes; use "
                     f"tracking.uri={db}{migrate}, or set MLFLOW_ALLOW_FILE_STORE=true to keep the file store")


def _check_writable(path, *, sqlite: bool, where: str) -> None:
    folder = path.parent if sqlite else path
    try:  # create it as MLflow would, then prove a file can be written there
        if folder.exists() and not folder.is_dir():  # mkdir would say 'File exists', which hides why
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(folder))
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".trainlab-probe"):
            pass
        if path.exists() and sqlite:
            _regular_store(path, where=where, fix="choose a location you can write "
                           "(e.g. tracking.uri=sqlite:///mlflow.db) or tracking=none")
            with path.open("r+b"):
                pass
    except OSError as e:
        raise ValueError(
            f"{where} cannot be written ({e.strerror or e}: {e.filename or folder}); "
            "choose a location you can write (e.g. tracking.uri=sqlite:///mlflow.db) or tracking=none"
        ) from None


def _regular_store(path: Path, *, where: str, fix: str) -> None:
    """A sqlite store file is a regular file: sqlite would wait on a FIFO there forever."""
    try:
        check_file(path, field="store", max_bytes=None, fix=fix)
    except InputFileError as e:
        raise ValueError(f"{where}: {path} {e.what}; {fix}") from None


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


BOUNDED_HTTP = {
    # once the server answered /health: a later request that fails is retried twice, each
    # within 30 s, instead of MLflow's 7 retries of up to 120 s each
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}
"""Set (unless already set) by commands that only read a store, such as `trainlab compare`."""

QUICK_CHECK_MAX_BYTES = 1 << 30
"""Stores up to this size get sqlite's quick_check (every page read: 0.4 s for 155 MB on a
2-core CI machine), so damage past the schema is found before MLflow meets it; bigger ones
get the schema check only."""

MLFLOW_TABLES = ("experiments", "runs")
"""Tables every MLflow SQL store has: a database without them is some other file."""


def check_server_answers(uri: str, *, field: str, fix: str, timeout_s: float = CHECK_TIMEOUT_S) -> None:
    """An http(s) tracking server answers (TrackingStore.probe) within timeout_s; ValueError
    naming `field`, the URI (masked), why not and `fix` otherwise."""
    why = TrackingStore.of(uri).probe(timeout_s=timeout_s)
    if why is not None:
        raise ValueError(f"{field}={redact(uri)!r}: the MLflow server does not answer ({why}); {fix}")


def check_sqlite_store(path: Path, *, field: str, uri: str, elsewhere: str) -> None:
    """A sqlite store that exists is a database MLflow can read: its pages intact (quick_check,
    up to QUICK_CHECK_MAX_BYTES) and MLflow's tables in it. An absent or empty file is left to the
    caller (MLflow creates the store)."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    restore = f"restore it from a backup (`sqlite3 {path} .recover` salvages what it can) or {elsewhere}"
    try:
        con = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, timeout=CHECK_TIMEOUT_S)
    except sqlite3.Error as e:
        raise ValueError(f"{field}={uri!r}: cannot open {path} ({e}); {elsewhere}") from None
    try:
        tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        damage = "ok"
        if path.stat().st_size <= QUICK_CHECK_MAX_BYTES:
            damage = con.execute("PRAGMA quick_check(1)").fetchone()[0]
    except sqlite3.OperationalError as e:
        if "locked" in str(e):  # a writer holds it now: busy, not damaged
            return
        raise ValueError(f"{field}={uri!r}: {path} cannot be read ({e}); {restore}") from None
    except sqlite3.DatabaseError as e:
        raise ValueError(f"{field}={uri!r}: {path} is not a readable SQLite database ({e}); {restore}") from None
    finally:
        con.close()
    if damage != "ok":
        raise ValueError(f"{field}={uri!r}: {path} is damaged ({' '.join(damage.split())}); {restore}")
    missing = [t for t in MLFLOW_TABLES if t not in tables]
    if tables and missing:
        raise ValueError(f"{field}={uri!r}: {path} is a SQLite database but not an MLflow store "
                         f"(no {' or '.join(missing)} table); {elsewhere}")


def check_store(uri: str, *, field: str, elsewhere: str) -> None:
    """The checks above for whatever kind of store `uri` names (others pass), for a command that
    only reads it: a local store (sqlite file, file-store folder) must exist. `field` says where
    the URI came from (tracking.uri, --tracking-uri, MLFLOW_TRACKING_URI); `elsewhere` how to
    point at another store ("pass --tracking-uri URI")."""
    parsed, store = urlparse(uri), TrackingStore.of(uri)
    local = store.local_path
    if local is not None and not local.exists():  # MLflow would create an empty store at a typo
        raise ValueError(f"{field}={redact(uri)!r}: no MLflow store at {local} (reading it would "
                         f"create an empty one there); {elsewhere}")
    if local is not None and store.kind == "sqlite":
        _regular_store(local, where=f"{field}={redact(uri)!r}", fix=elsewhere)
    if store.kind == "server":
        try:
            port = parsed.port or (443 if parsed.scheme == "https" else 80)
        except ValueError:  # 'http://host:99999', 'http://host:abc'
            raise ValueError(f"{field}={redact(uri)!r} has no valid port (1-65535); "
                             f"fix the URI or {elsewhere}") from None
        check_server_answers(uri, field=field, fix=f"start it (`mlflow server --host 127.0.0.1 --port {port}`) "
                                                   f"or {elsewhere}")
    else:
        check_sqlite_uri(uri, field=field, elsewhere=elsewhere)


def check_sqlite_uri(uri: str, *, field: str, elsewhere: str) -> None:
    """check_sqlite_store for a sqlite:/// URI (other URIs pass)."""
    store = TrackingStore.of(uri)
    if store.kind == "sqlite":
        check_sqlite_store(store.local_path, field=field, uri=uri, elsewhere=elsewhere)


def check_experiment(uri: str, name: str, *, field: str = "tracking.experiment") -> None:
    """ValueError if experiment `name` was deleted in the store (MLflow keeps a soft-deleted
    experiment's name: it would neither log to it nor make a new one), naming both safe fixes:
    restore it, or another name that is free. A store not yet made holds no experiment; a sqlite
    store is read directly, read-only (MLflow's client costs seconds to start, a refusal must not)."""
    from itertools import count

    store = TrackingStore.of(uri)
    if store.local_path is not None and not store.local_path.exists():
        return
    stage = _sqlite_stages(store.local_path) if store.kind == "sqlite" else _mlflow_stages(uri)
    if stage is None:
        return  # the store's own errors are check_tracking_uri's and the tracker's to report
    found = stage(name)
    if found is None or found[1] != "deleted":
        return
    free = next(f"{name}_{i}" for i in count(2) if stage(f"{name}_{i}") is None)
    shown = redact(uri)
    raise ValueError(
        f"{field}={name!r} was deleted in the store {shown} (experiment id {found[0]}; MLflow keeps "
        f"a deleted experiment's name until it is purged); restore it with `MLFLOW_TRACKING_URI={shlex.quote(shown)} "
        f"mlflow experiments restore --experiment-id {found[0]}`, or use another name: {field}={free}")


def _sqlite_stages(path: Path):
    """name -> (experiment id, lifecycle stage) or None, read once from MLflow's experiments table."""
    try:
        con = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, timeout=CHECK_TIMEOUT_S)
        try:
            rows = con.execute("SELECT name, experiment_id, lifecycle_stage FROM experiments").fetchall()
        finally:
            con.close()
    except sqlite3.Error:
        return None  # empty, busy or not MLflow's yet: nothing deleted to find
    return {name: (str(i), stage) for name, i, stage in rows}.get


def _mlflow_stages(uri: str):
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)

    def stage(name: str):
        try:
            exp = client.get_experiment_by_name(name)
        except MlflowException:
            return None
        return None if exp is None else (exp.experiment_id, exp.lifecycle_stage)
    return stage
