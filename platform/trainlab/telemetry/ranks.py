"""Per-rank telemetry: where each rank's step time goes, and what each rank holds in memory.

    timer = RankTimer(device)
    timer.watch(model)                      # gradient-ready times: DDP's all-reduce wait shows
    with timed_collectives(into=timer):     # optional (CPU): Python-level collectives, timed
        for step in ...:
            timer.start_step()
            with timer.compute():           # forward + backward (all micro-batches)
                ...
            with timer.compute():           # optimizer step
                ...
            timer.end_step()
            local = timer.window()          # at log steps: the mean of the steps since the last call
            metrics = gather_rank_metrics(local | memory_metrics(model, opt, device), device=device)

The clock (trainlab.clock) is chosen once from the device: on CPU the host clock
(time.perf_counter); on CUDA events recorded on the compute stream, which cost no host sync:
they are read (elapsed_time) only when a time is asked for (window(), last_step(),
step_compute_s), and steps whose events are already passed are folded in without waiting.

What is measured, per step on this rank:
- step_time_s: start_step -> end_step.
- compute_s: the time inside compute() blocks, less the part of them spent waiting for
  communication (comm_wait_s). busy_fraction = compute_s / step_time_s; the rest of the step
  is waiting: for slower ranks, pipeline bubbles, collectives outside compute (the loss
  all-reduce), data and bookkeeping.
- comm_wait_s (with watch(), or timed_collectives on CPU): inside compute blocks, (a) the time
  from the last gradient becoming ready to the end of the block that computed it, and (b) on
  CPU, blocking Python-level collectives. (a) is DDP's exposed all-reduce: backward does not
  return (CPU), or the compute stream does not go on (CUDA: DDP makes it wait for NCCL's stream
  at the end of backward), until every bucket is reduced, so a fast rank waits there for the
  slowest one, and the last bucket's transfer cannot hide behind compute. On CUDA the gradient
  hook records an event on the compute stream: it completes when that gradient's kernels are
  done, whatever NCCL's stream is doing. It works with any DDP communication hook (it never
  touches the hook, DDP takes only one) and with FSDP2, which runs the post-accumulate-grad
  hooks of its sharded parameters after each reduce-scatter. Work a hook does after the last
  gradient (PowerSGD's matmuls) counts as waiting. Not seen: collectives DDP makes in forward
  (its bucket rebuild on the second step; buffer broadcasts, which trainlab's apply_ddp turns
  off), and on CUDA FSDP2's all-gathers the compute stream waits for: a fast rank's wait there
  counts as compute.
- comm_s (with timed_collectives, CPU only): the time during which at least one collective
  called from Python was in flight (union of intervals: overlap with compute is not
  subtracted). DDP's own bucketed all-reduce runs in C++ (the Reducer) and is not seen here
  unless a Python communication hook issues it (parallel.comm_dtype fp16/bf16, PowerSGD);
  DTensor collectives (tensor parallel, the FSDP2 gradient norm) go through functional
  collectives and are not seen either. On CUDA timed_collectives counts calls without timing
  them (the host clock cannot place NCCL work), and no comm_s is reported.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import statistics
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from trainlab import names
from trainlab.clock import Mark, device_clock
from trainlab.parallel.fsdp import sharded_bytes
from trainlab.telemetry.peak_memory import peak_memory_gb

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single",
               "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "broadcast",
               "all_to_all_single")
"""torch.distributed functions timed_collectives wraps (those present in this torch)."""

Interval = tuple[float, float]


@dataclass
class _Block:
    """One compute span of a step, as clock marks (read later)."""

    start: Mark
    end: Mark
    wait_s: float = 0.0
    """Host clock: the waiting inside the block, measured when it closed."""
    wait_from: Mark | None = None
    """CUDA: the last gradient's event; from it to `end` the block waited for communication."""


@dataclass
class _Step:
    start: Mark
    end: Mark | None = None
    blocks: list[_Block] = field(default_factory=list)
    comm_s: float | None = None
    """Host clock with timed_collectives: time with a collective in flight."""


