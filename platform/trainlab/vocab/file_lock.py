"""One process at a time across the machine: an exclusive flock on a lock file beside what it guards.

    with held(folder.with_name(folder.name + ".lock")):   # a second process waits here
        ...make the thing once...

With `remove=True` the lock file is gone again when the block ends, so a lock leaves nothing
behind. That is safe with any number of waiters: the holder unlinks the file before it lets go,
and a process that wins the flock checks that the file it locked is still the one at the path
(same inode); if the holder unlinked it meanwhile, it opens the path again and waits there.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from pathlib import Path


def _open_lock(lock: Path | str) -> int:
    # O_NONBLOCK: a FIFO someone put at the path is refused below instead of blocking the open
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{lock} is not a regular file, so it cannot be a lock file")
    return fd


def _is_at_path(fd: int, lock: Path | str) -> bool:
    try:
        st = os.stat(lock)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


@contextlib.contextmanager
def held(lock: Path | str, *, remove: bool = False):
    """Hold an exclusive lock on the file `lock` (created if missing) for the block; with `remove`,
    the file is unlinked when the block ends (see the module's docstring for why that is safe).
    OSError where the file cannot be made (a read-only folder) or is no regular file."""
    while True:
        fd = _open_lock(lock)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        if not remove or _is_at_path(fd, lock):
            break
        os.close(fd)  # the previous holder removed this file while we waited: lock the new one
    try:
        yield
    finally:
        if remove:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock)  # while still held: a waiter then sees another inode and retries
        os.close(fd)  # releases the flock


__all__ = ["held"]
