"""Per-rank timing on a GPU: compute time measured by CUDA events excludes waiting for another
stream (NCCL's all-reduce), pipeline chunks are timed without syncs, and a training step
between log steps syncs the host once."""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator
from typing import Callable

import pytest
import torch
from torch import nn

from host_syncs import HostSyncs
from trainlab import names
from trainlab.config import compose_run_config
from trainlab.telemetry.ranks import RankTimer

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

WAIT_S = 0.05  # the injected all-reduce wait per step
STEPS = 5


def _sleep_cycles(seconds: float) -> int:
    """How many torch.cuda._sleep cycles last `seconds` on this GPU (measured, clocks vary)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    probe = 20_000_000
    start.record()
    torch.cuda._sleep(probe)
    end.record()
    end.synchronize()
    return int(seconds * probe / (start.elapsed_time(end) / 1e3))


def _fwd_bwd(model: nn.Module, x: torch.Tensor) -> None:
    model(x).square().mean().backward()


def test_event_timer_counts_a_wait_for_the_comm_stream_as_waiting_not_compute():
    """DDP on NCCL as the compute stream sees it: the all-reduce runs on NCCL's stream once the
    gradients are ready, and at the end of backward the compute stream waits for it (a slow peer
    makes that wait long). Host-clock timing (synchronize, then perf_counter) puts the wait in
    compute; the events of the compute stream and the last gradient's hook put it in
    comm_wait_s. The timer makes no host sync until its times are read."""
    device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2048, 2048), nn.GELU(), nn.Linear(2048, 2048)).to(device)
    x = torch.randn(2048, 2048, device=device)
    comm = torch.cuda.Stream(device)
    cycles = _sleep_cycles(WAIT_S)
    # the compute alone, timed by events, as the reference
    _fwd_bwd(model, x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(STEPS):
        _fwd_bwd(model, x)
    end.record()
    end.synchronize()
    compute_ref = start.elapsed_time(end) / 1e3 / STEPS

    timer = RankTimer(device)
    timer.watch(model)
    with HostSyncs() as syncs:
        for _ in range(STEPS):
            timer.start_step()
            with timer.compute():
                _fwd_bwd(model, x)
                compute_stream = torch.cuda.current_stream(device)
                comm.wait_stream(compute_stream)  # the "all-reduce" starts after the gradients
                with torch.cuda.stream(comm):
                    torch.cuda._sleep(cycles)  # ... and lasts WAIT_S: a slow peer
                compute_stream.wait_stream(comm)  # DDP's end of backward: compute waits for it
            timer.end_step()
        synced = syncs.count
    w = timer.window()
    assert synced == 0, syncs.sites
    assert w[names.RANK_COMM_WAIT] == pytest.approx(WAIT_S, rel=0.25), w
    assert w[names.RANK_COMPUTE] == pytest.approx(compute_ref, rel=0.5, abs=2e-3), (w, compute_ref)
    assert w[names.RANK_COMPUTE] < 0.5 * WAIT_S < w[names.RANK_STEP_TIME], w
    assert w[names.RANK_BUSY_FRACTION] == pytest.approx(w[names.RANK_COMPUTE] / w[names.RANK_STEP_TIME])


def test_pipeline_chunks_are_timed_by_events_without_a_sync():
    """A pipeline stage's forward/backward chunks are timed on the compute stream (before:
    torch.cuda.synchronize before and after every chunk): the spans read back later hold the
    chunks' GPU time."""
    from trainlab.clock import total_seconds
    from trainlab.parallel.pp import _Clock

    cycles = _sleep_cycles(WAIT_S)
    busy = _Clock(torch.device("cuda", torch.cuda.current_device()))
    chunk = busy.timed(lambda: torch.cuda._sleep(cycles))
    with HostSyncs() as syncs:
        for _ in range(3):
            chunk()
        synced = syncs.count
    assert synced == 0 and len(busy.spans) == 3, syncs.sites
    assert total_seconds(busy.clock, busy.spans) == pytest.approx(3 * WAIT_S, rel=0.25)


@contextlib.contextmanager
def _device_syncs() -> Iterator[Callable[[], list[str]]]:
    """Every sync with the GPU in the block, torch's own included: what
    torch.cuda.set_sync_debug_mode warns about (reads to the host, blocking copies, stream
    syncs), plus torch.cuda.synchronize and Event.synchronize on a pending event, which it does
    not see. Yields a function giving the syncs so far."""
    explicit: list[str] = []
    sync, event_sync = torch.cuda.synchronize, torch.cuda.Event.synchronize

    def counted_sync(*args, **kwargs):
        explicit.append("torch.cuda.synchronize")
        return sync(*args, **kwargs)

    def counted_event_sync(event):
        if not event.query():
            explicit.append("Event.synchronize")
        return event_sync(event)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        torch.cuda.synchronize, torch.cuda.Event.synchronize = counted_sync, counted_event_sync
        try:
            yield lambda: explicit + [str(w.message)[:120] for w in caught if "synchroniz" in str(w.message)]
        finally:
            torch.cuda.synchronize, torch.cuda.Event.synchronize = sync, event_sync
            torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_gpu_step_between_log_steps_syncs_the_host_once(precision):
    """The real trainer on one GPU, 2 micro-batches per step, clipping on: every sync of each
    loop iteration, torch's included. The one left is the combined read of loss and gradient
    norm before the update (before: the timer's 6 torch.cuda.synchronize calls, float(loss)
    and float(norm): 8 in one process, 12 with a process group)."""
    if precision == "bf16" and torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("bf16 needs SM 8.0+")
    from trainlab.distributed import setup_distributed
    from trainlab.engine.run import build_trainer
    from trainlab.plan.trial_plan import Where, plan_trial

    run = compose_run_config(["model=tiny", "data=markov", f"precision={precision}", "cluster.device=cuda",
                              "cluster.num_workers=1", "tracking=none", "train.seq_len=64",
                              "train.global_batch_size=8", "train.micro_batch_size=4",
                              f"train.max_steps={STEPS}", f"train.log_every={STEPS}",
                              "train.numerics_every=0", "train.eval_every=0", "optim.grad_clip=0.5"])
    trainer = build_trainer(plan_trial(run, Where(device="cuda")), setup_distributed("cuda"))
    counts: list[int] = []
    with _device_syncs() as syncs:
        trainer.add_hook(lambda *_: counts.append(len(syncs())))
        trainer.train()
        every = syncs()
    per_step = [b - a for a, b in zip(counts, counts[1:])]  # iterations 2 .. STEPS
    assert per_step[:-1] == [1] * (STEPS - 2), (per_step, every)
    assert len(trainer.losses) == STEPS and all(math.isfinite(x) for x in trainer.losses)
