"""One owner per trial: the driver that trains a trial holds a lease on its checkpoint folder.

Two drivers resuming one trial at once would both log into its MLflow run (every step twice)
and delete each other's checkpoints (retention), so the trial's lifecycle (launch.lifecycle)
takes the lease before it writes anything of the trial, and gives it back on every way out:

    held = acquire(root)      # LeaseHeld (a ConfigError: one line naming the holder) if another has it
    ...                       # a thread renews its heartbeat every HEARTBEAT_S
    held.release()            # the file is gone (only if it is still this holder's)

The lease is one file, ``<checkpoint folder>/lease.json``: holder id, host, pid, the holder's
process ('HOST PID START': vocab.processes), when it was taken, its last heartbeat. It is decided
under an exclusive flock on the folder itself (one decision at a time, so a takeover is atomic)
and written whole (a temporary file renamed over it). A lease is stale, and taken over, when
its holder's process is gone (on this host: its pid ended or was reused; a lease written before
the process field by its host and pid alone), or, for a holder on another host (whose process
nothing here can see), when its heartbeat is older than STALE_AFTER_S. A live holder on this
host keeps its lease however old its heartbeat.
A sweep's trials each hold their own (each has its own folder).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from trainlab.config import ConfigError
from trainlab.vocab.files import InputFileError, read_text
from trainlab.vocab.processes import host_name, process_gone, process_id

LEASE_FILE = "lease.json"
HEARTBEAT_S = 10.0
"""How often the holder renews its heartbeat."""
LEASE_MAX_BYTES = 64 * 1024
"""A lease record is a few hundred bytes: a bigger file there is no lease."""
STALE_AFTER_S = 120.0
"""A heartbeat older than this is a dead holder's (many missed beats: not a busy machine)."""


class LeaseHeld(ConfigError):
    """Another driver trains this trial now (its checkpoint folder's lease is held)."""


@dataclass
class Lease:
    """A held lease; release() on every way out (launch.lifecycle does, in a finally)."""

    root: Path
    holder: str
    record: dict
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    lost: bool = False
    """Another driver took the lease over: a driver on another host, after this one's heartbeat
    stalled past STALE_AFTER_S (the lease on a shared folder; one on this host never takes a
    live holder's)."""

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError), _locked(self.root):
                if _read(self.root).get("holder") != self.holder:
                    self.lost = True
                    print(f"warning: the lease on {self.root} was taken over by a driver on another host "
                          f"(this one's heartbeat stalled past {STALE_AFTER_S:.0f} s); stop this command: two "
                          "drivers now train the trial", file=sys.stderr, flush=True)
                    return
                _write(self.root, {**self.record, "heartbeat": time.time()})

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with contextlib.suppress(OSError), _locked(self.root):
            if _read(self.root).get("holder") == self.holder:  # a takeover's lease is not ours to end
                (self.root / LEASE_FILE).unlink()


def acquire(root: Path) -> Lease:
    """Take the lease on `root` (created if absent) for this process, or LeaseHeld naming the
    live holder. A stale lease (module docstring) is taken over."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    holder = f"{host_name()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    now = time.time()
    record = {"holder": holder, "host": host_name(), "pid": os.getpid(), "process": process_id(), "started": now,
              "heartbeat": now}
    with _locked(root):
        _refuse_if_held(root)
        _write(root, record)
    held = Lease(root=root, holder=holder, record=record)
    held._thread = threading.Thread(target=held._beat, name="trainlab-lease", daemon=True)
    held._thread.start()
    return held


def check_free(root: Path) -> None:
    """LeaseHeld if a live driver holds `root`'s lease now: the planner's early look, before
    Ray starts (acquire decides, atomically, when the trial starts)."""
    if (Path(root) / LEASE_FILE).exists():
        _refuse_if_held(Path(root))


def _refuse_if_held(root: Path) -> None:
    path = root / LEASE_FILE
    try:
        mtime = path.lstat().st_mtime
        text = read_text(path, field=LEASE_FILE, max_bytes=LEASE_MAX_BYTES,
                         fix="it is no lease trainlab wrote: move it out of the checkpoint folder")
    except FileNotFoundError:
        return
    except InputFileError as e:  # a FIFO, a device or a huge file where the lease belongs
        if e.what == "does not exist":  # released between the two looks
            return
        raise LeaseHeld(str(e)) from None
    try:
        record = json.loads(text)
        host, pid, beat = str(record["host"]), int(record["pid"]), float(record["heartbeat"])
        started = float(record.get("started", beat))
        holder = str(record.get("process") or f"{host} {pid}")  # an older lease: its host and pid
    except (ValueError, KeyError, TypeError):
        if time.time() - mtime > STALE_AFTER_S:
            return  # unreadable and untouched for long: no holder renews it
        raise LeaseHeld(f"train.checkpoint_dir={root} has an unreadable {LEASE_FILE} written "
                        f"{time.time() - mtime:.0f} s ago (another driver may be taking it); retry in "
                        f"{STALE_AFTER_S:.0f} s, or give this run its own train.checkpoint_dir") from None
    # here, whether the holder runs is known: only its end frees the lease (a holder stopped
    # with SIGSTOP or a suspended machine would wake to a trial with two drivers); elsewhere
    # nothing tells, and a heartbeat silent for STALE_AFTER_S is taken for its end
    if process_gone(holder) or (host != host_name() and time.time() - beat > STALE_AFTER_S):
        return
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started))
    raise LeaseHeld(f"train.checkpoint_dir={root} is in use: another driver trains this trial (host {host}, "
                    f"pid {pid}, since {since}, heartbeat {max(0.0, time.time() - beat):.0f} s ago); one "
                    "trial has one driver: wait for it to end or stop it, then run the same command again, "
                    "or give this run its own train.checkpoint_dir")


def _read(root: Path) -> dict:
    try:
        found = json.loads(read_text(root / LEASE_FILE, field=LEASE_FILE, fix="", max_bytes=LEASE_MAX_BYTES))
    except (OSError, ValueError):  # InputFileError is a ValueError
        return {}
    return found if isinstance(found, dict) else {}


def _write(root: Path, record: dict) -> None:
    """The whole record at once: written beside, then renamed over (a reader never sees half)."""
    tmp = root / f".{LEASE_FILE}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps(record))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / LEASE_FILE)


@contextlib.contextmanager
def _locked(root: Path):
    """An exclusive flock on the folder itself: one lease decision at a time (no extra file)."""
    fd = os.open(root, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):  # a file system without locks: the whole-file writes remain
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock
