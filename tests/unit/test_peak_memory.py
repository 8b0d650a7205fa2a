"""Peak memory as a user reads it: sys/peak_mem_gb is the steady state after the warm-up step
(what the first step or the build allocated and freed is not in it), the warm-up step's peak
is logged apart, and CPU runs get no allocator metrics they cannot measure."""

from __future__ import annotations

import mmap

import pytest
import torch

from conftest import RecordingTracker
from trainlab import names
from trainlab.config import compose_run_config
from trainlab.engine.run import build_trainer
from trainlab.plan.trial_plan import Where, plan_trial
from trainlab.telemetry import peak_flops
from trainlab.telemetry.peak_flops import Peak
from trainlab.telemetry.peak_memory import memory_gb, memory_source, peak_memory_gb, reset_peak_memory, rss_gb

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(rss_gb() is None, reason="needs /proc (Linux) for the resident set")]

CPU = torch.device("cpu")
TRANSIENT_GB = 0.3


def _touch(gb: float) -> None:
    """Map, write (resident, not just reserved) and unmap `gb` of fresh memory. A mapping of its
    own: a freed tensor's pages may be reused by the allocator while still resident after earlier
    tests, and then touching them would raise no peak."""
    with mmap.mmap(-1, int(gb * 1e9)) as m:
        torch.frombuffer(m, dtype=torch.uint8).fill_(1)


def test_a_reset_peak_leaves_out_memory_freed_before_it():
    _touch(TRANSIENT_GB)
    assert peak_memory_gb(CPU) > rss_gb() + 0.8 * TRANSIENT_GB  # the process's peak saw it
    assert reset_peak_memory(CPU)
    assert peak_memory_gb(CPU) < rss_gb() + 0.1 * TRANSIENT_GB
    _touch(TRANSIENT_GB)
    assert peak_memory_gb(CPU) > rss_gb() + 0.8 * TRANSIENT_GB
    assert memory_source(CPU).startswith("cpu:peak_rss")
    assert memory_gb(CPU) == {}  # no allocator on CPU: no allocated / reserved numbers


def test_peak_memory_is_the_steady_state_after_the_warm_up_step(dist_info):
    """A one-off 0.3 GB at the first step (as compile or a workspace would take) shows in
    sys/peak_mem_warmup_gb at step 1 and in no later sys/peak_mem_gb."""
    run = compose_run_config(["model=tiny", "data=markov", "train.max_steps=4", "train.global_batch_size=2",
                              "train.micro_batch_size=2", "train.seq_len=32", "train.eval_every=0",
                              "train.numerics_every=0", "train.log_every=1", "cluster.num_workers=1"])
    tracker = RecordingTracker()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(peak_flops, "cpu_probe_peak", lambda dtype, **_: Peak(1e11, f"probe:cpu:{dtype}"))
        trainer = build_trainer(plan_trial(run, Where(device=dist_info.device.type)), dist_info, tracker=tracker)
    trainer.add_hook(lambda t, step, _m: _touch(TRANSIENT_GB) if step == 1 else None)
    _touch(TRANSIENT_GB)  # before training: the build's memory is not the trial's either
    result = trainer.train()

    warmup, steady = tracker.by_step(names.PEAK_MEM_WARMUP_GB), tracker.by_step(names.PEAK_MEM_GB)
    assert sorted(warmup) == [1] and sorted(steady) == [2, 3, 4]
    # the step-1 hook runs after step 1's metrics: its memory lands in the next window only
    # if the reset after the warm-up step did not happen
    assert max(steady.values()) < rss_gb() + 0.5 * TRANSIENT_GB, (steady, rss_gb())
    assert result.peak_mem_gb == pytest.approx(max(steady.values()), abs=0.05)
    assert tracker.by_step(names.MEM_ALLOCATED_GB) == {} and tracker.by_step(names.MEM_RESERVED_GB) == {}
