"""A sweep on a joined Ray cluster (`ray start --head` on loopback, 2 CPUs, as a user starts
one): a trial whose gang needs more CPUs than the cluster has refuses the sweep whole, once the
driver has joined it and before any trial starts. It used to be marked failed while the other
trials ran."""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

import pytest

from conftest import ray_head, trainlab_cmd

pytestmark = [pytest.mark.ray, pytest.mark.slow]

HEAD_CPUS = 2


@pytest.fixture
def head():
    with ray_head(HEAD_CPUS) as h:
        yield h


def _trial_runs(db: Path) -> list[str]:
    """The trial runs in the sqlite store (none if the store was never made)."""
    if not db.exists():
        return []
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        return [r[0] for r in con.execute(
            "SELECT run_uuid FROM tags WHERE key = 'trainlab.role' AND value = 'trial'")]


def test_a_sweep_with_a_trial_beyond_the_joined_clusters_cpus_is_refused_whole(head, tmp_path, mlflow_db):
    db = tmp_path / "mlflow.db"
    proc = subprocess.run(
        trainlab_cmd("train", "-m", "cluster=ray", f"cluster.address={head.address}", "cluster.num_workers=1,4",
                     "model=tiny", "train.max_steps=2", "train.eval_every=0", "train.seq_len=32",
                     "train.global_batch_size=8", "train.micro_batch_size=2", f"tracking.uri=sqlite:///{db}",
                     f"hydra.sweep.dir={tmp_path / 'multirun'}"),
        env=head.env | {"PYTHONUNBUFFERED": "1"}, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    shown = f"\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    assert proc.returncode == 2, shown
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert errors == ["error: the sweep has trials that cannot run; nothing was started:"], shown
    refused = [line.strip() for line in proc.stderr.splitlines() if line.startswith("  #")]
    assert len(refused) == 1, shown  # the trial that fits is not named
    line = refused[0]
    assert line.startswith("#1 (cluster.num_workers=4): "), shown
    assert "cluster.num_workers=4 x cluster.cpus_per_worker=1 needs 4 CPUs" in line, shown
    assert f"the Ray cluster at cluster.address={head.address} has {HEAD_CPUS};" in line, shown
    assert f"use cluster.num_workers={HEAD_CPUS} or fewer" in line, shown
    assert "Traceback" not in proc.stdout + proc.stderr, shown
    # nothing started: no trial was planned or submitted, no trial run in the store, no Ray Train run
    assert "planning trials" not in proc.stderr and "running " not in proc.stdout, shown
    assert _trial_runs(db) == [], shown
    assert not list((tmp_path / "multirun").rglob("ray")), shown
    # a single trial on the same cluster: the same check (launch.plan.check_joined_gangs), its line alone
    one = subprocess.run(
        trainlab_cmd("train", "cluster=ray", f"cluster.address={head.address}", "cluster.num_workers=4", "model=tiny",
                     "train.global_batch_size=8", "train.micro_batch_size=2", "tracking=none",
                     f"hydra.run.dir={tmp_path / 'single'}"),
        env=head.env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    errors = [line for line in one.stderr.splitlines() if line.startswith("error: ")]
    assert one.returncode == 2 and errors == [f"error: {line.split(': ', 1)[1]}"], one.stdout[-2000:] + one.stderr[-2000:]
