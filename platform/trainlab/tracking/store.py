"""The MLflow store a trial reports to: its URI decided once on the driver from what the user
wrote, and what kind of store it is, where it lives and whether it answers, for every caller.

    store = use_tracking_store(run.tracking.uri)   # decided: checked, absolute, no secret in it
    store = TrackingStore.of(uri)                  # a URI decided before (a record's, a command's)
    store.kind, store.local_path                   # 'sqlite', Path('/abs/mlflow.db')
    store.probe(timeout_s=5)                       # None: it answers (a local store always does)

tracking.uri wins over $MLFLOW_TRACKING_URI, which wins over MLflow's default
(sqlite:///mlflow.db in the working directory). The chosen URI is checked for the forms MLflow
would read differently than meant, made absolute where it names a local file (Ray workers run
in another directory), and an http(s) URI's user name and password are taken out of it and
handed to MLflow's client as MLflow reads them (MLFLOW_TRACKING_USERNAME / _PASSWORD), so the
URI that is logged, printed, recorded beside checkpoints and passed to other processes holds
no secret (trainlab.redact masks what is left, e.g. a database URI's password).
"""

from __future__ import annotations

import os
import shlex
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Iterator, Mapping
from urllib.parse import urlparse, urlsplit, urlunparse

from trainlab.redact import redact, register_secret, split_userinfo
from trainlab.vocab.file_lock import held

MLFLOW_DEFAULT_URI = "sqlite:///mlflow.db"  # MLflow 3's own default store, relative to the cwd
ENV_URI = "MLFLOW_TRACKING_URI"
ENV_USERNAME, ENV_PASSWORD, ENV_TOKEN = "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"
SERVER_SCHEMES = ("http", "https")
DATABASE_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}
"""Database stores MLflow's client writes to directly (SQLAlchemy), with their default ports."""
OTHER_SCHEMES = ("databricks", "databricks-uc", "uc")
"""Stores of MLflow's own registry that trainlab passes through unchecked."""
CHECK_TIMEOUT_S = 5.0
"""How long a check waits for a tracking server or database to answer."""
_FIXES = ("use http://HOST:PORT for an mlflow server, sqlite:///mlflow.db for a file in the working "
          "directory, or a folder path for a file store")


@dataclass(frozen=True)
class TrackingStore:
    """One MLflow store: how to reach it, what kind it is, where it lives, whether it answers."""

    uri: str
    """The URI to hand MLflow: absolute for a local store, without user name and password for a server."""
    source: str
    """Where it was given: 'tracking.uri', 'MLFLOW_TRACKING_URI' or 'default'; names it in messages."""
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    @classmethod
    def of(cls, uri: str) -> TrackingStore:
        """The store of a URI decided before (tracking_store's, a record's, a command's), as it is:
        no forms refused, nothing made absolute."""
        return cls(uri=uri, source="")

    @property
    def scheme(self) -> str:
        return urlsplit(self.uri).scheme.split("+")[0]

    @property
    def kind(self) -> str:
        """'sqlite' (a file), 'file' (a file store's folder), 'server' (http(s): an mlflow server),
        'database' (a database MLflow writes to directly) or 'other' (MLflow's own registries,
        plugins; a plain path too, which tracking_store makes a file: URI)."""
        scheme = self.scheme.lower()
        if scheme == "sqlite":
            return "sqlite"
        if scheme == "file":
            return "file"
        if scheme in SERVER_SCHEMES:
            return "server"
        return "database" if scheme in DATABASE_PORTS else "other"

    @property
    def local_path(self) -> Path | None:
        """The file a sqlite store lives in, or the folder of a file store; None for the others."""
        if self.kind == "sqlite":
            return Path(self.uri[len("sqlite:///"):])
        if self.kind == "file":
            return Path(urlparse(self.uri).path)
        return None

    def probe(self, *, timeout_s: float = CHECK_TIMEOUT_S) -> str | None:
        """Does the store answer? A server: GET /health within timeout_s, any HTTP answer counting
        (a server behind authentication answers 401 to a request without credentials); None if it
        answers, else why not ('no answer within 5 s', 'Connection refused'). Other stores: None
        (a local one is always there; preflight checks whether it can be written)."""
        if self.kind != "server":
            return None
        parsed = urlparse(self.uri)
        netloc = (parsed.hostname or "") + (f":{parsed.port}" if parsed.port else "")
        url = urlunparse(parsed._replace(netloc=netloc)).rstrip("/") + "/health"
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as r:
                r.read()
        except urllib.error.HTTPError:
            return None
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            return f"no answer within {timeout_s:g} s" if isinstance(reason, TimeoutError) else str(reason)
        return None


