"""A local cluster whose start Ray gives up on is started again, and what the failed start left
is ended: Ray waits a fixed 30 s for its raylet to register (ray 2.60) and, on a busy 2-core CI
machine, a sweep's command once failed so. Here Ray's own start runs (its GCS, raylet and
dashboard are real) and then reports that timeout, the first time only; the driver runs in a
process of its own, as a `trainlab` command would."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

DRIVER = textwrap.dedent('''
    import json, sys
    import ray._private.node as node

    real_init, calls = node.Node.__init__, []

    def init_that_times_out_once(self, *args, **kwargs):
        real_init(self, *args, **kwargs)  # every process of the node started, as Ray starts them
        calls.append(self.get_session_dir_path())
        if len(calls) == 1:
            raise Exception("The current node timed out during startup. This could happen because some "
                            "of the raylet failed to startup or the GCS has become overloaded.")

    node.Node.__init__ = init_that_times_out_once
    from trainlab.launch.ray_reaper import session_processes
    from trainlab.launch.ray_trial import start_local_cluster

    context = start_local_cluster(num_cpus=1, include_dashboard=False)
    import ray

    answered = ray.get(ray.remote(lambda: 42).remote())
    failed_left = [p.pid for p in session_processes(calls[0])]
    print(json.dumps({"sessions": calls, "answered": answered, "failed_left": failed_left,
                      "gcs": context.address_info["gcs_address"]}))
    ray.shutdown()
''')


def test_a_local_cluster_that_timed_out_starting_is_ended_and_started_again(tmp_path, cli_env):
    ray_tmp = tempfile.mkdtemp(prefix="tlrs", dir="/tmp")  # short: Ray's socket paths
    try:
        proc = subprocess.run([sys.executable, "-c", DRIVER], cwd=tmp_path, capture_output=True, text=True,
                              # multi-node off, as trainlab sets it, from the start: the driver imports Ray first
                              timeout=600, env=cli_env | {"RAY_TMPDIR": ray_tmp, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(out["sessions"]) == 2 and out["sessions"][0] != out["sessions"][1], out
    assert out["answered"] == 42, out  # the second start is a working cluster
    assert out["failed_left"] == [], out  # the first one's GCS, raylet and agents were ended
    assert out["gcs"].startswith("127.0.0.1:"), out
    assert "Ray's local cluster did not start in its 30 s" in proc.stdout + proc.stderr
