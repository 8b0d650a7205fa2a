"""Telemetry: throughput and MFU, memory, numerical stability."""

from trainlab.telemetry.memory import peak_memory_gb
from trainlab.telemetry.peak_flops import Peak, device_peak
from trainlab.telemetry.stability import SpikeDetector, StabilityCounters
from trainlab.telemetry.throughput import Throughput

__all__ = ["Peak", "SpikeDetector", "StabilityCounters", "Throughput", "device_peak", "peak_memory_gb"]