# ---------------------------------------------------------------------------------------
class RankTimer:
    """Step time, compute time and communication wait of this rank (module docstring)."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._cuda = self.device.type == "cuda"
        self._clock = device_clock(self.device)
        self._handles: list[Any] = []
        self._watching = False
        self._collectives = 0  # timed_collectives blocks feeding this timer
        self._step: _Step | None = None
        self._block_start: Mark | None = None
        self._last_grad: Mark | None = None  # latest gradient-ready mark in the open block
        self._blocking: list[Interval] = []  # blocking collectives of this step (host clock)
        self._inflight: list[Interval] = []  # every timed collective of this step (host clock)
        self._ended: list[_Step] = []  # ended steps not read yet (CUDA: events maybe pending)
        self._last: dict[str, float] = {}
        self._window: dict[str, float] = {}

    def now(self) -> float:
        """Host time (time.perf_counter), after synchronizing the device on CUDA: for callers
        that need a host time (the emulated slowdown); the timer itself does not call it."""
        if self._cuda:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    # -- instruments -------------------------------------------------------------------
    def watch(self, model: nn.Module) -> None:
        """Note when each gradient is ready (a post-accumulate-grad hook per parameter), so
        that the wait after the last one counts as communication, not compute."""
        self._watching = True
        for p in model.parameters():
            if p.requires_grad:
                self._handles.append(p.register_post_accumulate_grad_hook(self._grad_ready))

    def unwatch(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._watching = False

    def _grad_ready(self, _param: torch.Tensor) -> None:
        if self._block_start is not None:  # CUDA: one event per block, re-recorded
            self._last_grad = self._clock.mark(reuse=self._last_grad)

    def _record(self, start: float, end: float, *, blocking: bool) -> None:
        """A collective seen by timed_collectives (may run on a backend thread)."""
        if self._step is None:
            return
        self._inflight.append((start, end))
        if blocking:
            self._blocking.append((start, end))

    @property
    def _measures_wait(self) -> bool:
        return self._watching or self._collectives > 0

    # -- one step ----------------------------------------------------------------------
    def start_step(self) -> None:
        self._blocking, self._inflight = [], []
        self._step = _Step(start=self._clock.mark())

    @contextlib.contextmanager
    def compute(self) -> Iterator[None]:
        """Time a compute phase (forward+backward, optimizer step) of the current step."""
        assert self._step is not None, "RankTimer.compute() outside start_step/end_step"
        assert self._block_start is None, "RankTimer.compute() blocks do not nest"
        self._last_grad = None
        self._block_start = start = self._clock.mark()
        try:
            yield
        finally:
            end = self._clock.mark()
            if self._clock.on_host:
                waits = [(s, e) for s, e in self._blocking if e > start and s < end]
                if self._last_grad is not None:
                    waits.append((self._last_grad, end))
                block = _Block(start, end, wait_s=_union([(max(s, start), min(e, end)) for s, e in waits]))
            else:
                block = _Block(start, end, wait_from=self._last_grad)
            self._step.blocks.append(block)
            self._block_start = self._last_grad = None

    @property
    def step_compute_s(self) -> float:
        """Compute time of the current step so far (closed compute blocks only); on CUDA it
        waits for them (a host sync): ask only on the steps that need it."""
        assert self._step is not None, "RankTimer.step_compute_s outside start_step/end_step"
        return sum(self._block_times(b)[0] for b in self._step.blocks)

    @property
    def last_grad_ready(self) -> float | None:
        """When the latest gradient of the open compute block was ready (host clock); None
        before the first, when gradients are not watched, or on CUDA (events, not host
        times). What follows it in the block is communication: a fast rank waiting in DDP's
        all-reduce."""
        return self._last_grad if self._clock.on_host else None

    def add_compute(self, spans: list[tuple[Mark, Mark]]) -> None:
        """Credit compute measured elsewhere on this timer's kind of clock (trainlab.clock;
        a pipeline's per-chunk spans) to the current step."""
        assert self._step is not None, "RankTimer.add_compute() outside start_step/end_step"
        self._step.blocks.extend(_Block(s, e) for s, e in spans)

    def end_step(self) -> None:
        """Close the step; its times are read by last_step() / window() (no host sync here)."""
        step, self._step = self._step, None
        assert step is not None, "RankTimer.end_step() without start_step()"
        step.end = self._clock.mark()
        if self._collectives:
            start, end = step.start, step.end
            step.comm_s = _union([(max(s, start), min(e, end)) for s, e in self._inflight])
        self._ended.append(step)
        # fold the steps the device is already past: their events are read without waiting
        while self._ended and self._clock.done(self._ended[0].end):
            self._fold(self._ended.pop(0))

    def last_step(self) -> dict[str, float]:
        """The last ended step's times; keys are names.RANK_* (the same on every rank of a
        run). On CUDA it waits for that step's events (a host sync)."""
        self._drain()
        return dict(self._last)

    def window(self) -> dict[str, float]:
        """Mean of the steps since the last call (busy fraction: total compute / total time),
        then start a new window; {} if no step ended since. On CUDA it waits for the last
        step's events (a host sync): call it on log steps."""
        self._drain()
        w, self._window = self._window, {}
        n = w.pop("steps", 0.0)
        if not n:
            return {}
        out = {k: v / n for k, v in w.items()}
        wall = w[names.RANK_STEP_TIME]
        out[names.RANK_BUSY_FRACTION] = w[names.RANK_COMPUTE] / wall if wall > 0 else float("nan")
        return out

    # -- reading the clock -------------------------------------------------------------
    def _block_times(self, b: _Block) -> tuple[float, float]:
        """(compute, wait) seconds of one block."""
        wait = b.wait_s + (self._clock.seconds(b.wait_from, b.end) if b.wait_from is not None else 0.0)
        return self._clock.seconds(b.start, b.end) - wait, wait

    def _drain(self) -> None:
        while self._ended:
            self._fold(self._ended.pop(0))

    def _fold(self, step: _Step) -> None:
        assert step.end is not None
        wall = self._clock.seconds(step.start, step.end)
        compute = wait = 0.0
        for b in step.blocks:
            c, w = self._block_times(b)
            compute, wait = compute + c, wait + w
        out = {names.RANK_STEP_TIME: wall, names.RANK_COMPUTE: compute,
               names.RANK_BUSY_FRACTION: compute / wall if wall > 0 else float("nan")}
        if self._measures_wait:
            out[names.RANK_COMM_WAIT] = wait
        if step.comm_s is not None:
            out[names.RANK_COMM] = step.comm_s
        self._last = out
        for k, v in out.items():
            self._window[k] = self._window.get(k, 0.0) + v
        self._window["steps"] = self._window.get("steps", 0.0) + 1


