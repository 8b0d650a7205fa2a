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
