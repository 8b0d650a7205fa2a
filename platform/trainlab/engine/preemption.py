"""SIGTERM as a request to stop after a checkpoint (preemption, `kill`, a scheduler's notice).

The handler only sets a flag; at the end of each optimizer step the ranks agree (one tiny
all-reduce) whether any of them was asked, so they all save the same step and stop together.
A signal handler can only be installed from a process's main thread: under torchrun it is;
where it is not (Ray Train runs the loop in a thread, and Ray restarts lost workers itself)
nothing is installed and no collective is spent. The handler lives from the trainer's
construction to the end of its train(): after that SIGTERM does what it did before (stops a
bench between its loops, ends the process), instead of setting a flag nobody reads.
"""

from __future__ import annotations

import signal
import threading

import torch
import torch.distributed as dist


class Preemption:
    def __init__(self) -> None:
        self._asked = False
        self._group: dist.ProcessGroup | None = None
        self.armed = threading.current_thread() is threading.main_thread()
        if self.armed:
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame) -> None:
        self._asked = True

    def requested(self) -> bool:
        """Whether any rank got SIGTERM (a collective when armed: every rank calls it per step)."""
        if not self.armed:
            return False
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return self._asked
        # a host flag on a gloo group: reading a flag all-reduced by NCCL would wait for the
        # GPU's whole queue every step (the first call makes the group, on every rank at once)
        if self._group is None and "gloo" not in dist.get_backend():
            self._group = dist.new_group(backend="gloo")
        flag = torch.tensor([float(self._asked)])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
        return bool(flag.item())

    def close(self) -> None:
        """Give SIGTERM back to whatever handled it before."""
        if self.armed:
            # None: the previous handler was not set from Python; the default is the closest
            signal.signal(signal.SIGTERM, signal.SIG_DFL if self._previous is None else self._previous)
            self.armed = False