def _union(intervals: list[Interval]) -> float:
    """Total length covered by the intervals (overlaps counted once; empty ones ignored)."""
    total, reach = 0.0, float("-inf")
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if e > reach:
            total += e - max(s, reach)
            reach = e
    return total


# ---------------------------------------------------------------------------------------
def gather_rank_metrics(local: dict[str, float], *, device: torch.device | str,
                        group: dist.ProcessGroup | None = None) -> dict[str, float] | None:
    """Every rank's `local` metrics, on rank 0 of `group` (default: the world): one all_gather
    of a small float64 tensor. A collective: every rank calls it at the same step with the
    same keys. Returns names.rank_metric(r, key) for each rank and key, plus aggregates over
    ranks for the keys present (names.STEP_TIME_MAX ... names.PEAK_MEM_GB_MAX); None on other
    ranks. Without a process group (one process) it returns rank 0's alone."""
    keys = sorted(local)
    values = [float(local[k]) for k in keys]
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        mine = torch.tensor([float(len(keys)), *values], dtype=torch.float64, device=torch.device(device))
        rows_t = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
        dist.all_gather(rows_t, mine, group=group)
        if dist.get_rank(group) != 0:
            return None
        rows = [r.tolist() for r in rows_t]
        if any(int(r[0]) != len(keys) for r in rows):
            raise ValueError(f"gather_rank_metrics: ranks passed different numbers of metrics "
                             f"({[int(r[0]) for r in rows]}); pass the same keys on every rank")
        rows = [r[1:] for r in rows]
    else:
        rows = [values]
    out = {names.rank_metric(r, k): row[i] for r, row in enumerate(rows) for i, k in enumerate(keys)}
    out.update(_aggregates({k: [row[i] for row in rows] for i, k in enumerate(keys)}))
    return out


