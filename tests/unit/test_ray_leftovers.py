"""The tiers' check that Ray never outlives the tests (tests/ray_leftovers.py): it finds a Ray
process by its renamed command line and the run's mark, and only the run's own."""

from __future__ import annotations

import os
import subprocess
import time

from ray_leftovers import RUN_MARK, ray_processes_of


def _fake_ray_worker(mark: str) -> subprocess.Popen:
    """A process named as Ray names its workers (`ray::RayTrainWorker`), carrying `mark`."""
    return subprocess.Popen(["bash", "-c", "exec -a ray::RayTrainWorker sleep 120"],
                            env={**os.environ, RUN_MARK: mark})


def _until(predicate, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} within {timeout:.0f} s"
        time.sleep(0.05)


def test_a_ray_process_of_the_run_is_found_until_it_ends_and_another_runs_is_not():
    ours, theirs = _fake_ray_worker("this-run"), _fake_ray_worker("another-run")
    try:
        _until(lambda: any(f"{ours.pid} ray::RayTrainWorker" in p for p in ray_processes_of("this-run")),
               "the run's Ray worker found")
        _until(lambda: any(p.startswith(f"{theirs.pid} ") for p in ray_processes_of("another-run")),
               "the other run's Ray worker renamed")  # so that not finding it below means something
        assert not [p for p in ray_processes_of("this-run") if p.startswith(f"{theirs.pid} ")]
        ours.kill()
        ours.wait(timeout=30)
        assert not [p for p in ray_processes_of("this-run") if p.startswith(f"{ours.pid} ")]
    finally:
        for proc in (ours, theirs):
            proc.kill()
            proc.wait(timeout=30)
