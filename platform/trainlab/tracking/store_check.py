"""Is an MLflow store there to be read, checked before MLflow's client touches it.

MLflow's HTTP client retries a server that does not answer for minutes (7 retries with
backoff, 120 s a request), and SQLAlchemy meets a damaged sqlite file with a page of
traceback. These checks answer within a stated bound, in one line that names the store and
the fix, and open a sqlite file read-only: a damaged store is left exactly as it was.
"""

from __future__ import annotations

import sqlite3
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote, urlparse, urlunparse

SERVER_TIMEOUT_S = 5.0
"""How long a tracking server has to answer /health."""

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


def without_password(uri: str) -> str:
    """The URI as it may be printed: a password in it replaced by ***."""
    parsed = urlparse(uri)
    if parsed.password is None:
        return uri
    host = parsed.hostname or ""
    netloc = f"{parsed.username}:***@{host}" + (f":{parsed.port}" if parsed.port else "")
    return urlunparse(parsed._replace(netloc=netloc))


def check_server_answers(uri: str, *, field: str, fix: str, timeout_s: float = SERVER_TIMEOUT_S) -> None:
    """An http(s) tracking server answers GET /health within timeout_s; any HTTP answer counts
    (a server behind authentication answers 401 to a request without credentials)."""
    parsed = urlparse(uri)
    netloc = (parsed.hostname or "") + (f":{parsed.port}" if parsed.port else "")
    url = urlunparse(parsed._replace(netloc=netloc)).rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            r.read()
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        why = f"no answer within {timeout_s:g} s" if isinstance(reason, TimeoutError) else str(reason)
        raise ValueError(f"{field}={without_password(uri)!r}: the MLflow server does not answer "
                         f"({why}); {fix}") from None


def check_sqlite_store(path: Path, *, field: str, uri: str, elsewhere: str) -> None:
    """A sqlite store that exists is a database MLflow can read: its pages intact (quick_check,
    up to QUICK_CHECK_MAX_BYTES) and MLflow's tables in it. An absent or empty file is left to the
    caller (MLflow creates the store)."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    restore = f"restore it from a backup (`sqlite3 {path} .recover` salvages what it can) or {elsewhere}"
    try:
        con = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, timeout=SERVER_TIMEOUT_S)
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
    """The checks above for whatever kind of store `uri` names (others pass). `field` says where
    the URI came from (tracking.uri, --tracking-uri, MLFLOW_TRACKING_URI); `elsewhere` how to
    point at another store ("pass --tracking-uri URI")."""
    parsed = urlparse(uri)
    if parsed.scheme in ("http", "https"):
        try:
            port = parsed.port or (443 if parsed.scheme == "https" else 80)
        except ValueError:  # 'http://host:99999', 'http://host:abc'
            raise ValueError(f"{field}={without_password(uri)!r} has no valid port (1-65535); "
                             f"fix the URI or {elsewhere}") from None
        check_server_answers(uri, field=field, fix=f"start it (`mlflow server --host 127.0.0.1 --port {port}`) "
                                                   f"or {elsewhere}")
    else:
        check_sqlite_uri(uri, field=field, elsewhere=elsewhere)


def check_sqlite_uri(uri: str, *, field: str, elsewhere: str) -> None:
    """check_sqlite_store for a sqlite:/// URI (other URIs pass)."""
    if urlparse(uri).scheme == "sqlite":
        check_sqlite_store(Path(uri[len("sqlite:///"):]), field=field, uri=uri, elsewhere=elsewhere)
