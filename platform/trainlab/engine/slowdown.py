"""debug.slowdown: make this rank an emulated slower device (tests and benchmarks on CPU).

A rank with factor f spends f times its measured forward+backward compute on each micro-batch:
the extra (f - 1) x is slept. Where the sleep goes matters. A slow device is slow *before*
its gradients are ready, so the fast ranks wait for it inside the gradient all-reduce; a
sleep after backward would come after the all-reduce, and would land in the next collective
while the slow rank computes nothing (uneven shares could then never catch up). So the sleep
runs at the start of each micro-batch, sized from this rank's measured compute per sequence:
the lower quartile of its last 16 micro-batches. Other work on a shared machine only ever adds
to a measure, and the device being emulated would not feel it: a median stretched a burst of it
(another process starting for a second or two spans several micro-batches) f-fold into the
sleeps after it, and the fast ranks then waited for a slow rank that balancing had already
evened out. The very first micro-batch, with nothing measured yet, sleeps after itself. The
measure ends when the micro-batch's last gradient is ready (RankTimer watches), so the wait
in DDP's all-reduce is not taken for compute. The sleep sits inside the trainer's compute
block: it counts as compute, not waiting, as a slower device's time would.
It is an emulation for CPU: on CUDA it reads the host clock after synchronizing the device
(RankTimer.now), twice per micro-batch, and the measure includes DDP's all-reduce wait.
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Iterator

from trainlab.telemetry.ranks import RankTimer

RECENT = 16
"""Micro-batches whose measured compute sizes the next sleep."""


class Slowdown:
    """Sleep (factor - 1) x the measured compute of each micro-batch (module docstring)."""

    def __init__(self, factor: float, *, timer: RankTimer) -> None:
        if not factor >= 1.0:
            raise ValueError(f"debug.slowdown factor {factor!r} must be >= 1 (1 = full speed)")
        self.factor = factor
        self.timer = timer
        self._recent: collections.deque[float] = collections.deque(maxlen=RECENT)  # seconds per sequence
        self.slept_s = 0.0
        """Total emulated extra time so far (for tests and benches)."""

    @contextlib.contextmanager
    def micro_batch(self, sequences: int) -> Iterator[None]:
        """Wrap one micro-batch's forward+backward of `sequences` sequences."""
        extra = self.factor - 1.0
        first = not self._recent
        if not first:
            self._sleep(extra * sequences * self.per_sequence_s())
        start = self.timer.now()
        yield
        ready = self.timer.last_grad_ready
        end = ready if ready is not None and ready > start else self.timer.now()
        self._recent.append((end - start) / max(1, sequences))
        if first:
            self._sleep(extra * (end - start))

    def per_sequence_s(self) -> float:
        """This rank's compute per sequence as the sleeps read it: the lower quartile of the
        recent micro-batches (module docstring)."""
        return sorted(self._recent)[len(self._recent) // 4]

    def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)
            self.slept_s += seconds


__all__ = ["Slowdown"]
