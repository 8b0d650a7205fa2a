"""What one trial leaves in its process, put back by GangState.after_trial before the next trial
of a warm gang (in one process, no group; the gang of two ranks is tests/distributed/test_isolation.py)."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from trainlab.config import compose_run_config
from trainlab.engine import preemption
from trainlab.engine.determinism import set_deterministic
from trainlab.engine.isolation import GangState
from trainlab.engine.run import build_trainer
from trainlab.parallel.compile import compile_blocks
from trainlab.plan.trial_plan import Where, plan_trial
from trainlab.precision.recipes import build_recipe
from trainlab.telemetry import Peak, peak_flops

TINY_RUN = ["model=tiny", "data=markov", "train.max_steps=2", "train.global_batch_size=4",
            "train.micro_batch_size=4", "train.seq_len=16", "cluster.num_workers=1",
            "train.eval_every=0", "train.eval_batches=1", "cluster.device=cpu"]


@pytest.fixture
def state(monkeypatch):
    """The process as a gang finds it; put back (and CUBLAS_WORKSPACE_CONFIG unset) afterwards
    whatever a failing test left."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    # torch's default, as a fresh worker has it: an earlier test in this process may have compiled
    # per block (parallel.compile turns it off) and left it so
    with torch._dynamo.config.patch(skip_nnmodule_hook_guards=True):
        state = GangState.capture()
        yield state
        state.after_trial()


def test_the_switches_a_trial_sets_are_put_back(state):
    threads = torch.get_num_threads()
    # what run_trial and build_trainer set: train.deterministic, cluster.cpus_per_worker, the
    # fp32 recipe with precision.tf32 on CUDA, train.compile per block
    set_deterministic(True)
    torch.set_num_threads(threads + 1)
    build_recipe(compose_run_config(["precision=fp32", "precision.tf32=true"]).precision, device_type="cuda")
    compile_blocks(_one_trainer().raw_model)

    assert set(state.changed()) >= {
        "flag:use_deterministic_algorithms", "flag:cudnn.deterministic", "flag:cuda.matmul.allow_tf32",
        "flag:num_threads", "env:CUBLAS_WORKSPACE_CONFIG",
        "config:torch._dynamo.config.skip_nnmodule_hook_guards"}
    state.after_trial()
    assert state.changed() == []
    assert not torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.deterministic
    assert not torch.backends.cuda.matmul.allow_tf32 and torch.get_num_threads() == threads
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    assert torch._dynamo.config.skip_nnmodule_hook_guards


def test_a_trial_that_failed_before_training_gives_sigterm_back(state):
    """A Trainer takes SIGTERM when it is built; a trial that raises before its train() (a
    checkpoint that does not load, say) never gives it back: the next trial's SIGTERM would
    set a flag of a trainer nobody runs."""
    seen: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: seen.append(signum))
    hangup = signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as from a terminal, not nohup's ignored SIGHUP
    try:
        state = GangState.capture()  # this test's handler is the gang's
        _one_trainer()  # ... and the trial fails here, before train()
        assert "signal:SIGTERM handler" in state.changed()
        assert "signal:SIGHUP handler" in state.changed()  # issue 28: signals: every stop signal's
        state.after_trial()
        os.kill(os.getpid(), signal.SIGTERM)
        assert seen == [signal.SIGTERM]
        assert state.changed() == []
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGHUP, hangup)


def test_a_stop_asked_for_one_trial_does_not_stop_the_next(state):
    """The driver's stop for a trial that ended before its workers' next vote read it, on a gang
    whose workers armed themselves once, at its start."""
    preemption.listen_outside()
    gang = GangState.capture()
    preemption.stop_from_outside()  # the trial ends without another step
    assert "preemption:outside request" in gang.changed()
    gang.after_trial()
    next_trial = _one_trainer()
    assert next_trial.preemption.armed and not next_trial.preemption.requested()
    next_trial.preemption.close()


def _one_process():
    from trainlab.distributed import setup_distributed

    return setup_distributed("cpu")


def _one_trainer():
    with pytest.MonkeyPatch.context() as mp:  # the matmul peak probe measures nothing checked here
        mp.setattr(peak_flops, "cpu_probe_peak", lambda dtype, **_: Peak(1e11, f"probe:cpu:{dtype}"))
        return build_trainer(plan_trial(compose_run_config(TINY_RUN), Where(device="cpu")), _one_process())
