"""On a CUDA GPU, a trial planned in process (torchrun's path: engine.local_plan) is estimated on
this GPU, named as Ray names it, and one its estimate does not fit is refused with the numbers and
the fix before anything is allocated on the device."""

from __future__ import annotations

import pytest
import torch

from trainlab.config import ConfigError, compose_run_config
from trainlab.engine.local_plan import plan_here
from trainlab.estimate.fits import ray_type_of
from trainlab.estimate.hardware import known_types

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ONE_GPU = ["cluster.device=cuda", "cluster.num_workers=1", "tracking=none", "train.global_batch_size=8"]


def _this_type() -> str:
    kind = ray_type_of(torch.cuda.get_device_name(0))
    if kind not in known_types():
        pytest.skip(f"{kind} is not in the estimate's hardware catalog")
    return kind


def test_a_trial_is_estimated_on_this_gpu():
    kind = _this_type()
    plan = plan_here(compose_run_config(["model=tiny", *ONE_GPU]))
    (rank,) = plan.estimate.ranks
    assert rank.device.name == kind
    total_gb = torch.cuda.get_device_properties(0).total_memory / 1e9
    assert 0.9 * total_gb <= rank.device.memory_gb <= 1.1 * total_gb, (rank.device.memory_gb, total_gb)


def test_a_trial_too_big_for_this_gpu_is_refused_before_it_allocates():
    kind = _this_type()
    run = compose_run_config(["model=7b", "parallel=ddp", "precision=fp32", *ONE_GPU])  # 16 B a parameter
    before = torch.cuda.memory_allocated()
    with pytest.raises(ConfigError) as e:
        plan_here(run)
    msg = str(e.value)
    assert f"but its {kind} holds" in msg and "fix: parallel=fsdp" in msg, msg
    assert torch.cuda.memory_allocated() == before
