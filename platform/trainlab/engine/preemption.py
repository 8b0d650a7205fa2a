"""A signal of events.STOP_SIGNALS (SIGTERM: preemption, `kill`, a scheduler's notice; SIGINT:
Ctrl-C; SIGHUP: the terminal closed) as a request to stop after a checkpoint; the same signal
again stops at once (its handler from before runs).

The handler only sets a flag; at the end of each optimizer step the ranks agree (one tiny
all-reduce) whether any of them was asked, so they all save the same step and stop together.
A signal handler can only be installed from a process's main thread: under torchrun it is;
where it is not (Ray Train runs the loop in a thread, and Ray restarts lost workers itself)
nothing is installed and no collective is spent. The handler lives from the trainer's
construction to the end of its train(): after that each signal does what it did before (stops a
bench between its loops, ends the process), instead of setting a flag nobody reads.

A launcher whose workers cannot take signals (Ray) asks from outside instead: it calls
listen_outside() in each worker before the trainer is built, which arms the vote there too,
and stop_from_outside() (from any thread) when the driver was interrupted.

The request says why (the vote carries it): PREEMPT (a stop signal, the driver interrupted) stops
after a checkpoint, to resume; PRUNE (the sweep's pruner gave the trial up) stops at once,
nothing to resume. Asked both ways, PREEMPT wins: the trial must be resumable.
"""

from __future__ import annotations

import signal
import threading

import torch
import torch.distributed as dist

from trainlab.events import PREEMPT, PRUNE, STOP_SIGNALS, stronger_stop

_KINDS = ("", PRUNE, PREEMPT)
"""Why the ranks stop, weakest first: the vote's all-reduce (MAX) of the index picks the strongest."""

_outside = threading.Event()
"""Set by stop_from_outside(): every armed Preemption of this process votes to stop."""
_outside_kind = PREEMPT
"""Why _outside was set."""
_listening = False


def listen_outside() -> None:
    """Arm every Preemption made after this in this process, on any thread (every rank of a
    gang calls it, so all take part in the per-step vote), and clear an earlier request."""
    global _listening
    _listening = True
    _outside.clear()


def stop_from_outside(kind: str = PREEMPT) -> None:
    """Ask this process's trainer to stop after its current step: PREEMPT with a checkpoint
    (status preempted), PRUNE without (status pruned); a PRUNE never weakens a PREEMPT."""
    global _outside_kind
    assert kind in _KINDS[1:], kind
    _outside_kind = stronger_stop(_outside_kind if _outside.is_set() else "", kind)
    _outside.set()


def outside_state() -> tuple[bool, bool]:
    """(armed by listen_outside, a stop asked from outside and not yet cleared), for a warm gang
    to put back after each trial (engine.isolation): a stop meant for one trial must not stop
    the next."""
    return _listening, _outside.is_set()


def restore_outside(state: tuple[bool, bool]) -> None:
    """Back to an `outside_state()`."""
    global _listening
    _listening = state[0]
    if state[1]:
        _outside.set()
    else:
        _outside.clear()


class Preemption:
    def __init__(self) -> None:
        self._asked = False
        self.signum: int | None = None
        """The first signal of STOP_SIGNALS that asked (None: none did)."""
        self._group: dist.ProcessGroup | None = None
        self._handles_signal = threading.current_thread() is threading.main_thread()
        self.armed = self._handles_signal or _listening
        self._previous: dict[int, object] = {}
        if self._handles_signal:
            for s in STOP_SIGNALS:
                if signal.getsignal(s) != signal.SIG_IGN:  # ignored (nohup, a background job) stays so
                    self._previous[s] = signal.signal(s, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        if self.signum is None:
            self._asked, self.signum = True, signum
        elif signum == self.signum:  # the same again: stop at once, as without the trainer
            self._give_back()
            signal.raise_signal(signum)
        # another one (torchrun's agent passes the terminal's SIGHUP or Ctrl-C on as SIGTERM):
        # already asked, the checkpoint is on its way

    def _give_back(self) -> None:
        for s, previous in self._previous.items():
            # None: the previous handler was not set from Python; the default is the closest
            signal.signal(s, signal.SIG_DFL if previous is None else previous)
        self._previous.clear()
        self._handles_signal = False

    def requested(self) -> str:
        """Why the ranks stop after this step: PREEMPT (any rank got a stop signal or a PREEMPT from
        outside), PRUNE, or "" to go on (a collective when armed: every rank calls it per step)."""
        if not self.armed:
            return ""
        asked = PREEMPT if self._asked else _outside_kind if _outside.is_set() else ""
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return asked
        # a host flag on a gloo group: reading a flag all-reduced by NCCL would wait for the
        # GPU's whole queue every step (the first call makes the group, on every rank at once)
        if self._group is None and "gloo" not in dist.get_backend():
            self._group = dist.new_group(backend="gloo")
        flag = torch.tensor([float(_KINDS.index(asked))])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
        return _KINDS[int(flag.item())]

    def close(self) -> None:
        """Give each signal back to whatever handled it before."""
        if self._handles_signal:
            self._give_back()
        self.armed = False