def tracking_field(configured: str, environ: Mapping[str, str] | None = None) -> str:
    """The setting a message names for the store: MLFLOW_TRACKING_URI when it chose it (no
    tracking.uri given), else tracking.uri (the one to set, for MLflow's default too)."""
    environ = os.environ if environ is None else environ
    return ENV_URI if not configured and environ.get(ENV_URI) else "tracking.uri"


def tracking_store(configured: str, *, environ: Mapping[str, str] | None = None,
                   cwd: str | None = None) -> TrackingStore:
    """The store `configured` (tracking.uri; "" = the environment's or MLflow's default) names.

    Raises ValueError naming the setting, its value (credentials masked) and the fix for a URI
    MLflow cannot use or would read differently than meant."""
    environ = os.environ if environ is None else environ
    source = tracking_field(configured, environ) if configured or environ.get(ENV_URI) else "default"
    uri = configured or environ.get(ENV_URI, "") or MLFLOW_DEFAULT_URI
    where = f"{source}={redact(uri)!r}" if source != "default" else f"the default store {uri!r}"
    fix_env = f"; or unset {ENV_URI} / give tracking.uri=..." if source == ENV_URI else ""
    if not uri.strip():  # MLflow would read it as a folder named by the blanks, in the working directory
        raise ValueError(f"{where} is blank; unset {ENV_URI} (MLflow's default store, {MLFLOW_DEFAULT_URI} in the "
                         f"working directory) or give a store: {_FIXES}" if source == ENV_URI else
                         f"{where} is blank; leave tracking.uri empty for the default store or give one: {_FIXES}")
    cwd = cwd or os.getcwd()
    try:
        parts = urlsplit(uri)
    except ValueError as e:  # e.g. an unbalanced '[' in the host
        raise ValueError(f"{where} is not a URI ({e}); {_FIXES}{fix_env}") from None
    scheme = parts.scheme.lower()
    if uri in OTHER_SCHEMES:  # MLflow's names of a workspace's own store ("databricks")
        return TrackingStore(uri=uri, source=source)
    if scheme == "sqlite":
        return TrackingStore(uri=_sqlite(uri, parts, where=where, fix_env=fix_env, cwd=cwd), source=source)
    if scheme == "file":
        return TrackingStore(uri=_file(parts, where=where, fix_env=fix_env, cwd=cwd), source=source)
    if scheme == "":  # a plain path: MLflow's file store
        return TrackingStore(uri=_absolute_uri(uri, cwd), source=source)
    if scheme in SERVER_SCHEMES:
        if not parts.hostname:
            raise ValueError(f"{where} names no host; write {scheme}://HOST:PORT (e.g. {scheme}://127.0.0.1:5000)"
                             f"{fix_env}")
        _check_port(parts, where=where, fix_env=fix_env)
        clean, user, password = split_userinfo(uri)
        if user and password:  # MLflow's client sends these as HTTP basic auth, as requests does the URI's
            return TrackingStore(uri=clean, source=source, username=user, password=password)
        return TrackingStore(uri=uri, source=source)
    base = scheme.split("+")[0]
    if base in DATABASE_PORTS:
        if not parts.path.strip("/"):
            raise ValueError(f"{where} names no database; write {base}://USER:PASSWORD@HOST:PORT/DATABASE{fix_env}")
        _check_port(parts, where=where, fix_env=fix_env)
        return TrackingStore(uri=uri, source=source)
    if scheme in OTHER_SCHEMES or scheme in _plugin_schemes():
        return TrackingStore(uri=uri, source=source)
    raise ValueError(f"{where} is not a tracking URI MLflow knows (scheme {scheme!r}); {_FIXES}{fix_env}")


def use_tracking_store(configured: str, *, cwd: str | None = None) -> TrackingStore:
    """tracking_store(), its credentials handed to MLflow's client in this process (the environment
    variables MLflow reads) and registered for redaction. The one place they leave the URI."""
    store = tracking_store(configured, cwd=cwd)
    if store.password:
        os.environ[ENV_USERNAME] = store.username or ""
        os.environ[ENV_PASSWORD] = store.password
    for secret in (store.password, os.environ.get(ENV_PASSWORD), os.environ.get(ENV_TOKEN)):
        register_secret(secret)
    # a database URI keeps its password (SQLAlchemy reads it there): mask it wherever it shows
    register_secret(split_userinfo(store.uri)[2])
    return store


def credentials_env() -> dict[str, str]:
    """The MLflow credential variables set in this process: what a worker on another node needs
    to reach the same server (its environment is the raylet's, not this driver's)."""
    return {k: os.environ[k] for k in (ENV_USERNAME, ENV_PASSWORD, ENV_TOKEN) if os.environ.get(k)}


