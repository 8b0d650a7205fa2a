"""One driver per study: a second `trainlab train -m` of the same sweep in the same store is refused.

A sweep's identity (tracking.sweep_runs.sweep_id: its name, experiment, first jobs and, for a
search, its sweeper) names one parent run in one store. Two drivers of it at once would both
attach to that parent, each train every trial and overwrite each other's answer; the trial
lease (launch.lease) does not see it, since each command has its own checkpoint folders. So the
driver that opens a study owns it, checked twice:

- on this machine, by an exclusive flock on a lock file of the study's own (in trainlab's cache
  folder, keyed by store and sweep id), taken before the parent run is looked up and held until
  the study closes: two commands started together are decided atomically, and a driver killed
  with SIGKILL holds nothing;
- across machines sharing a store, by the parent run: RUNNING with a driver (tag trainlab.driver)
  that still runs on this host, or that runs on another host and renewed its heartbeat (tag
  trainlab.heartbeat, every HEARTBEAT_S) within STALE_AFTER_S, owns it.

    owner = own_study(tracking_uri=uri, sid=sid, sweep_name=name)   # StudyHeld if another has it
    check_parent_free(client, parent)                                 # the same, for another host's driver
    owner.beat(tracking_uri=uri, run_id=parent_run_id)                # the heartbeat, until release()
    owner.release()
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from trainlab import names
from trainlab.config import ConfigError
from trainlab.redact import redact
from trainlab.vocab.processes import host_name, process_gone, process_id

HEARTBEAT_S = 30.0
"""How often a study's driver renews the parent run's heartbeat tag."""
STALE_AFTER_S = 120.0
"""A parent whose driver runs on another host is that driver's while its heartbeat is younger."""


class StudyHeld(ConfigError):
    """Another driver runs this study now."""


def lock_folder() -> Path:
    """Where the studies' lock files live: trainlab's folder in the user's cache."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "trainlab" / "studies"


@dataclass
class StudyOwner:
    """This driver's hold on a study; release() when the study closes (the flock goes with the process)."""

    lock: Path
    _file: object | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def beat(self, *, tracking_uri: str, run_id: str) -> None:
        """Renew the parent run's heartbeat every HEARTBEAT_S until release()."""
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=tracking_uri)

        def loop() -> None:
            while True:
                with contextlib.suppress(Exception):  # a store down for a while: the next beat tries again
                    client.set_tag(run_id, names.TAG_HEARTBEAT, str(int(time.time())))
                if self._stop.wait(HEARTBEAT_S):
                    return

        threading.Thread(target=loop, name="study-heartbeat", daemon=True).start()

    def release(self) -> None:
        self._stop.set()
        if self._file is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


def _another(sweep_name: str, holder: str, uri: str) -> str:
    return (f"sweep_name={sweep_name!r} is running already: {holder} runs this study in {redact(uri)}, and a study "
            "has one driver at a time; wait for it to end (running the same command then continues the study), "
            f"stop it, or run this one as a study of its own with sweep_name={sweep_name}-2")


def _describe(process: str, since: str = "") -> str:
    parts = process.split(" ")
    who = f"another driver (host {parts[0]}, pid {parts[1]})" if len(parts) >= 2 else "another driver"
    return who + (f" since {since}" if since else "")


def own_study(*, tracking_uri: str, sid: str, sweep_name: str) -> StudyOwner:
    """Hold the study `sid` in `tracking_uri`'s store on this machine, or StudyHeld naming its driver."""
    folder = lock_folder()
    folder.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(f"{redact(tracking_uri)}\n{sid}".encode()).hexdigest()[:24]
    lock = folder / f"{key}.lock"
    f = open(lock, "a+")  # noqa: SIM115 - held open for the study's life
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read(512).strip()
        f.close()
        process, _, since = holder.partition("\t")
        raise StudyHeld(_another(sweep_name, _describe(process, since), tracking_uri)) from None
    f.seek(0)
    f.truncate()
    f.write(f"{process_id()}\t{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    f.flush()
    return StudyOwner(lock=lock, _file=f)


def check_parent_free(parent, *, sweep_name: str, tracking_uri: str) -> None:
    """StudyHeld where the parent run `parent` (an MLflow Run) is held by a driver that is not this
    process: RUNNING, its driver alive on this host, or on another host with a recent heartbeat."""
    tags = parent.data.tags
    driver = tags.get(names.TAG_DRIVER, "")
    if parent.info.status != "RUNNING" or not driver or driver == process_id():
        return
    if driver.split(" ")[0] == host_name():
        if process_gone(driver):
            return  # killed: the next start of its sweep takes it over (sweep_runs.end_orphaned_sweep_runs)
    else:
        try:
            age = time.time() - float(tags.get(names.TAG_HEARTBEAT, "0"))
        except ValueError:
            age = float("inf")
        if age > STALE_AFTER_S:
            return  # no heartbeat for long: that driver is gone
    raise StudyHeld(_another(sweep_name, _describe(driver), tracking_uri))


__all__ = ["StudyHeld", "StudyOwner", "check_parent_free", "own_study"]
