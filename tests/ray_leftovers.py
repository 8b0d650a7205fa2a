"""Ray processes a test run started never outlive it (pytest plugin, loaded by conftest).

Every process the tests start inherits RUN_MARK (set here, in pytest's first process, before
pytest-xdist starts its workers). When the run ends, in that first process, the plugin waits up to
SETTLE_S for the Ray processes carrying the mark (the GCS, raylets, dashboards and their agents,
Ray's workers: launch.ray_reaper's test) to be gone, and for no new `ray_current_cluster` file
where Ray's address="auto" reads it (launch.preflight.ray_address_file); what is left
fails the run, with each process's pid and command line.
"""

from __future__ import annotations

import os
import time

import psutil
import pytest

from trainlab.launch.preflight import ray_address_file
from trainlab.launch.ray_reaper import is_ray_process

RUN_MARK = "TRAINLAB_TEST_RUN"
SETTLE_S = 60.0
"""A cluster's last processes exit a few seconds after ray.shutdown(); on a loaded machine longer."""
_BEFORE = pytest.StashKey[int | None]()
"""The address file's mtime when the run began (None: there was none)."""


def ray_processes_of(mark: str) -> list[str]:
    """'pid command line' of every Ray process whose environment carries RUN_MARK=mark."""
    left = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and is_ray_process(proc.cmdline()) and proc.environ().get(RUN_MARK) == mark:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"{proc.pid} {' '.join(proc.cmdline())[:200]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return left


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: its first process checks
        return
    os.environ[RUN_MARK] = f"{os.getpid()}-{time.time_ns()}"
    marker = ray_address_file()
    config.stash[_BEFORE] = marker.stat().st_mtime_ns if marker.exists() else None


def leftovers(config: pytest.Config, *, settle_s: float = SETTLE_S) -> list[str]:
    """What the run left of Ray once SETTLE_S passed: processes, and a new ray_current_cluster."""
    mark, deadline = os.environ[RUN_MARK], time.monotonic() + settle_s
    while (left := ray_processes_of(mark)) and time.monotonic() < deadline:
        time.sleep(1)
    marker = ray_address_file()
    if marker.exists() and marker.stat().st_mtime_ns != config.stash[_BEFORE]:
        left.append(f"{marker} (a `ray start` cluster's address, written during the run: a later "
                    "`ray.init('auto')` would join that cluster or fail on its stale address)")
    return left


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput") or _BEFORE not in session.config.stash:
        return
    if left := leftovers(session.config):
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = [f"Ray left running by the tests, {SETTLE_S:.0f} s after the last one ended:", *left]
        if reporter:
            reporter.ensure_newline()
            reporter.write_sep("=", "Ray outlived the tests", red=True)
            for line in lines:
                reporter.write_line(line)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
