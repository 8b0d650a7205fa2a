"""The engine on a CUDA GPU (NCCL when several): bf16 and fp16 with native kernels train."""

from __future__ import annotations

import pytest
import torch

from trainlab import names
from trainlab.config import compose_run_config
from trainlab.engine.run import run_trial

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
def test_engine_trains_on_gpu(precision):
    run = compose_run_config(["model=tiny", f"precision={precision}", "cluster.num_workers=1",
                              "cluster.device=cuda", "train.max_steps=30", "train.eval_every=0"])
    result = run_trial(run)
    assert result.status == names.STATUS_FINISHED
    assert result.final_loss < 4.5
    assert result.mfu is not None or "unknown" in result.extra.get("device", "")
    if precision == "fp16":
        assert result.loss_scale is not None  # native fp16 on GPU keeps the GradScaler


@pytest.mark.parametrize("precision", ["fp8_tensorwise", "fp8_rowwise", "fp8_delayed"])
def test_fp8_trains_compiled_on_gpu_with_both_mfus(precision):
    """FP8 tensor cores (SM 8.9+): the fp8 recipes train under torch.compile and report MFU
    against the bf16 peak and, on a GPU in the peak table, against the FP8 peak."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs FP8 tensor cores (SM 8.9+)")
    run = compose_run_config(["model=125m", "data=markov", "data.vocab_size=4096",
                              f"precision={precision}", "cluster.num_workers=1",
                              "cluster.device=cuda", "train.max_steps=30", "train.eval_every=0",
                              "train.compile=true", "train.seq_len=256",
                              # 125m's linears are too small for rowwise FP8 to pay: convert anyway
                              "precision.keep_hp=[output,unaligned]"])
    result = run_trial(run)
    assert result.status == names.STATUS_FINISHED
    assert result.final_loss < 8.0
    if "H100" in result.extra["device"] or "H200" in result.extra["device"]:
        assert result.mfu is not None and result.mfu_fp8 is not None
        assert result.mfu_fp8 == pytest.approx(result.mfu / 2, rel=1e-2)  # FP8 peak = 2x bf16
