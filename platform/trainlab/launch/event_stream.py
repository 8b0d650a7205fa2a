"""Progress events from a trial's rank 0 to its driver: a Ray actor whose calls never fail.

`ray.util.queue.Queue.get(timeout=...)` raises `Empty` inside the actor when nothing came in
time, and Ray records every such call as a FAILED task: a healthy trial polled twice a second
showed "Failed 85" of 167 tasks in the Ray dashboard. Here the driver's `take` waits up to its
timeout and answers every event that arrived (an empty list when none did), and a full stream
drops events rather than raising in the worker (training never waits on its driver).

The same actor is the trial's stop flag (`raise_`, `get`): the driver raises it, rank 0 polls it
(launch.interrupt.follow_stop_flag). One actor, one process, per fresh gang, not two (a process
costs 1-2 s of a small machine's CPU while the gang starts).
"""

from __future__ import annotations

import asyncio
from typing import Any

from trainlab.events import PREEMPT, stronger_stop

MAX_EVENTS = 10_000
"""Events held for the driver; past this (a driver that stopped reading) new ones are dropped."""


class EventStream:
    """The actor's class (made remote by `start_stream`). One writer (rank 0), one reader (the driver)."""

    def __init__(self, max_events: int = MAX_EVENTS) -> None:
        self._events: list[Any] = []
        self._max = max_events
        self.dropped = 0
        self._changed = asyncio.Condition()
        self.kind = ""
        """The stop flag: "" (not raised), PRUNE or PREEMPT; PREEMPT is never weakened to PRUNE."""

    async def put(self, event: Any, final: bool = False) -> bool:
        """Add an event; False (and counted in `dropped`) when the stream is full, except for the
        `final` one (the trial's result), which is always kept."""
        if len(self._events) >= self._max and not final:
            self.dropped += 1
            return False
        self._events.append(event)
        async with self._changed:
            self._changed.notify_all()
        return True

    async def take(self, timeout: float) -> list[Any]:
        """Every event since the last take, waiting up to `timeout` s for one; [] if none came."""
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: bool(self._events)), timeout)
            except asyncio.TimeoutError:
                pass  # an answer, not an error: the driver asks again
        events, self._events = self._events, []
        return events

    async def raise_(self, kind: str = PREEMPT) -> None:
        """Ask the trial to stop: PREEMPT (after a checkpoint) or PRUNE (at once)."""
        self.kind = stronger_stop(self.kind, kind)

    async def get(self) -> str:
        """What the flag asks: "" (go on), PRUNE or PREEMPT."""
        return self.kind


def start_stream(**actor_options):
    """An EventStream actor (num_cpus=0: it never waits for a core)."""
    import ray

    return ray.remote(num_cpus=0)(EventStream).options(**actor_options).remote()


def end_gracefully(actor) -> None:
    """End a trial's stream (or a warm gang's queue) once the calls already sent to it have run.

    Not `ray.kill`: a killed actor's worker loses the task events it has not yet reported (Ray
    reports them each second), and Ray's state API then shows its last calls FAILED with
    WORKER_DIED (CI saw `EventStream.put` so, in a trial that had finished). Ray's documented
    graceful end, `__ray_terminate__`, runs after the queued calls and reports them first.
    """
    actor.__ray_terminate__.remote()
