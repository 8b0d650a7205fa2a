"""Credentials never leave the process: one function masks them in anything trainlab shows or stores.

A tracking URI may carry a user name and password (`http://user:pw@host:5000`,
`postgresql://user:pw@db/mlflow`). trainlab takes HTTP credentials out of the URI once, on the
driver (trainlab.tracking.store), and hands them to MLflow's client the way MLflow reads
them (MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD); what it prints, logs to MLflow
(params, tags, the config snapshot) or writes beside the run (Hydra's .hydra/ files, trial
records) passes through `redact` first, which masks the password part of any URL in a text and
any secret registered here, wherever it appears.

Masking follows pip and SQLAlchemy: `user:***@host` keeps the user name, so a person sees which
account; a lone `token@host` (a token in the user-name position) becomes `***@host`.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit, urlunsplit

MASK = "***"
MIN_SECRET_LEN = 4
"""Registered secrets shorter than this are masked only inside URLs: replacing a 2-letter password
everywhere would mangle unrelated text, and in a URL it is masked anyway."""

# scheme://userinfo@ ; userinfo runs to the last '@' before a '/', whitespace, quote or bracket
# (a path, the end of a YAML or JSON value), as urlsplit reads an unencoded '@' in a password.
# Hydra writes a sweep's overrides with ':' escaped (`http\://user\:pw@host`): a backslash may
# stand before the colons
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*\\?://)(?P<userinfo>[^\s/'\"<>\[\]{}]+)@")
_secrets: set[str] = set()


def register_secret(value: str | None) -> None:
    """Mask `value` (and its URL-encoded and decoded forms) wherever `redact` sees it from now on."""
    if not value:
        return
    for form in {value, unquote(value)}:
        if len(form) >= MIN_SECRET_LEN:
            _secrets.add(form)


def _mask_userinfo(m: re.Match) -> str:
    user, colon, _ = m.group("userinfo").partition(":")
    return f"{m.group('scheme')}{user}:{MASK}@" if colon else f"{m.group('scheme')}{MASK}@"


def redact(text: str) -> str:
    """`text` with the password of every URL in it, and every registered secret, masked."""
    if not text:
        return text
    out = _USERINFO.sub(_mask_userinfo, str(text))
    for secret in sorted(_secrets, key=len, reverse=True):  # longest first: no half-masked secret
        out = out.replace(secret, MASK)
    return out


def split_userinfo(uri: str) -> tuple[str, str | None, str | None]:
    """(the URI without user name and password, user name, password), both decoded; None where the
    URI has none. `http://u:p%40ss@h:5000/x` -> ('http://h:5000/x', 'u', 'p@ss')."""
    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri, None, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, colon, password = userinfo.partition(":")
    clean = urlunsplit((parts.scheme, hostport, parts.path, parts.query, parts.fragment))
    return clean, unquote(user) or None, unquote(password) if colon else None


def redact_files(paths) -> None:
    """Rewrite each of `paths` (files; a folder: every file in it) that holds a credential, masked.

    For files other programs write where trainlab cannot hook their writing: Hydra saves the
    command line's overrides and the composed config (.hydra/, multirun.yaml) before trainlab runs."""
    from pathlib import Path

    for path in map(Path, paths):
        for f in sorted(path.iterdir()) if path.is_dir() else [path]:
            try:
                text = f.read_text()
            except (OSError, UnicodeDecodeError):
                continue
            masked = redact(text)
            if masked != text:
                f.write_text(masked)
