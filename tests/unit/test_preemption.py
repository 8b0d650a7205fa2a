"""SIGTERM while a trainer trains asks it to stop after the step (status preempted); once its
train() returned, SIGTERM is handled as it was before the trainer existed (a bench's next
loop, a process's exit), instead of setting a flag that no one reads any more."""

from __future__ import annotations

import os
import signal

import pytest

from trainlab import names
from trainlab.config import compose_run_config
from trainlab.engine.run import build_trainer
from trainlab.plan.trial_plan import Where, plan_trial
from trainlab.telemetry import Peak, peak_flops

pytestmark = pytest.mark.usefixtures("one_thread")

TINY_RUN = ["model=tiny", "data=markov", "train.max_steps=4", "train.global_batch_size=4",
            "train.micro_batch_size=4", "train.seq_len=32", "cluster.num_workers=1",
            "train.eval_every=0", "train.eval_batches=1", "cluster.device=cpu"]


def _trainer(dist_info):
    with pytest.MonkeyPatch.context() as mp:  # the matmul peak probe measures nothing checked here
        mp.setattr(peak_flops, "cpu_probe_peak", lambda dtype, **_: Peak(1e11, f"probe:cpu:{dtype}"))
        return build_trainer(plan_trial(compose_run_config(TINY_RUN), Where(device=dist_info.device.type)), dist_info)


def test_sigterm_stops_training_then_goes_back_to_its_handler(dist_info):
    seen: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: seen.append(signum))
    try:
        trainer = _trainer(dist_info)
        trainer.add_hook(lambda tr, step, m: os.kill(os.getpid(), signal.SIGTERM) if step == 2 else None)
        result = trainer.train()
        assert result.status == names.STATUS_PREEMPTED and result.steps == 2
        assert seen == []  # the trainer took it

        os.kill(os.getpid(), signal.SIGTERM)  # training is over: back to the handler from before
        assert seen == [signal.SIGTERM]

        again = _trainer(dist_info).train()  # a later trainer is not stopped by that old request
        assert again.status == names.STATUS_FINISHED and again.steps == 4
        os.kill(os.getpid(), signal.SIGTERM)
        assert seen == [signal.SIGTERM, signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)
