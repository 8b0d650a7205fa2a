"""Telemetry: throughput and MFU, memory, numerical stability, numerics of low-precision casts."""

from trainlab.telemetry.nonfinite import NonFiniteMonitor, inject_nan
from trainlab.telemetry.numerics import NumericsProbe
from trainlab.telemetry.peak_flops import Peak, device_peak
from trainlab.telemetry.peak_memory import peak_memory_gb
from trainlab.telemetry.stability import GradNormWindow, SpikeDetector, StabilityCounters
from trainlab.telemetry.throughput import Throughput
from trainlab.telemetry.update_ratio import UpdateMeter, update_to_weight

__all__ = ["GradNormWindow", "NonFiniteMonitor", "NumericsProbe", "Peak", "SpikeDetector",
           "StabilityCounters", "Throughput", "UpdateMeter", "device_peak", "inject_nan", "peak_memory_gb",
           "update_to_weight"]
