"""The local Ray cluster a trial starts listens on loopback unless cluster.host says otherwise:
its dashboard, its node address and every socket its processes listen on."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile

import pytest

pytestmark = [pytest.mark.ray]

# in a fresh interpreter, through the call `trainlab train` makes before any worker starts
# (launch.trial.plan, which starts the local cluster): Ray is imported only once it is up
_START = """
import json, sys
import psutil
from trainlab.config import compose_run_config
from trainlab.launch.trial import plan

plan(compose_run_config(sys.argv[1:]), "auto")
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
