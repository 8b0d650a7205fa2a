"""The local Ray cluster a trial starts listens on loopback unless cluster.host says otherwise:
its dashboard, its node address and every socket its processes listen on, the trial's own
(torch.distributed's rendezvous store, gloo's pairs, the MLflow writer) included."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

# in a fresh interpreter, through the call `trainlab train` makes before any worker starts
# (launch.plan.plan_gang, which starts the local cluster): Ray is imported only once it is up
_START = """
import json, sys
import psutil
from trainlab.config import compose_run_config
from trainlab.launch.plan import plan_gang

plan_gang(compose_run_config(sys.argv[1:]), "auto")
import ray
ctx = ray.get_runtime_context()
info = ray._private.worker.global_worker.node.address_info
listening = []
for proc in [psutil.Process(), *psutil.Process().children(recursive=True)]:
    try:
        conns = proc.net_connections(kind="inet")
    except (psutil.AccessDenied, psutil.NoSuchProcess):
        continue
    listening += [f"{proc.name()} {c.laddr.ip}:{c.laddr.port}" for c in conns if c.status == psutil.CONN_LISTEN]
print(json.dumps({"dashboard": info["webui_url"], "node_ip": info["node_ip_address"],
                  "gcs": info["gcs_address"], "nodes": [n["NodeManagerAddress"] for n in ray.nodes()],
                  "listening": listening}))
ray.shutdown()
"""


def test_local_cluster_binds_to_loopback(tmp_path, cli_env):
    # a Ray session of its own, under a short path (Ray's unix socket paths have a length limit)
    with tempfile.TemporaryDirectory(prefix="tl-", dir="/tmp") as ray_tmp:
        proc = subprocess.run([sys.executable, "-c", _START, "model=tiny", "cluster.num_workers=1"],
                              cwd=tmp_path, env={**cli_env, "RAY_TMPDIR": ray_tmp},
                              capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["dashboard"].startswith("127.0.0.1:"), seen
    assert seen["node_ip"] == "127.0.0.1" and seen["nodes"] == ["127.0.0.1"], seen
    assert seen["gcs"].startswith("127.0.0.1:"), seen
    assert seen["listening"], "no listening socket seen: the check would pass vacuously"
    exposed = [s for s in seen["listening"]
               if not s.split()[-1].rsplit(":", 1)[0] in ("127.0.0.1", "::ffff:127.0.0.1", "::1")]
    assert not exposed, f"listening beyond loopback: {exposed}"


# a real 2-worker trial through the driver's own call (launch.lifecycle.train: preflight, the local
# cluster, the Ray Train gang, an MLflow store), the listening sockets of every process under
# this one (Ray's services, the Ray Train workers, their MLflow writer) listed at each step
# event rank 0 sends, i.e. while the process group and its store are up
_TRIAL = """
import json, sys
import psutil
from trainlab.config import compose_run_config
from trainlab.launch.lifecycle import train

listening, samples = set(), []

def sample(event):
    if event.kind != "step":
        return
    workers = 0
    for proc in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            name = " ".join(proc.cmdline())[:50]
            conns = proc.net_connections(kind="inet")
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        workers += "RayTrainWorker" in name
        listening.update(f"{name} {c.laddr.ip}:{c.laddr.port}" for c in conns if c.status == psutil.CONN_LISTEN)
    samples.append(workers)

outcome = train(compose_run_config(sys.argv[1:]), show_progress=False, on_event=sample)
print(json.dumps({"status": outcome.status, "error": outcome.error, "samples": samples,
                  "listening": sorted(listening)}))
"""

_LOOPBACK = ("127.0.0.1", "::ffff:127.0.0.1", "::1")


def test_a_trial_listens_on_loopback_only(tmp_path, mlflow_db, cli_env):
    """Rank 0's c10d TCPStore used to listen on every interface ('::'), open without
    authentication to anyone who could reach the machine, a new port each trial."""
    overrides = ["model=tiny", "train.max_steps=6", "train.seq_len=32", "train.global_batch_size=4",
                 "train.micro_batch_size=2", "cluster.num_workers=2", "cluster.device=cpu",
                 f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", f"output_dir={tmp_path / 'out'}"]
    with tempfile.TemporaryDirectory(prefix="tl-", dir="/tmp") as ray_tmp:
        proc = subprocess.run([sys.executable, "-c", _TRIAL, *overrides], cwd=tmp_path,
                              env={**cli_env, "RAY_TMPDIR": ray_tmp}, capture_output=True, text=True,
                              timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["status"] == "finished", seen["error"]
    # sampled while both workers ran, and they listened on something: not a vacuous pass
    assert seen["samples"] and max(seen["samples"]) >= 2, seen
    assert any("RayTrainWorker" in s for s in seen["listening"]), seen["listening"]
    exposed = [s for s in seen["listening"] if s.split()[-1].rsplit(":", 1)[0] not in _LOOPBACK]
    assert not exposed, f"listening beyond loopback during the trial: {exposed}"
