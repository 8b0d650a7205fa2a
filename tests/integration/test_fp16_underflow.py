"""FP16's classic failure, reproduced and made visible: gradients below fp16's smallest
subnormal (2**-24) flush to zero without loss scaling, so training stalls, and the sampled
`num/grad_underflow` says why; dynamic loss scaling lifts them into range and the same run
trains. In-process Trainer (no Ray), emulated fp16 on CPU (the same roundings as a GPU)."""

from __future__ import annotations

import pytest
import torch

from conftest import RecordingTracker
from trainlab import names
from trainlab.config import compose_run_config
from trainlab.distributed import setup_distributed
from trainlab.engine.run import build_trainer
from trainlab.plan.trial_plan import Where, plan_trial

pytestmark = pytest.mark.slow

# The loss is multiplied by 1e-6 before backward: every gradient of this model is then ~1e-9 to
# 1e-8, below fp16's smallest subnormal (6e-8). AdamW is invariant to the gradient's scale (eps
# set far below it), so in exact arithmetic this run trains exactly like the unscaled one.
TINY_GRADS = 1e-6
RUN = ["model=tiny", "data=markov", "data.vocab_size=64", "train.max_steps=40",
       "train.global_batch_size=8", "train.micro_batch_size=8", "train.seq_len=64",
       "train.eval_every=0", "train.numerics_every=10", "cluster.num_workers=1",
       "cluster.device=cpu", "optim.eps=1e-20", "optim.lr=3e-3", "precision=fp16"]


def _train(loss_scale: str) -> tuple[list[float], RecordingTracker]:
    torch.set_num_threads(1)
    run = compose_run_config([*RUN, f"precision.loss_scale={loss_scale}",
                              "precision.init_scale=16777216"])  # 2**24
    tracker = RecordingTracker()
    trainer = build_trainer(plan_trial(run, Where(device="cpu")), setup_distributed("cpu"), tracker=tracker)
    scale = trainer.recipe.scale
    trainer.recipe.scale = lambda loss: scale(loss * TINY_GRADS)  # the model's gradients are tiny
    result = trainer.train()
    assert result.status == names.STATUS_FINISHED
    return [v for _, v in tracker.series(names.LOSS)], tracker


def test_fp16_gradients_underflow_and_stall_without_loss_scaling():
    losses, tracker = _train("none")
    underflow = [v for _, v in tracker.series(names.NUM_GRAD_UNDERFLOW)]
    assert underflow and min(underflow) > 0.95  # nearly every gradient value flushed to zero
    assert abs(losses[-1] - losses[0]) < 0.02 * losses[0]  # stalled: the loss does not move


def test_fp16_dynamic_loss_scaling_keeps_gradients_in_range_and_trains():
    losses, tracker = _train("dynamic")
    underflow = [v for _, v in tracker.series(names.NUM_GRAD_UNDERFLOW)]
    unscaled = [v for _, v in tracker.series(names.NUM_GRAD_UNDERFLOW_UNSCALED)]
    assert underflow and max(underflow) < 0.05
    assert min(unscaled) > 0.95  # what the same gradients would have done without the scale
    assert losses[-1] < losses[0] - 0.3  # trains
    assert tracker.series(names.LOSS_SCALE)[-1][1] >= 2.0 ** 20
