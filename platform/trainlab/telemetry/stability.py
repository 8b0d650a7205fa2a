"""Numerical stability: non-finite steps, skipped updates, loss spikes, grad-norm
percentiles (the update-to-weight ratio: telemetry.update_ratio)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from trainlab import names


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

    def record(self, *, step: int, loss: float, grad_norm: float, applied: bool,
               origin: str = "") -> None:
        """`origin`: the tensor that went non-finite first, if the caller located it
        (telemetry.nonfinite); else the first non-finite of loss and grad_norm is named."""
        if not applied:
            self.skipped_steps += 1
        bad = [name for name, v in (("loss", loss), ("grad_norm", grad_norm)) if not math.isfinite(v)]
        if bad:
            self.nonfinite_steps += 1
            if self.first_nonfinite_step is None:
                self.first_nonfinite_step = step
                self.first_nonfinite = origin or bad[0]


@dataclass
class GradNormWindow:
    """Pre-clip gradient norms since the last sample; percentiles show a widening tail
    (rare huge gradients) long before the mean or the loss move."""

    norms: list[float] = field(default_factory=list)

    def add(self, norm: float) -> None:
        if math.isfinite(norm):
            self.norms.append(norm)

    def percentiles(self) -> dict[str, float]:
        """p50/p90/p99 (nearest rank) of the window, then start a new window."""
        if not self.norms:
            return {}
        s = sorted(self.norms)
        self.norms.clear()

        def rank(q: float) -> float:
            return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]

        return {names.GRAD_NORM_P50: rank(0.50), names.GRAD_NORM_P90: rank(0.90),
                names.GRAD_NORM_P99: rank(0.99)}
