"""The Trainer owns its state: another trainer given its state_dict() goes on bit for bit, a
rollback's trainer (its collaborators given to its constructor) brings a loaded state to its
own learning rate and precision, and a resumed trial's summary medians cover every step."""

from __future__ import annotations

import copy
import math

import pytest

from conftest import RecordingTracker
from trainlab import names
from trainlab.config import compose_run_config
from trainlab.engine.rollback import Rollback, attempt_config
from trainlab.engine.run import build_trainer
from trainlab.plan.trial_plan import Where, plan_trial
from trainlab.telemetry import Peak, peak_flops
from trainlab.telemetry import throughput as throughput_module

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["model=tiny", "data=markov", "train.max_steps=6", "train.global_batch_size=4",
        "train.micro_batch_size=2", "train.seq_len=32", "cluster.num_workers=1", "cluster.device=cpu",
        "train.eval_every=3", "train.eval_batches=1", "train.numerics_every=2", "optim.warmup_steps=2"]


def trainer(overrides: list[str], dist_info, *, rollback: Rollback | None = None):
    """build_trainer (a fixed CPU peak: MFU without the matmul probe) and its tracker."""
    run = compose_run_config([*TINY, *overrides])
    if rollback is not None:
        run = attempt_config(run, rollback)
    tracker = RecordingTracker()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(peak_flops, "cpu_probe_peak", lambda dtype, **_: Peak(1e11, f"probe:cpu:{dtype}"))
        return build_trainer(plan_trial(run, Where(device=dist_info.device.type)), dist_info, tracker=tracker, rollback=rollback), tracker


def trained_with_state_at(step: int, overrides: list[str], dist_info):
    """The whole trial's result, its trainer, and a copy of its state_dict() after `step`."""
    whole, tracker = trainer(overrides, dist_info)
    saved = {}
    whole.add_hook(lambda tr, s, _m: saved.setdefault(s, copy.deepcopy(tr.state_dict())) if s == step else None)
    return whole.train(), whole, tracker, saved[step]


def test_a_trainer_given_anothers_state_trains_on_bit_for_bit(dist_info):
    result, whole, _, state = trained_with_state_at(3, ["precision=fp16"], dist_info)
    later, _ = trainer(["precision=fp16"], dist_info)
    later.load_state_dict(state)
    assert (later.step, later.tokens_seen) == (3, 3 * later.batches.tokens_per_step)
    rest = later.train()
    assert rest.steps == 6 and later.losses == whole.losses  # the loaded curve, then the same steps
    for key in (names.TAG_PARAMS_SHA, names.TAG_LOSS_CURVE_SHA):
        assert rest.extra[key] == result.extra[key], key
    assert (rest.final_loss, rest.final_val_loss, rest.loss_scale) == (
        result.final_loss, result.final_val_loss, result.loss_scale)
    assert later.state_dict()["local"]["counters"] == whole.state_dict()["local"]["counters"]


def test_a_rollbacks_trainer_takes_a_state_to_its_learning_rate_and_precision(dist_info):
    _, _, whole_tracker, state = trained_with_state_at(3, ["precision=fp16"], dist_info)
    rollback = Rollback(count=1, lr_scale=0.5, precision="fp32", back_to=3)
    retry, tracker = trainer(["precision=fp16"], dist_info, rollback=rollback)
    assert retry.run.precision.name == "fp32" and retry.rollback == rollback and retry.recipe.loss_scale is None
    retry.load_state_dict(state)  # an fp16 state: its loss scaler has no place in fp32
    result = retry.train()
    assert result.status == names.STATUS_FINISHED and all(math.isfinite(v) for v in retry.losses)
    lrs, retried = whole_tracker.by_step(names.LR), tracker.by_step(names.LR)
    assert sorted(retried) == [4, 5, 6]
    for step in retried:
        assert retried[step] == pytest.approx(0.5 * lrs[step], rel=1e-12), step
    assert retry.state_dict()["local"]["rollback"] == rollback.as_state()  # what its checkpoints record


def test_a_fresh_rollback_trainer_starts_at_its_learning_rate_scale(dist_info):
    plain, _ = trainer([], dist_info)
    scaled, _ = trainer([], dist_info, rollback=Rollback(count=1, lr_scale=0.25))
    assert scaled.scheduler.get_last_lr()[0] == pytest.approx(0.25 * plain.scheduler.get_last_lr()[0])
    assert [g["lr"] for g in scaled.optimizer.param_groups] == pytest.approx(
        [0.25 * g["lr"] for g in plain.optimizer.param_groups])


class Clock:
    """time for the throughput meter: every reading `dt` seconds after the last."""

    def __init__(self, dt: float):
        self.t, self.dt = 0.0, dt

    def perf_counter(self) -> float:
        self.t += self.dt
        return self.t


def test_a_resumed_trials_mfu_is_the_median_of_the_same_steps_as_its_tokens_per_s(dist_info, monkeypatch):
    """Steps 2-4 ran at 1 s each before the state was taken, 5-6 at 4 s after it: both medians
    are of steps 2-6, so MFU is tokens/s times FLOPs per token over the peak, as in one run."""
    clock = Clock(1.0)
    monkeypatch.setattr(throughput_module, "time", clock)
    _, _, _, state = trained_with_state_at(4, [], dist_info)
    later, _ = trainer([], dist_info)
    later.load_state_dict(state)
    clock.dt = 4.0
    rest = later.train()
    tp = later.throughput
    assert rest.tokens_per_s == tp.tokens_per_step / 1.0  # the median of 3 steps at 1 s and 2 at 4 s
    assert rest.mfu == pytest.approx(rest.tokens_per_s * tp.flops_per_token / (tp.peak.flops_per_s * tp.world_size),
                                     rel=1e-12)