# -- forms -------------------------------------------------------------------------------------
def _absolute_uri(path: str, cwd: str) -> str:
    from pathlib import Path

    return Path(os.path.join(cwd, os.path.expanduser(path))).absolute().as_uri()


def _sqlite(uri: str, parts, *, where: str, fix_env: str, cwd: str) -> str:
    """sqlite:///relative.db or sqlite:////absolute.db (SQLAlchemy's forms), made absolute."""
    if not uri.lower().startswith("sqlite:///") or parts.netloc:
        name = (parts.netloc + parts.path) or "mlflow.db"
        raise ValueError(
            f"{where} has two slashes after 'sqlite:', which SQLAlchemy reads as "
            f"{'a host, not a file' if parts.netloc else 'an in-memory database that keeps nothing'}; "
            f"write sqlite:///{name} for a file relative to the working directory, or "
            f"sqlite:////{os.path.join(cwd, name).lstrip('/')} for an absolute path{fix_env}")
    db = uri[len("sqlite:///"):]
    if db in ("", ":memory:") or db.startswith(":memory:?"):
        raise ValueError(f"{where} is an in-memory database: nothing would be kept, and every process "
                         f"would see its own; write sqlite:///mlflow.db (a file){fix_env}")
    path, query = db.partition("?")[0], db.partition("?")[2]
    path = os.path.abspath(os.path.join(cwd, os.path.expanduser(path)))
    return "sqlite:///" + path + (f"?{query}" if query else "")


def _file(parts, *, where: str, fix_env: str, cwd: str) -> str:
    """file:///absolute, file:relative or file://localhost/absolute, made file:///absolute."""
    if parts.netloc and parts.netloc.lower() != "localhost":
        name = parts.netloc + parts.path
        raise ValueError(
            f"{where} puts {parts.netloc!r} where file: URIs have a host, not a folder; write "
            f"file:///{os.path.join(cwd, name).lstrip('/')} (absolute) or the plain path {name} "
            f"(relative to the working directory){fix_env}")
    return _absolute_uri(parts.path or ".", cwd)


def _check_port(parts, *, where: str, fix_env: str) -> None:
    try:
        _ = parts.port  # urlsplit checks the port only when asked
    except ValueError:
        raise ValueError(f"{where} has a port that is not a number from 0 to 65535; write "
                         f"{parts.scheme}://HOST:PORT{fix_env}") from None


def _plugin_schemes() -> set[str]:
    """Schemes MLflow tracking-store plugins installed here register (entry point group
    mlflow.tracking_store)."""
    return {e.name for e in entry_points(group="mlflow.tracking_store")}


def resolve_tracking_uri(configured: str) -> str:
    """Explicit tracking.uri > $MLFLOW_TRACKING_URI > sqlite:///mlflow.db in the cwd, as the
    URI every process is handed: local stores absolute (Ray workers run elsewhere), a server's
    credentials moved to MLflow's credential variables (tracking_store). ValueError for a
    URI MLflow would read differently than meant."""
    return use_tracking_store(configured).uri


@contextmanager
def creation_lock(uri: str) -> Iterator[None]:
    """Held while a sqlite store is first made: an exclusive flock on the sibling file
    `<store>.lock`, so two processes making the same new store at once (two sweeps started
    together) do not both run MLflow's migrations (alembic: 'Online migration expected to match
    one row'). Other stores: nothing to hold (a server or database makes its own)."""
    store = TrackingStore.of(uri)
    if store.kind != "sqlite" or store.local_path is None:
        yield
        return
    with held(store.local_path.with_name(store.local_path.name + ".lock")):
        yield


def ensure_store(uri: str) -> None:
    """A sqlite store made and migrated by MLflow, once, under creation_lock; the processes that
    come after (other sweeps, the workers) open a finished store. Other stores: nothing to do."""
    store = TrackingStore.of(uri)
    if store.kind != "sqlite":
        return
    with creation_lock(uri):
        from mlflow.tracking import MlflowClient

        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)  # makes and migrates the store


def ui_command(uri: str) -> str:
    """How to look at the runs: `mlflow ui` for a local store (on loopback, said explicitly:
    pass another --host to expose it), the server's URL otherwise. Quoted for a shell: a store
    path with a space or a quote in it stays one argument when the line is pasted."""
    if TrackingStore.of(uri).local_path is None:
        return f"open {redact(uri)} in a browser"
    return f"mlflow ui --backend-store-uri {shlex.quote(redact(uri))} --host 127.0.0.1"
