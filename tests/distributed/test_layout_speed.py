"""`trainlab.bench.layout_speed` end to end under torchrun on 2 gloo ranks: every layout trains in
the same processes (one process group, a DeviceMesh per layout) and the table shows what
sharding saves per rank."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO, free_port

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # 8-25 s of gloo groups: the gate keeps under 15 min

LAYOUTS = ("ddp", "fsdp", "zero1")
SUMMARY = re.compile(r"^layout (\w+): speedup: (\S+)x  memory: (\S+)x$", re.M)


def test_bench_parallel_table_shows_sharded_memory():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           "-m", "trainlab.bench.layout_speed", "--layouts", ",".join(LAYOUTS),
           "model=tiny", "train.max_steps=4", "train.seq_len=32", "train.global_batch_size=4",
           "train.micro_batch_size=2"]
    env = {**os.environ, "PYTHONPATH": str(REPO / "platform"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout

    # the table: one finished row per layout, the reference first at 1.00x
    table = {line.split()[0]: line for line in out.splitlines()
             if line.split() and line.split()[0] in LAYOUTS and line.rstrip().endswith("finished")}
    assert set(table) == set(LAYOUTS), out
    assert "params + grads + optimizer state" in out, out  # CPU: says what the memory column is

    ratios = {name: (float(speed), float(mem)) for name, speed, mem in SUMMARY.findall(out)}
    assert list(ratios) == list(LAYOUTS), out
    assert all(math.isfinite(v) and v > 0 for pair in ratios.values() for v in pair), ratios
    assert ratios["ddp"] == (1.0, 1.0)
    # FSDP shards parameters, gradients and Adam's states over 2 ranks (~0.5x of DDP's);
    # ZeRO-1 only the states (~0.75x)
    assert ratios["fsdp"][1] < 0.75, out
    assert ratios["zero1"][1] < 1.0, out
    assert ratios["fsdp"][1] < ratios["zero1"][1], out
