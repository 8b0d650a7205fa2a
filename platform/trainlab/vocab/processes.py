"""Whether a process is gone, decided once: 'HOST PID START' names a process across its end.

    me = process_id()          # 'HOST PID START' of this process, recorded where it holds something
    process_gone(me)           # False while it runs; True once it ended or its pid was reused

A trial's checkpoint lease (launch.lease) and an MLflow run (tag trainlab.driver) record their
holder this way; the next start takes over what a gone holder left (a SIGKILLed driver ran no
handler). The start time tells a live process from a later one that reuses a dead one's pid. A
process on another host is never called gone (nothing here can tell): a lease there waits for
its heartbeat to age instead.
"""

from __future__ import annotations

import os
import socket


def host_name() -> str:
    return socket.gethostname()


def process_id(pid: int | None = None) -> str:
    """'HOST PID START' of a running process (this one by default; START: its start time, whole
    seconds since the epoch)."""
    import psutil

    pid = pid or os.getpid()
    return f"{host_name()} {pid} {int(psutil.Process(pid).create_time())}"


def process_gone(process: str) -> bool:
    """Whether the process named by process_id() has ended: on this host, its pid runs no more
    (or only as a zombie) or runs another process (another start time). 'HOST PID' without a
    start time (a record older than START) is judged by its pid alone. False for another host's
    process and for anything not of this form: unknown is never gone."""
    import psutil

    parts = process.split(" ")  # HOST PID [START]
    if len(parts) not in (2, 3) or parts[0] != host_name() or not all(p.isdigit() for p in parts[1:]):
        return False
    pid, start = int(parts[1]), parts[2:]
    try:
        proc = psutil.Process(pid)
        if start and int(proc.create_time()) != int(start[0]):
            return True  # the pid was reused
        return proc.status() == psutil.STATUS_ZOMBIE  # ended, not yet reaped by its parent
    except psutil.NoSuchProcess:  # ZombieProcess too: a zombie has ended
        return True
    except psutil.AccessDenied:  # another user's process, hidden: it runs
        return False
