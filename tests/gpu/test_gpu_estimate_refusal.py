"""On a CUDA GPU, a trial planned in process (torchrun's path: plan.here) is estimated on
this GPU, named as Ray names it, and one its estimate does not fit is refused with the numbers and
the fix before anything is allocated on the device."""

from __future__ import annotations

import math

import pytest
import torch

from trainlab.config import ConfigError, compose_run_config
from trainlab.estimate.hardware import known_types
from trainlab.plan.here import plan_here
from trainlab.vocab.gpus import ray_type_of

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


def too_big_for_this_gpu() -> list[str]:
    """7b's blocks, as many as make fp32 + AdamW state alone (16 B a parameter) 1.3x this GPU's
    memory: a fixed 7b fits an H200's 141 GB (estimate 114.8 GB), not an H100's 80 GB."""
    dim, ffn = 4096, 11008
    block_bytes = 16 * (4 * dim * dim + 3 * dim * ffn)  # wq wk wv wo, w1 w2 w3 (norms are noise)
    total = torch.cuda.get_device_properties(0).total_memory
    return ["model=7b", f"model.n_layers={max(32, math.ceil(1.3 * total / block_bytes))}"]


def test_a_trial_too_big_for_this_gpu_is_refused_before_it_allocates():
    kind = _this_type()
    run = compose_run_config([*too_big_for_this_gpu(), "parallel=ddp", "precision=fp32", *ONE_GPU])
    before = torch.cuda.memory_allocated()
    with pytest.raises(ConfigError) as e:
        plan_here(run)
    msg = str(e.value)
    assert f"but its {kind} holds" in msg and "fix: parallel=fsdp" in msg, msg
    assert torch.cuda.memory_allocated() == before
