"""bf16_pure's update variants on a CUDA GPU: the rounding runs on the device with a CUDA
generator, keeps steps below half a bf16 ulp, draws reproducibly, and the engine trains."""

from __future__ import annotations

import pytest
import torch

from trainlab import names
from trainlab.config import compose_run_config
from trainlab.engine.run import run_trial
from trainlab.precision.lowp_adamw import LowPrecisionAdamW

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DEVICE = "cuda"


def _push(update: str, *, seed: int = 0, steps: int = 20) -> torch.Tensor:
    """65,536 bf16 weights at 1.0, each step ~1e-3: a quarter of half a bf16 ulp at 1.0."""
    w = torch.ones(1 << 16, dtype=torch.bfloat16, device=DEVICE, requires_grad=True)
    opt = LowPrecisionAdamW([w], lr=1e-3, betas=(0.9, 0.95), weight_decay=0.0, bf16_update=update, seed=seed)
    for _ in range(steps):
        w.grad = torch.full_like(w, -1.0)
        opt.step()
    return w.detach()


def test_plain_loses_and_stochastic_and_kahan_keep_small_steps_on_cuda():
    assert torch.all(_push("plain") == 1.0)
    stochastic = _push("stochastic")
    assert stochastic.device.type == "cuda"
    assert (stochastic.double() - 1).mean().item() == pytest.approx(0.02, rel=0.03)
    kahan = _push("kahan")
    assert len(kahan.unique()) == 1 and abs(kahan[0].item() - 1.02) <= 2.0 ** -8


def test_stochastic_rounding_on_cuda_draws_by_seed():
    assert torch.equal(_push("stochastic", seed=3), _push("stochastic", seed=3))
    assert not torch.equal(_push("stochastic", seed=3), _push("stochastic", seed=4))


@pytest.mark.parametrize("precision", ["bf16_pure_stochastic", "bf16_pure_kahan"])
def test_bf16_pure_variants_train_on_gpu(precision):
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("bf16 needs SM 8.0+")
    run = compose_run_config(["model=tiny", f"precision={precision}", "cluster.num_workers=1",
                              "cluster.device=cuda", "train.max_steps=30", "train.eval_every=0"])
    result = run_trial(run)
    assert result.status == names.STATUS_FINISHED
    assert result.final_loss < 4.5  # as bf16 autocast in test_gpu_engine