def _aggregates(per_rank: dict[str, list[float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    if steps := per_rank.get(names.RANK_STEP_TIME):
        out[names.STEP_TIME_MAX] = max(steps)
        out[names.STEP_TIME_MIN] = min(steps)
    # synchronous ranks end their steps together (the fast ones wait in the collectives), so
    # step times hardly differ; the slow rank shows in its compute time
    if compute := per_rank.get(names.RANK_COMPUTE):
        median = statistics.median(compute)
        out[names.STRAGGLER_RATIO] = max(compute) / median if median > 0 else float("nan")
    if busy := per_rank.get(names.RANK_BUSY_FRACTION):
        out[names.BUSY_FRACTION_MIN] = min(busy)
    for key, agg in ((names.RANK_PARAM_GB, names.PARAM_GB), (names.RANK_GRAD_GB, names.GRAD_GB),
                     (names.RANK_OPTIM_STATE_GB, names.OPTIM_STATE_GB),
                     (names.RANK_PEAK_MEM_GB, names.PEAK_MEM_GB_MAX)):
        if key in per_rank:
            out[agg] = max(per_rank[key])
    return out


# ---------------------------------------------------------------------------------------
def memory_metrics(model: nn.Module, optimizer: torch.optim.Optimizer | None,
                   device: torch.device | str) -> dict[str, float]:
    """This rank's GB (1e9 bytes) of parameters, gradients and optimizer state (local shards
    of DTensors, this rank's ZeroRedundancyOptimizer partition) and its peak memory.
    Gradients count only while they exist: call between backward and the next zero_grad."""
    b = sharded_bytes(model, optimizer)
    return {names.RANK_PARAM_GB: b["params"] / 1e9, names.RANK_GRAD_GB: b["grads"] / 1e9,
            names.RANK_OPTIM_STATE_GB: b["optim_state"] / 1e9,
            names.RANK_PEAK_MEM_GB: peak_memory_gb(torch.device(device))}


# ---------------------------------------------------------------------------------------
@contextlib.contextmanager
def timed_collectives(*, into: RankTimer | None = None) -> Iterator[dict[str, float]]:
    """Time the torch.distributed collectives (COLLECTIVES) called from Python in the block.

    Yields a dict filled in on exit: comm_s (time with at least one collective in flight),
    comm_blocking_s (time the caller was blocked in synchronous calls), comm_calls,
    comm_untimed_calls (calls on CUDA tensors: NCCL runs on its own stream, the host clock
    sees only the launch). An async call (async_op=True) is timed from launch to the
    completion of its Work's future. With `into`, each timed call also goes to that RankTimer:
    into its step's comm_s, and, when blocking inside a compute block, out of compute_s.

    It wraps the functions as attributes of the torch.distributed module (what
    `dist.all_reduce(...)` resolves to, FSDP2 and ZeroRedundancyOptimizer included) for the
    duration of the block; DDP's C++ all-reduce and functional collectives are not seen."""
    intervals: list[Interval] = []
    blocking: list[Interval] = []
    counts = {"calls": 0, "untimed": 0}

    def record(start: float, end: float, is_blocking: bool) -> None:
        intervals.append((start, end))
        if is_blocking:
            blocking.append((start, end))
        if into is not None:
            into._record(start, end, blocking=is_blocking)

    def wrap(fn: Callable) -> Callable:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            counts["calls"] += 1
            if _on_cuda(args, kwargs):
                counts["untimed"] += 1
                return fn(*args, **kwargs)
            start = time.perf_counter()
            work = fn(*args, **kwargs)
            if not signature.bind(*args, **kwargs).arguments.get("async_op", False):
                record(start, time.perf_counter(), True)
            elif work is not None:  # None: this rank is not in the group
                work.get_future().then(lambda _fut: record(start, time.perf_counter(), False))
            return work
        return timed

    if into is not None and into._cuda:
        warnings.warn("timed_collectives(into=...): a CUDA RankTimer gets no collective times "
                      "(NCCL runs on its own stream); its steps report no comm_s", stacklevel=3)
        into = None
    originals = {n: getattr(dist, n) for n in COLLECTIVES if hasattr(dist, n)}
    result: dict[str, float] = {}
    if into is not None:
        into._collectives += 1
    try:
        for n, fn in originals.items():
            setattr(dist, n, wrap(fn))
        yield result
    finally:
        for n, fn in originals.items():
            setattr(dist, n, fn)
        if into is not None:
            into._collectives -= 1
        result.update(comm_s=_union(intervals), comm_blocking_s=_union(blocking),
                      comm_calls=float(counts["calls"]), comm_untimed_calls=float(counts["untimed"]))


def _on_cuda(args: tuple, kwargs: dict) -> bool:
    for a in (*args, *kwargs.values()):
        if isinstance(a, (list, tuple)) and a:
            a = a[0]
        if isinstance(a, torch.Tensor):
            return a.is_cuda
    return False


__all__ = ["COLLECTIVES", "RankTimer", "gather_rank_metrics", "memory_metrics", "timed_collectives"]
