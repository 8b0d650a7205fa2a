"""Tokens/s, model TFLOP/s and MFU of the steps between two calls."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from trainlab.telemetry.peak_flops import Peak


@dataclass
class Throughput:
    """Measures wall time per optimizer step; FLOPs from the model's formula (not a profiler)."""

    tokens_per_step: int
    """Global tokens per optimizer step (all ranks)."""
    flops_per_token: float
    """Training FLOPs per token (forward + backward) from the model formula."""
    peak: Peak
    """Peak FLOP/s of ONE device; MFU divides by world_size x this."""
    world_size: int
    fp8_peak: Peak | None = None
    """fp8 modes: the device's FP8 peak, for a second MFU named as such (None: not fp8)."""
    _t_last: float = field(default_factory=time.perf_counter)

    def restart(self) -> None:
        self._t_last = time.perf_counter()

    def step(self) -> dict[str, float]:
        now = time.perf_counter()
        dt = max(now - self._t_last, 1e-9)
        self._t_last = now
        tps = self.tokens_per_step / dt
        model_flops = tps * self.flops_per_token
        out = {"step_time_s": dt, "tokens_per_s": tps, "model_tflops": model_flops / 1e12}
        if self.peak.flops_per_s:
            out["mfu"] = model_flops / (self.peak.flops_per_s * self.world_size)
        if self.fp8_peak is not None and self.fp8_peak.flops_per_s:
            out["mfu_fp8"] = model_flops / (self.fp8_peak.flops_per_s * self.world_size)
        return out
