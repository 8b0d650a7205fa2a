"""The clock per-rank timing reads: host time on CPU, CUDA events on a GPU; chosen once per device.

    clock = device_clock(device)
    start = clock.mark()          # CPU: time.perf_counter(); CUDA: an event recorded on the current stream
    ...                           # work launched on that stream
    end = clock.mark()
    seconds = clock.seconds(start, end)   # CUDA: waits for `end` (a host sync): read it on log steps

Why two: on CPU, work runs on the host thread (gloo collectives too), so host time splits
compute from waiting exactly. On a GPU the host only queues kernels; timing there with the host
clock needs torch.cuda.synchronize at every boundary, which stalls the queue and, worse, makes
a compute block end only when every stream is done, NCCL's all-reduce included. An event
recorded on the compute stream completes when that stream reaches it: the kernels queued before
it are done, and a collective on NCCL's stream counts only where the compute stream waits for it.
"""

from __future__ import annotations

import time
from typing import Union

import torch

Mark = Union[float, "torch.cuda.Event"]
"""A point in time on a clock: host seconds, or a recorded CUDA event."""


class HostClock:
    """time.perf_counter: exact on CPU, where the host thread does the work."""

    on_host = True

    def mark(self, reuse: Mark | None = None) -> float:
        """Now. `reuse` is for CudaClock's sake (re-record an event) and ignored here."""
        return time.perf_counter()

    def done(self, mark: Mark) -> bool:
        """Whether `mark` can be read without waiting (always, on the host)."""
        return True

    def seconds(self, start: Mark, end: Mark) -> float:
        return end - start


class CudaClock:
    """CUDA events on the current stream of `device`: no host sync until a time is read."""

    on_host = False

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def mark(self, reuse: Mark | None = None) -> torch.cuda.Event:
        """An event recorded on the current stream now (of this thread: the autograd engine
        runs backward hooks on the forward's stream). `reuse`: re-record that event instead
        of making one (its later recording replaces the earlier one)."""
        event = reuse if reuse is not None else torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def done(self, mark: Mark) -> bool:
        """Whether the stream has passed `mark` (a poll, not a sync)."""
        return mark.query()

    def seconds(self, start: Mark, end: Mark) -> float:
        """Time between two events; waits for both (a no-op once the stream is past them)."""
        start.synchronize()
        end.synchronize()
        return start.elapsed_time(end) / 1e3


Clock = Union[HostClock, CudaClock]


def device_clock(device: torch.device | str) -> Clock:
    """The clock for `device`: CUDA events on a GPU, the host clock elsewhere."""
    device = torch.device(device)
    return CudaClock(device) if device.type == "cuda" else HostClock()


def total_seconds(clock: Clock, spans: list[tuple[Mark, Mark]]) -> float:
    """Sum of the (start, end) spans' lengths (reads them: a host sync on CUDA)."""
    return sum(clock.seconds(s, e) for s, e in spans)


__all__ = ["Clock", "CudaClock", "HostClock", "Mark", "device_clock", "total_seconds"]
