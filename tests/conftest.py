"""Shared fixtures: a session-wide local Ray cluster, composed configs, recording trackers."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RecordingTracker:
    """A Tracker that keeps everything in memory, for asserting on what a run logged."""

    def __init__(self):
        self.metrics: list[tuple[int, dict]] = []
        self.tags: dict = {}

    def log_metrics(self, metrics, *, step):
        self.metrics.append((step, dict(metrics)))

    def set_tags(self, tags):
        self.tags.update(tags)

    def log_artifact(self, path):
        pass

    def close(self):
        pass

    def series(self, key: str) -> list[tuple[int, float]]:
        return [(step, m[key]) for step, m in self.metrics if key in m]

    def by_step(self, key: str) -> dict[int, float]:
        """Optimizer-step series of one metric (by_tokens twins have keys of their own)."""
        return dict(self.series(key))

    def keys(self) -> set[str]:
        return {k for _, m in self.metrics for k in m}

    def steps_with(self, prefix: str) -> list[int]:
        return sorted({step for step, m in self.metrics if any(k.startswith(prefix) for k in m)})


@pytest.fixture
def one_thread():
    """Tiny in-process trials: one torch thread avoids oversubscribing a busy 2-core machine
    (use with pytestmark = pytest.mark.usefixtures("one_thread"))."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def dist_info():
    """This process as a world of one on CPU (no process group)."""
    from trainlab.engine.distributed import setup_distributed

    return setup_distributed("cpu")


@pytest.fixture
def recording_tracker() -> RecordingTracker:
    return RecordingTracker()


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster for every test that needs one (as `trainlab train` starts it)."""
    import ray

    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5"}})
    yield ray
    ray.shutdown()


@pytest.fixture
def cli_env(tmp_path):
    """Environment for running the real `trainlab` CLI in a subprocess, in tmp_path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def trainlab_cmd(*args: str) -> list[str]:
    """The installed console script, next to this interpreter."""
    return [str(Path(sys.executable).parent / "trainlab"), *args]
