"""The tests' Ray cluster starts as `trainlab train` starts its own (launch.ray_trial.
start_local_cluster): a crashed cluster's `ray_current_cluster` file left in Ray's temp folder,
or RAY_ADDRESS, must not make the fixture try to join that cluster (Ray then refuses the
fixture's num_cpus: "When connecting to an existing cluster, num_cpus and num_gpus must not be
provided", a setup error of every Ray test). Each case runs the fixture's own code in a fresh
process with its own Ray temp folder; nothing listens anywhere but 127.0.0.1."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import closed_port

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TESTS = Path(__file__).resolve().parents[1]

# the session fixture's startup and teardown, as pytest runs them, in a process of its own
PROBE = """
import sys
sys.path.insert(0, {tests!r})
import conftest
fixture = conftest.ray_session._get_wrapped_function()()
ray = next(fixture)
address = ray.get_runtime_context().gcs_address
print("started", address)
assert address.startswith("127.0.0.1:") and not address.endswith(":{stale}"), address
next(fixture, None)
"""


@pytest.mark.parametrize("left_behind", ["ray_current_cluster", "RAY_ADDRESS"])
def test_the_ray_fixture_starts_its_own_cluster_whatever_an_earlier_one_left(left_behind):
    ray_tmp = Path(tempfile.mkdtemp(prefix="rtf", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    try:
        stale = closed_port()  # a crashed cluster's GCS: nothing answers there
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env["RAY_TMPDIR"] = str(ray_tmp)
        if left_behind == "RAY_ADDRESS":
            env["RAY_ADDRESS"] = f"127.0.0.1:{stale}"
        else:
            (ray_tmp / "ray").mkdir()
            (ray_tmp / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{stale}")
        proc = subprocess.run([sys.executable, "-c", PROBE.format(tests=str(TESTS), stale=stale)], env=env,
                              capture_output=True, text=True, timeout=300)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-4000:]
        assert "started 127.0.0.1:" in proc.stdout, out[-4000:]
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
