"""fp8_delayed on a CUDA GPU: a training step copies nothing from the host (its constants live
on the device, made once), counted by the CUDA profiler's memcpy records."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from trainlab.precision.fp8_delayed import DelayedScalingFp8Linear, update_delayed_scales

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _host_to_device_copies(fn) -> list[str]:
    """The host-to-device memcpys the GPU ran while `fn` ran (CUDA profiler activity)."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if "HtoD" in e.name]


@pytest.mark.parametrize("emulate", [True, False], ids=["emulated", "fp8_tensor_cores"])
def test_fp8_delayed_step_copies_nothing_from_the_host(emulate):
    if not emulate and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("torch._scaled_mm needs FP8 tensor cores (SM 8.9+)")
    if torch.cuda.get_device_capability() < (8, 0):  # the steps run under bf16 autocast
        pytest.skip("bf16 needs SM 8.0+")
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = nn.Sequential(*(DelayedScalingFp8Linear(256, 256, emulate=emulate, device=device)
                            for _ in range(4)))
    x = torch.randn(64, 256, device=device, requires_grad=True)

    def steps(n: int = 3) -> None:
        for _ in range(n):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = model(x)
            y.float().sum().backward()
            update_delayed_scales(model)

    steps(1)  # the first step makes the constants
    # the count works: a tensor built on the host and moved is one copy
    assert _host_to_device_copies(lambda: torch.tensor([1.0, 2.0]).to(device))
    assert _host_to_device_copies(steps) == []
    assert all(s != 1.0 for layer in model for s in layer.current_scales().values())
