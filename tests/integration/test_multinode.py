"""A multi-node Ray cluster on this machine's loopback, started the way users start one: a head
node declaring (logical) H100s and a second node declaring V100s, each by `ray start` with its
own temp dir. A sweep goes in through the Ray Jobs API (`trainlab submit`); each trial must land
on the GPU type its precision allows, be tagged with where it ran, and reach MLflow.

Workers compute on CPU (debug.logical_gpus): the GPUs are Ray resources, which is all that
placement sees.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import REPO, free_port, trainlab_cmd

pytestmark = [pytest.mark.ray, pytest.mark.slow]

RAY = str(Path(sys.executable).parent / "ray")


def _ray_start(env: dict, temp_dir: str, *args: str, gpu_type: str) -> None:
    proc = subprocess.run(
        # --node-ip-address: on loopback, else Ray picks the machine's routable address
        [RAY, "start", "--temp-dir", temp_dir, "--node-ip-address", "127.0.0.1", "--num-cpus", "2", "--num-gpus", "2",
         "--resources", json.dumps({f"accelerator_type:{gpu_type}": 1}),
         "--dashboard-agent-listen-port", str(free_port()), "--disable-usage-stats", *args],
        env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"ray start {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


@pytest.fixture(scope="module")
def loopback_cluster():
    """Head (2 x H100) + node (2 x V100) on 127.0.0.1, with token auth as Ray 2.60 heads use."""
    # a user's shell: no RAY_* left by this pytest process's own cluster (its single-node switch
    # would make the second `ray start` refuse to join)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_"))}
    env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    # short paths: Ray's Unix sockets live under the temp dir
    dirs = [tempfile.mkdtemp(prefix="tlh", dir="/tmp"), tempfile.mkdtemp(prefix="tln", dir="/tmp")]
    gcs, dashboard = free_port(), free_port()
    try:
        _ray_start(env, dirs[0], "--head", "--port", str(gcs), "--dashboard-host", "127.0.0.1",
                   "--dashboard-port", str(dashboard), "--include-dashboard", "true",
                   "--ray-client-server-port", str(free_port()), gpu_type="H100")
        _ray_start(env, dirs[1], "--address", f"127.0.0.1:{gcs}", gpu_type="V100")
        yield SimpleNamespace(env=env, jobs_url=f"http://127.0.0.1:{dashboard}", gcs=f"127.0.0.1:{gcs}")
    finally:
        for d in dirs:  # only this cluster's processes: `ray stop` would stop every cluster here
            subprocess.run(["pkill", "-KILL", "-f", d], check=False)
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


def test_a_sweep_submitted_through_ray_jobs_lands_by_precision(loopback_cluster, tmp_path):
    import mlflow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = loopback_cluster.env | {"MLFLOW_TRACKING_URI": uri, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        trainlab_cmd("submit", "--address", loopback_cluster.jobs_url, "-m", "--",
                     "precision=fp16,fp8_tensorwise", "debug.logical_gpus=true",
                     "model=tiny", "train.max_steps=3", "train.eval_every=0"),
        env=env, cwd=REPO, capture_output=True, text=True, timeout=540)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "submitted job raysubmit_" in out and "SUCCEEDED" in out

    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("trainlab").experiment_id],
                              filter_string="tags.`trainlab.role` = 'trial'")
    landed = {r.data.tags["precision"]: (r.data.tags["device_types"], r.data.tags["node_count"],
                                         r.data.tags["status"]) for r in runs}
    # FP8 needs SM 8.9: only the H100 node (BF16's 8.0 is refused on the V100 below); FP16 runs
    # anywhere and is routed to the least capable type (same_type placement), keeping the H100s free
    assert landed == {"fp16": ("V100:2", "1", "finished"),
                      "fp8_tensorwise": ("H100:2", "1", "finished")}


def test_a_trial_no_node_can_run_is_refused_at_submission(loopback_cluster, tmp_path):
    proc = subprocess.run(
        trainlab_cmd("train", "cluster=ray", f"cluster.address={loopback_cluster.gcs}",
                     "debug.logical_gpus=true", "precision=bf16", "cluster.accelerator_type=V100",
                     "model=tiny", "tracking=none", f"hydra.run.dir={tmp_path}"),
        env=loopback_cluster.env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr
    assert "no GPU type of the cluster can run this trial" in err
    assert "V100: " in err and "H100: cluster.accelerator_type=V100" in err
    assert "Traceback" not in err
