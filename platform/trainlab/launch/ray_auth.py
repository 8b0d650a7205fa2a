"""Ray token authentication, on by default on Ray 2.5x heads started with `ray start --head`.

A client (driver, job submitter) sends its token only with RAY_AUTH_MODE=token, and Ray reads
that once, when it loads: setting it after `import ray` does nothing. The `trainlab` command
calls `token_mode()` first thing, so `trainlab train cluster=ray cluster.address=HEAD:6379`
and `trainlab submit` reach such a cluster without the user exporting it.
"""

from __future__ import annotations

import os


def token_mode() -> bool:
    """Set RAY_AUTH_MODE=token when this machine has a token (RAY_AUTH_TOKEN,
    RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) and the user chose no mode; True if set."""
    token_file = os.environ.get("RAY_AUTH_TOKEN_PATH", os.path.expanduser("~/.ray/auth_token"))
    if "RAY_AUTH_MODE" in os.environ or not (os.environ.get("RAY_AUTH_TOKEN") or os.path.exists(token_file)):
        return False
    os.environ["RAY_AUTH_MODE"] = "token"
    return True
