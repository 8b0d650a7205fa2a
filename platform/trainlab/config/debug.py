"""The `debug` section: instruments for tests and benchmarks, kept out of the user's settings.

Faults to inject (a NaN in a module's output, a signal to a worker) and devices to emulate
(slower ranks, logical GPUs): none changes what a trial is for, and each default does
nothing. Overrides: ``debug.inject_nan=layers.1.feed_forward@5``,
``debug.inject_fault=sigkill@5:1``, ``debug.slowdown=[1,2]``, ``debug.logical_gpus=true``.

The config hash (config.convert) keeps what it covered before the knobs moved here:
debug.inject_nan, debug.slowdown and debug.logical_gpus are hashed (a poisoned, slowed or
placement-rehearsal run is not the trial it imitates, and a sweep rerun must not take one for
the other), debug.inject_fault is not (a rerun without the fault must resume the checkpoint the
faulted run left).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainlab.config.bounds import bounded, check_fields


@dataclass
class DebugConfig:
    """Test and benchmark instruments (module docstring); every default does nothing."""

    inject_nan: str = ""
    """'MODULE@STEP' makes the output of the module named MODULE (e.g. layers.1.feed_forward)
    NaN on optimizer step STEP: proves that the stability telemetry names the tensor that went
    non-finite first. Only on a trial's first attempt: a rollback's retry runs without it."""
    inject_fault: str = ""
    """'SIGNAL@STEP[:RANK]' sends SIGTERM or SIGKILL to the process of global rank RANK
    (default 0) after optimizer step STEP, e.g. sigkill@5:1, to test recovery. Only on a
    trial's first attempt: a trial restarted from a checkpoint is not hit again."""
    slowdown: list[float] = bounded(default_factory=list, ge=1,
                                    why="how many times slower a worker runs; 1 = full speed")
    """Emulate slower devices: one factor >= 1 per worker (global rank); a rank with factor f
    spends f x its measured forward+backward time per micro-batch, the extra (f - 1) asleep
    before its gradients are synchronized, counted as compute (engine.slowdown). Empty = every
    worker at its own speed."""
    logical_gpus: bool = False
    """Each worker reserves one of the cluster's GPUs (and is placed by its type) but computes
    on CPU: for rehearsing placement on a cluster of logical GPUs (`ray start --num-gpus N
    --resources '{"accelerator_type:H100": 1}'`) on machines without GPUs. Needs cluster.device
    cpu or auto."""

    def __post_init__(self) -> None:
        check_fields(self, section="debug")
        if self.inject_fault and self.fault_injection is None:
            raise ValueError(f"debug.inject_fault={self.inject_fault!r} is not SIGNAL@STEP[:RANK] with SIGNAL "
                             "sigterm or sigkill; write e.g. debug.inject_fault=sigkill@5:1")
        if self.inject_nan and self.nan_injection is None:
            raise ValueError(f"debug.inject_nan={self.inject_nan!r} is not MODULE@STEP; write e.g. "
                             "debug.inject_nan=layers.1.feed_forward@5")

    @property
    def fault_injection(self) -> tuple[str, int, int] | None:
        """inject_fault as (signal name, optimizer step, global rank); None when unset or malformed."""
        m = re.fullmatch(r"(sigterm|sigkill)@(\d+)(?::(\d+))?", self.inject_fault.strip().lower())
        if m is None or int(m.group(2)) < 1:
            return None
        return m.group(1), int(m.group(2)), int(m.group(3) or 0)

    @property
    def nan_injection(self) -> tuple[str, int] | None:
        """inject_nan as (module name, optimizer step); None when unset or malformed."""
        module, _, step = self.inject_nan.rpartition("@")
        if not module or not step.isdigit() or int(step) < 1:
            return None
        return module, int(step)
