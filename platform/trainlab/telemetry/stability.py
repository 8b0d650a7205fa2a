"""Numerical stability counters: non-finite steps, skipped updates, loss spikes."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class SpikeDetector:
    """Counts losses above `factor` x the running mean of earlier losses.

    The mean is an exponential moving average (decay 0.9: half-life ~7 steps, so it follows a
    falling loss closely) and only judges after `warmup` steps, so the steep start of training is not a spike. Spikes and
    non-finite losses do not update the mean.
    """

    factor: float = 3.0
    decay: float = 0.9
    warmup: int = 10
    mean: float | None = None
    seen: int = 0
    spikes: int = 0

    def update(self, loss: float) -> bool:
        if not math.isfinite(loss):
            return False
        is_spike = self.seen >= self.warmup and self.mean is not None and loss > self.factor * self.mean
        if is_spike:
            self.spikes += 1
            return True
        self.mean = loss if self.mean is None else self.decay * self.mean + (1 - self.decay) * loss
        self.seen += 1
        return False


@dataclass
class StabilityCounters:
    """Running totals logged as train/skipped_steps, train/nonfinite_steps, train/loss_spikes."""

    skipped_steps: int = 0
    nonfinite_steps: int = 0
    first_nonfinite_step: int | None = None
    first_nonfinite: str = ""

    def record(self, *, step: int, loss: float, grad_norm: float, applied: bool) -> None:
        if not applied:
            self.skipped_steps += 1
        bad = [name for name, v in (("loss", loss), ("grad_norm", grad_norm)) if not math.isfinite(v)]
        if bad:
            self.nonfinite_steps += 1
            if self.first_nonfinite_step is None:
                self.first_nonfinite_step = step
                self.first_nonfinite = bad[0]
