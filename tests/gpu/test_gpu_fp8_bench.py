"""The FP8 bench on one GPU (SM 8.9+): bf16 and fp8_tensorwise, both compiled, train the same
tokens from the same init in one torchrun process; the validation losses agree within 1 % and
both MFUs are reported where the peak table has the GPU. The speed target (fp8 >= 1.2x bf16 on the
largest preset) is judged by `bash .ci/gpu-accept`, which prints the measured ratio."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO
from trainlab import names
from trainlab.telemetry.peak_flops import gpu_peak

pytestmark = [pytest.mark.gpu, pytest.mark.slow,  # two compiles of 125m: the acceptance table covers it
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_fp8_bench_trains_bf16_and_fp8_on_the_same_tokens(tmp_path):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs FP8 tensor cores (SM 8.9+)")
    out = tmp_path / "fp8.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
           "-m", "trainlab.bench.fp8_vs_bf16", "--precisions", "bf16,fp8_tensorwise", "--json", str(out),
           "model=125m", "data=markov", "data.vocab_size=256", "train.seq_len=1024",
           "train.micro_batch_size=8", "train.global_batch_size=8", "train.max_steps=40",
           "train.eval_batches=8", "train.numerics_every=0", "train.compile=true", "train.compile_unit=block",
           "optim.lr=3e-4", "cluster.device=cuda"]
    path = os.pathsep.join(filter(None, [str(REPO / "platform"), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run(cmd, cwd=tmp_path, env={**os.environ, "PYTHONPATH": path}, capture_output=True,
                          text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    print(proc.stdout[-1500:])  # the bench's table and speedup, for -s and the acceptance log
    bf16, fp8 = json.loads(out.read_text())["rows"]
    assert bf16["status"] == fp8["status"] == names.STATUS_FINISHED
    assert bf16["tokens_seen"] == fp8["tokens_seen"] == 40 * 8 * 1024  # the same tokens
    assert abs(fp8["val_loss"] - bf16["val_loss"]) / bf16["val_loss"] < 0.01
    assert bf16["tokens_per_s"] > 0 and fp8["tokens_per_s"] > 0
    device = torch.cuda.get_device_name()
    hp, fp8_peak = gpu_peak(device, "bf16").flops_per_s, gpu_peak(device, "fp8").flops_per_s
    if hp is None:  # not in the peak table: no MFU rather than a guessed one
        assert bf16["mfu"] is None and fp8["mfu"] is None
    else:
        assert 0 < bf16["mfu"] <= 1 and 0 < fp8["mfu"] <= 1
    # the FP8 MFU is reported for the FP8 mode only (its value, the same FLOPs over the table's
    # FP8 peak, restates the table: the measured speed is the bench's ratio line, judged by
    # .ci/gpu-accept)
    assert bf16["mfu_fp8"] is None
    assert (fp8["mfu_fp8"] is not None) == bool(hp and fp8_peak)
