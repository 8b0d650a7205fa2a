"""Which device a trial computes on: cluster.device resolved by one function, everywhere.

The Ray driver (against the joined cluster's resources, or this machine for a local one),
a torchrun process and the benchmarks (against this machine) all call it; it imports nothing,
so a command that stops before torch, Hydra or Ray are loaded can call it too.
"""

from __future__ import annotations


def resolve_device(want: str, *, gpus: bool, logical_gpus: bool = False) -> str:
    """cluster.device as the trial computes: `auto` is cuda where the trial runs has GPUs (this
    machine for a local cluster or torchrun, the joined cluster's resources otherwise), else
    cpu; with debug.logical_gpus the workers hold GPUs but compute on cpu."""
    if want != "auto":
        return want
    return "cuda" if gpus and not logical_gpus else "cpu"
