"""Elastic data parallel on a real Ray cluster: a head and a second node on this machine, one
CPU (one worker) each, started by `ray start` as users start them (as test_multinode's). An elastic
trial (2 workers, down to 1) runs across both; its second node is killed mid-run, with every
process on it; the trial must go on on 1 worker (train and checkpoint there), grow back to 2 when
the node is started again, and finish, which MLflow must show: status finished, fault/workers 2 then 1 then 2,
every step once, the same tokens per step throughout.

Ray's own knobs make the test quick, not different: the head declares a node dead after ~1.5 s
of failed health checks instead of ~15 s, and a gang that cannot be placed (Ray Train may first
try the old size, from a view of the cluster refreshed every 20 s) is retried after 5 s instead
of 60 s. cluster.max_failures=1: the node loss uses the one failure allowed, the grow-back none.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import free_port, kill_tree, trainlab_cmd
from trainlab import names
from trainlab.config.checkpoints import complete_checkpoints, latest_checkpoint

pytestmark = [pytest.mark.ray, pytest.mark.slow]

RAY = str(Path(sys.executable).parent / "ray")
# enough steps on 1 worker to outlast the node's return and Ray's 20 s view of it (150 did not, once)
GLOBAL_BATCH, SEQ_LEN, MAX_STEPS = 8, 32, 400
FAST_NODE_DEATH = {"RAY_health_check_initial_delay_ms": "1000", "RAY_health_check_period_ms": "500",
                   "RAY_health_check_timeout_ms": "500", "RAY_health_check_failure_threshold": "3"}


class Cluster:
    """The head and its second node; `kill_node` and `start_node` lose and bring back the second."""

    def __init__(self):
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_"))}
        self.env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
        self.gcs = f"127.0.0.1:{free_port()}"
        self.dirs: list[str] = []
        self._start(FAST_NODE_DEATH, "--head", "--port", self.gcs.split(":")[1], "--include-dashboard", "false",
                    "--ray-client-server-port", str(free_port()))
        self.node = self.start_node()

    def _start(self, env: dict, *args: str) -> str:
        temp_dir = tempfile.mkdtemp(prefix="tle", dir="/tmp")  # short: Ray's socket paths
        self.dirs.append(temp_dir)
        # --node-ip-address: on loopback, else Ray picks the machine's routable address
        subprocess.run([RAY, "start", "--temp-dir", temp_dir, "--node-ip-address", "127.0.0.1", "--num-cpus", "1",
                        "--disable-usage-stats",
                        "--dashboard-agent-listen-port", str(free_port()), *args],
                       env=self.env | env, check=True, capture_output=True, timeout=120)
        return temp_dir

    def start_node(self) -> str:
        self.node = self._start({}, "--address", self.gcs)
        return self.node

    def kill_node(self) -> None:
        """SIGKILL every process of the second node, as a lost machine takes them all."""
        kill_tree(self.node)

    def stop(self) -> None:
        for d in self.dirs:  # only this cluster's processes: `ray stop` would stop every cluster here
            kill_tree(d)
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def cluster():
    c = Cluster()
    yield c
    c.stop()


def _wait_for(what: str, ready, driver: subprocess.Popen, log: Path, timeout: float) -> float:
    """Poll `ready()` until true; the seconds it took. Fails with the driver's output if the
    driver ended first or the time ran out."""
    start = time.monotonic()
    while not ready():
        assert driver.poll() is None, f"the driver ended before {what}:\n{log.read_text()[-4000:]}"
        assert time.monotonic() - start < timeout, f"no {what} within {timeout} s:\n{log.read_text()[-4000:]}"
        time.sleep(0.5)
    return time.monotonic() - start


def test_an_elastic_trial_goes_on_without_a_lost_node_and_grows_back(cluster, tmp_path, mlflow_db):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    run_dir = tmp_path / "run"
    env = cluster.env | {"MLFLOW_TRACKING_URI": uri, "PYTHONUNBUFFERED": "1", "COLUMNS": "200",
                         "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "5"}
    args = ["train", "cluster=ray", f"cluster.address={cluster.gcs}", "parallel=ddp", "cluster.device=cpu",
            "cluster.num_workers=2", "cluster.min_workers=1", "cluster.max_failures=1", "cluster.resize_interval_s=2",
            "model=tiny", "data=markov", f"train.max_steps={MAX_STEPS}", f"train.global_batch_size={GLOBAL_BATCH}",
            "train.micro_batch_size=2", f"train.seq_len={SEQ_LEN}", "train.eval_every=0", "train.numerics_every=0",
            "train.checkpoint_every=5", "train.log_every=1", "debug.slowdown=[8,8]",
            "tracking.system_metrics=false", "tracking.experiment=elastic", f"hydra.run.dir={run_dir}"]
    log = tmp_path / "driver.log"
    t0 = time.monotonic()
    with open(log, "w") as out:
        driver = subprocess.Popen(trainlab_cmd(*args), cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    timeline = {}
    try:
        timeline["first checkpoint"] = _wait_for(  # complete: renamed from step_N.tmp once every rank wrote
            "a first checkpoint", lambda: complete_checkpoints(run_dir / "checkpoints"), driver, log, 240)
        cluster.kill_node()
        timeline["on 1 worker"] = _wait_for(
            "a restart on 1 worker", lambda: "continuing on 1 of 2 workers" in log.read_text(), driver, log, 120)
        # the node comes back only once 1 worker has trained past its resume point and checkpointed
        # (which first syncs the tracker): started at the notice, the node once returned before the
        # 1-worker attempt's first metrics left its process, and MLflow never saw it run on 1 worker
        resumed_at = int(re.search(r"at step (\d+) \(restart 1\) on 1 workers", log.read_text()).group(1))
        timeline["checkpoint on 1 worker"] = _wait_for(
            "a checkpoint on 1 worker", lambda: latest_checkpoint(run_dir / "checkpoints").step > resumed_at,
            driver, log, 120)
        cluster.start_node()
        timeline["back on 2"] = _wait_for(  # the grow-back's "resumed from ... on 2 workers"
            "a grow-back", lambda: "on 2 workers" in log.read_text(), driver, log, 120)
        driver.wait(timeout=300)
    finally:
        if driver.poll() is None:
            driver.kill()
    timeline["total"] = time.monotonic() - t0
    print(json.dumps(timeline))
    text = log.read_text()
    assert driver.returncode == 0, text[-4000:]

    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("elastic").experiment_id])
    assert run.data.tags[names.TAG_STATUS] == names.STATUS_FINISHED, run.data.tags
    assert run.data.tags[names.TAG_ELASTIC] == "1-2"

    def history(key):
        return [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, key),
                                                   key=lambda m: (m.step, m.timestamp))]

    workers = [int(v) for _, v in history(names.WORKERS)]
    assert workers == [2, 1, 2], history(names.WORKERS)
    assert [int(v) for _, v in history(names.GRAD_ACCUM)] == [2, 4, 2]  # micro-batches per worker
    assert [int(v) for _, v in history(names.RESTARTS)] == [0, 1, 2]
    steps = [s for s, _ in history(names.LOSS)]
    assert steps == list(range(1, MAX_STEPS + 1))  # every step once: no gap, no repeat
    tokens = dict(history(names.TOKENS_SEEN))
    assert {tokens[s] - tokens.get(s - 1, 0) for s in tokens} == {GLOBAL_BATCH * SEQ_LEN}
