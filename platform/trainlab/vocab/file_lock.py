"""One process at a time across the machine: an exclusive flock on a lock file beside what it guards.

    with held(folder.with_name(folder.name + ".lock")):   # a second process waits here
        ...make the thing once...
"""

from __future__ import annotations

import contextlib
import fcntl
from pathlib import Path


@contextlib.contextmanager
def held(lock: Path | str):
    """Hold an exclusive lock on the file `lock` (created if missing, never removed) for the block."""
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


__all__ = ["held"]
