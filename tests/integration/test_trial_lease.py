"""One owner per trial, through the real CLI (issue 28): a trial interrupted, then resumed by
two drivers at once: the one that holds the trial's lease (launch.lease) goes on and finishes,
the other is refused in one `error:` line naming the holder (host, pid, since when), exit 2,
and the trial's one MLflow run has every step's loss exactly once."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import tempfile
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from test_interrupt import TRIAL, Driver, _assert_clean_exit, _checkpoints, _runs, _steps

from trainlab import names

pytestmark = [pytest.mark.ray, pytest.mark.slow]

MAX_STEPS = 100


@pytest.fixture
def ray_tmps():
    """Each driver's own Ray temp root (short: Ray's socket paths must fit 107 bytes)."""
    paths = [Path(tempfile.mkdtemp(prefix="rtl", dir="/tmp")) for _ in range(2)]
    yield paths
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def test_a_second_driver_resuming_a_held_trial_is_refused_and_the_run_has_each_step_once(tmp_path, mlflow_db, ray_tmps):
    root = tmp_path / "ckpt"
    trial = [a for a in TRIAL if not a.startswith("train.max_steps=")]
    trial += [f"train.max_steps={MAX_STEPS}", f"train.checkpoint_dir={root}"]
    first = Driver(trial, cwd=tmp_path, ray_tmp=ray_tmps[0])
    first.wait_for(lambda: _checkpoints(root), "checkpoint")
    code, _ = first.stop(signal.SIGINT, group=True)
    _assert_clean_exit(first, code, signal.SIGINT)
    assert not (root / "lease.json").exists()  # given back on the way out
    stopped = _checkpoints(root)[-1]
    assert stopped < MAX_STEPS

    # the same command twice: the first to hold the lease trains, the other is refused
    owner = Driver(trial, cwd=tmp_path, ray_tmp=ray_tmps[0])
    lease = owner.wait_for(lambda: _lease(root), "the resumed driver's lease")
    assert lease["pid"] == owner.proc.pid and lease["host"] == socket.gethostname()
    second = Driver(trial, cwd=tmp_path, ray_tmp=ray_tmps[1])
    assert second.proc.wait(timeout=300) == 2, second.output()[-4000:]
    said = second.output()
    errors = [line for line in said.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in said, said[-4000:]
    assert f"host {socket.gethostname()}, pid {owner.proc.pid}, since " in errors[0], errors[0]
    assert owner.proc.poll() is None, "the owner ended before the second driver was refused: nothing was raced"

    assert owner.proc.wait(timeout=600) == 0, owner.output()[-4000:]
    assert not (root / "lease.json").exists()
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = _runs(client)  # the trial's one run, continued by its owner only
    assert run.info.status == "FINISHED" and run.data.tags[names.TAG_STATUS] == names.STATUS_FINISHED
    assert _steps(client, run.info.run_id) == list(range(1, MAX_STEPS + 1))  # every step exactly once


def _lease(root) -> dict | None:
    try:
        return json.loads((root / "lease.json").read_text())
    except (OSError, ValueError):
        return None
