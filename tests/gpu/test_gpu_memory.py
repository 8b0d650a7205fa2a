"""Memory on a CUDA GPU: sys/peak_mem_gb is the allocator's peak after the warm-up step (a
one-off allocation of the first step is not in it), allocated and reserved are logged beside
it, a sampled step adds no copy of the model, and the initial weights are the CPU run's."""

from __future__ import annotations

import pytest
import torch

from conftest import RecordingTracker
from trainlab import names
from trainlab.config import compose_run_config
from trainlab.distributed import setup_distributed
from trainlab.engine.run import build_trainer
from trainlab.plan.trial_plan import Where, plan_trial

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TRANSIENT_GB = 4.0
# ~0.2 GB of fp32 weights (dim 1024, 4 blocks): the steady state stays well below TRANSIENT_GB
MODEL = ["model=small", "model.dim=1024", "model.n_layers=4", "model.n_heads=8", "model.n_kv_heads=8",
         "data=markov", "cluster.num_workers=1", "train.global_batch_size=8", "train.micro_batch_size=8",
         "train.seq_len=128", "train.eval_every=0", "tracking=none"]


def test_cuda_peak_is_the_steady_state_with_allocated_and_reserved_beside_it():
    run = compose_run_config([*MODEL, "cluster.device=cuda", "train.max_steps=4", "train.log_every=1",
                              "train.numerics_every=3"])
    tracker = RecordingTracker()
    trainer = build_trainer(plan_trial(run, Where(device="cuda")), setup_distributed("cuda"), tracker=tracker)
    model_gb = sum(p.numel() * p.element_size() for p in trainer.model.parameters()) / 1e9

    def one_off(_trainer, step, _metrics):  # what compile or a workspace would take at step 1
        if step == 1:
            x = torch.empty(int(TRANSIENT_GB * 1e9 / 4), device="cuda")
            del x

    trainer.add_hook(one_off)
    result = trainer.train()
    peak = tracker.by_step(names.PEAK_MEM_GB)
    allocated, reserved = tracker.by_step(names.MEM_ALLOCATED_GB), tracker.by_step(names.MEM_RESERVED_GB)
    assert sorted(tracker.by_step(names.PEAK_MEM_WARMUP_GB)) == [1] and sorted(peak) == [2, 3, 4]
    assert sorted(allocated) == sorted(reserved) == [1, 2, 3, 4]
    for step in (2, 3, 4):
        assert allocated[step] <= peak[step] and allocated[step] <= reserved[step]
        assert allocated[step] >= 3 * model_gb  # weights, gradients, AdamW's two moments
    assert max(peak.values()) < TRANSIENT_GB  # the step-1 allocation is not the steady state
    assert result.peak_mem_gb == pytest.approx(peak[4], rel=0.1)  # the final evaluation adds little
    # step 3 is sampled: the update-to-weight ratio copies one chunk, not the model
    assert peak[3] - peak[2] < 0.5 * model_gb
    assert trainer.step == 4 and tracker.by_step(names.UPDATE_TO_WEIGHT)


def test_initial_weights_on_cuda_are_the_cpu_run_weights():
    """Generated on the host from (seed, name): the device does not change the init."""
    overrides = [*MODEL, "model.n_layers=2", "train.max_steps=1"]
    cpu = build_trainer(plan_trial(compose_run_config([*overrides, "cluster.device=cpu"]), Where(device="cpu")), setup_distributed("cpu"))
    cuda = build_trainer(plan_trial(compose_run_config([*overrides, "cluster.device=cuda"]), Where(device="cuda")), setup_distributed("cuda"))
    want = dict(cpu.raw_model.named_parameters())
    for name, p in cuda.raw_model.named_parameters():
        assert p.device.type == "cuda"
        assert torch.equal(p.cpu(), want[name]), name
    torch.testing.assert_close(cuda.raw_model.rope_cos.cpu(), cpu.raw_model.rope_cos)
