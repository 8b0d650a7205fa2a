"""The estimate's device catalog against the GPU in this machine: the same peak row as MFU, its memory."""

from __future__ import annotations

import pytest
import torch

from trainlab.estimate.hardware import hardware, known_types
from trainlab.telemetry.peak_flops import gpu_peak

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_the_catalog_entry_of_this_gpu_reads_mfus_peak_and_its_memory():
    name = torch.cuda.get_device_name()
    peak = gpu_peak(name, "bf16")
    if peak.flops_per_s is None:
        pytest.skip(f"{name} is not in the MFU peak table")
    label = peak.source.split(":")[1]
    types = [t for t in known_types() if t != "cpu" and hardware(t).label == label]
    assert types, f"no Ray type of the estimate's catalog reads the {label} row"
    total_gb = torch.cuda.get_device_properties(0).total_memory / 1e9
    # the Ray type of this part (several Ray names may share a row: A100 40 and 80 GB)
    best = min(types, key=lambda t: abs(hardware(t).memory_gb - total_gb))
    assert hardware(best).peak_tflops("bf16") * 1e12 == peak.flops_per_s
    assert hardware(best).memory_gb == pytest.approx(total_gb, rel=0.1)  # 80 GB H100: 85.0e9 bytes reported
