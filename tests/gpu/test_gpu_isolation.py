"""Warm gangs on one CUDA GPU (engine.isolation): a trial after other trials in the same process
gives the bits and the memory peak it gives first, once after_trial ran between them; the
sequence is one fresh_gang_reason lets share a gang (all deterministic, as the gang's first
trial; the compiled trial before the torchao FP8 one). Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from trainlab import names
from trainlab.config import compose_run_config
from trainlab.engine.isolation import GangState, fresh_gang_reason
from trainlab.engine.run import run_trial
from trainlab.plan.here import plan_here

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TINY = ["model=tiny", "data=markov", "train.seq_len=64", "train.micro_batch_size=4",
        "train.global_batch_size=8", "train.max_steps=10", "train.eval_every=0", "train.eval_batches=2",
        "cluster.num_workers=1", "cluster.device=cuda", "train.deterministic=true", "tracking=none"]
X = ["precision=fp32", "train.compile=false"]


def _between() -> list[list[str]]:
    major_minor = torch.cuda.get_device_capability()
    trials = []
    if major_minor >= (8, 0):
        trials += [["precision=bf16", "train.compile=true"], ["precision=fp16"]]
    if major_minor >= (8, 9):
        trials += [["precision=fp8_tensorwise", "precision.keep_hp=[output,unaligned]"]]
    return trials


def test_a_trial_after_others_on_a_warm_gpu_gang_gives_its_bits_and_its_memory_peak():
    state = GangState.capture()
    sequence = [X, *_between(), X]
    runs = [compose_run_config([*TINY, *o]) for o in sequence]
    results = []
    try:
        for i, run in enumerate(runs):
            assert fresh_gang_reason(ran=runs[:i], run=run, device="cuda") == "", sequence[i]
            results.append(run_trial(plan_here(run)))
            state.after_trial()
            # the trial's tensors are gone and the next trial's peak starts from here
            assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated()
    finally:
        state.after_trial()
    assert all(r.status == names.STATUS_FINISHED for r in results), [r.status for r in results]
    first, again = results[0], results[-1]
    for key in (names.TAG_LOSS_CURVE_SHA, names.TAG_PARAMS_SHA):
        assert again.extra[key] == first.extra[key], f"{key}: x after {sequence[1:-1]} differs"
    assert again.peak_mem_gb == pytest.approx(first.peak_mem_gb, rel=0.01)
    assert state.changed() == []
