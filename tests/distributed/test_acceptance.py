"""The GPU acceptance run's plumbing on a CPU, as the GPU machine runs it: no Ray, no MLflow
(hidden by --without), the engine under torchrun, one process per precision mode."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO, free_port
from trainlab import names
from trainlab.bench.acceptance.children import without
from trainlab.bench.acceptance.workload import largest_fitting
from trainlab.bench.fp8_vs_bf16 import mode_overrides

pytestmark = pytest.mark.distributed

TINY = ["model=tiny", "data=markov", "train.max_steps=3", "train.global_batch_size=4",
        "train.micro_batch_size=2", "train.seq_len=32", "train.eval_every=0", "train.eval_batches=2"]


def _env(tmp_path, hidden: str = "ray,mlflow") -> dict[str, str]:
    path = [without(hidden.split(",")), str(REPO / "platform")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), "OMP_NUM_THREADS": "1"}


@pytest.mark.slow  # test_ddp's torchrun run keeps the engine-without-Ray check in the gate
def test_one_gpu_torchrun_joins_a_process_group_without_ray_or_mlflow(tmp_path):
    """A 1-process torchrun run initialises a process group (NCCL on a GPU, gloo here) as a
    multi-process one does, and says which in its tags; Ray and MLflow are not importable."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "trainlab.train", *TINY,
           "tracking=none", "cluster.num_workers=1", "cluster.device=cpu", f"hydra.run.dir={out}"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert re.search(r"│ status +│ finished ", proc.stdout), proc.stdout[-2000:]  # the trial's summary
    tags = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        tags.update(json.loads(line).get("tags", {}))
    assert tags[names.TAG_DIST_BACKEND] == "gloo"
    assert tags[names.TAG_WORLD_SIZE] == "1"


@pytest.mark.slow
def test_acceptance_command_prints_the_table_and_ends_with_fp8_over_bf16(tmp_path):
    """`trainlab bench acceptance` on a CPU, Ray and MLflow hidden: both modes train on the same
    tokens (one torchrun process: on a CPU any mode may follow any other), the overhead bench
    runs with tracking=none, both loops eager, the table and targets are printed and written to
    --out, and the last line is fp8/bf16."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "trainlab.bench.acceptance.gpu_accept", "--device", "cpu", "--quick",
           "--without", "ray,mlflow", "--modes", "bf16,fp8_tensorwise", "--parts", "env,table,overhead",
           "--out", str(out)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=_env(tmp_path, hidden=""), capture_output=True, text=True,
                          timeout=420)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert re.fullmatch(r"fp8/bf16: \d+\.\d\dx", lines[-1]), proc.stdout[-3000:]
    assert "ray absent, mlflow absent" in proc.stdout
    report = (out / "acceptance.txt").read_text()
    assert report.strip().splitlines()[-1] == lines[-1]
    for mode in ("bf16", "fp8_tensorwise"):
        (row,) = [line for line in report.splitlines() if line.startswith(f"{mode} ")]
        assert row.split()[1] == "no" and row.rstrip().endswith("same  finished"), report  # eager on a CPU
    result = json.loads((out / "acceptance.json").read_text())
    bf16, fp8 = result["rows"]
    assert bf16["compile"] is False and fp8["compile"] is False
    assert bf16["tokens_seen"] == fp8["tokens_seen"] > 0 and bf16["data_sha256"] == fp8["data_sha256"]
    assert "tokens: all 2 finished modes saw the same" in report
    for row in (bf16, fp8):  # trainlab.estimate's numbers for the same gang, beside the measured
        assert row["est_tokens_per_s"] > 0 and row["est_peak_mem_gb"] > 0 and row["est_s"] > 0
        assert f"{row['est_tokens_per_s']:,.0f}" in next(line for line in report.splitlines()
                                                          if line.startswith(f"{row['precision']} "))
    assert bf16["val_loss"] == pytest.approx(fp8["val_loss"], rel=0.05)
    assert fp8["tokens_per_s"] / bf16["tokens_per_s"] == pytest.approx(float(lines[-1][10:-1]), abs=0.006)
    assert result["overhead"]["status"] == "finished" and result["overhead"]["ratio"] > 0
    assert re.search(r"overhead \(engine / bare loop, model tiny, tracking=none, both eager\): \d\.\d{3}", report)
    # a CPU run reports the targets without judging them: they are for one H100/H200
    assert [t["verdict"] for t in result["targets"]] == ["-"] * 4
    assert "===== table bf16,fp8_tensorwise: " in (out / "acceptance.log").read_text()


def test_plan_trains_the_largest_preset_that_fits_the_device():
    """1b on an 80 GB H100 (7b's fp32 AdamW state alone is over 100 GB); smaller on less."""
    kw = dict(vocab_size=4096, seq_len=2048, micro_batch=4)
    h100 = largest_fitting(80.0, **kw)
    assert h100.model == "1b" and h100.memory_gb < 0.8 * 80
    assert largest_fitting(140.0, **kw).model == "1b"
    small = largest_fitting(24.0, **kw)
    assert small.model in ("350m", "125m") and small.memory_gb < h100.memory_gb
    assert small.seq_len == 1024  # its preset's max_seq_len


def test_fp8_bench_modes_name_tf32_and_refuse_typos():
    assert mode_overrides("fp32+tf32") == ["precision=fp32", "precision.tf32=true"]
    assert mode_overrides("fp8_rowwise") == ["precision=fp8_rowwise"]
    with pytest.raises(ValueError, match="'bf16\\+tf32'.*fp32\\+tf32"):
        mode_overrides("bf16+tf32")
