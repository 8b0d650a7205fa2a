"""The queue a warm gang takes its trials from: a Ray actor on the driver's node.

The driver submits one trial at a time to its gang's queue (launch.gang_pool); the gang's
rank 0 asks for the next (launch.gang_worker), sends the trial's progress events and its
result here, and polls the trial's stop request. The queue also counts each trial's attempts:
when Ray Train restarts the gang's worker group after a failure, the restarted rank 0 asks
again and gets the trial that was in flight (it resumes from its checkpoint, as a restarted
gang of its own does), until that trial has used its cluster.max_failures; then the trial is
failed with the error its worker reported before raising (or Ray's reason, for a worker that
died) and the gang goes on with the next.

One reader per trial (the driver thread that submitted it), one writer (the gang's rank 0,
any rank for a failure report): an async actor, so that `next` and `take` wait without polling.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict, deque
from dataclasses import dataclass, field

from trainlab.events import stronger_stop

WAIT = "wait"
"""What `next` answers when no trial came within its timeout: ask again."""
REPORT_GRACE_S = 5.0
"""How long a restarted gang's request waits for the reason of the failure it restarted from
(sent by Ray Train's controller) before failing the trial without it."""


@dataclass
class Ticket:
    """One trial as the gang's workers receive it."""

    key: str
    payload: list
    """[ObjectRef of the worker's payload] (plan, MLflow run), as the driver put it: the queue holds
    it by reference and never unpickles it, so its process never imports torch or trainlab's
    config (2.5 CPU-s on the CI machine); the gang's rank 0 gets it (launch.gang_worker)."""
    max_failures: int
    """Restarts of the gang this trial may use (its cluster.max_failures)."""
    failures: int = 0
    errors: list[str] = field(default_factory=list)
    """What its workers reported before raising, in this attempt (first first)."""


class GangQueue:
    """The actor's class (made remote by `start_queue`)."""

    def __init__(self) -> None:
        self._pending: deque[Ticket] = deque()
        self._in_flight: Ticket | None = None
        self._ended = False
        self._outcomes: dict[str, dict] = {}
        self._events: dict[str, list[dict]] = defaultdict(list)
        self._stops: dict[str, str] = {}
        self._gang_error = ""
        self._worker_died = False
        """The latest failure lost a worker: the others' errors are its consequence, Ray's reason says it."""
        self._changed = asyncio.Condition()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _wait(self, ready, timeout: float) -> None:
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(ready), timeout)
            except asyncio.TimeoutError:
                pass

    # -- the driver ----------------------------------------------------------------------
    async def submit(self, key: str, payload: list, max_failures: int) -> None:
        self._pending.append(Ticket(key=key, payload=payload, max_failures=max_failures))
        await self._notify()

    async def end(self) -> None:
        """No trial after those submitted: the gang's loop ends once they are done."""
        self._ended = True
        await self._notify()

    def withdraw(self, key: str) -> bool:
        """Take back a trial no worker has taken yet; whether it was still waiting."""
        for t in list(self._pending):
            if t.key == key:
                self._pending.remove(t)
                return True
        return False

    def stop(self, key: str, kind: str) -> None:
        """Ask the trial to stop after its current step: PREEMPT (with a checkpoint) or PRUNE
        (without); a PRUNE never weakens a PREEMPT."""
        self._stops[key] = stronger_stop(self._stops.get(key, ""), kind)

    async def take(self, key: str, timeout: float) -> tuple[list[dict], dict | None]:
        """(the trial's events since the last take, its outcome or None), waiting up to
        `timeout` for either. An outcome is {"result": dict} or {"error": str}."""
        await self._wait(lambda: self._events.get(key) or key in self._outcomes, timeout)
        events = self._events.pop(key, [])
        return events, self._outcomes.get(key)

    async def gang_failed(self, error: str, *, died: bool = False) -> None:
        """Ray Train's reason for the latest failure of the gang's worker group (its controller,
        before it restarts the group); `died`: a worker was lost (not an error it raised). A
        trial in flight that has used its max_failures is failed now: its driver need not wait
        for the restarted gang."""
        self._gang_error, self._worker_died = error, died
        t = self._in_flight
        if t is not None and t.failures + 1 > t.max_failures:
            self._fail_in_flight()
        await self._notify()

    def _fail_in_flight(self) -> None:
        """Fail the trial in flight with the error a worker raised; where one died, with Ray's
        reason (the survivors' errors, a peer's connection reset, are only its consequence)."""
        t = self._in_flight
        error = self._gang_error if self._worker_died or not t.errors else t.errors[0]
        self._outcomes[t.key] = {"error": error or "the gang's workers restarted"}
        self._in_flight, self._gang_error, self._worker_died = None, "", False

    # -- the gang's workers --------------------------------------------------------------
    async def next(self, timeout: float) -> dict | str | None:
        """The next trial for the gang's rank 0: {"key", "payload", "attempt"}; None once the
        driver ended the queue and nothing is left; WAIT when nothing came within `timeout`.

        A trial still in flight means the gang was restarted while running it: it is handed
        out again (attempt + 1) until its max_failures are used, then failed with the error
        reported for it and the next is handed out."""
        while self._in_flight is not None:
            t = self._in_flight
            t.failures += 1
            if t.failures <= t.max_failures:
                t.errors.clear()
                self._gang_error, self._worker_died = "", False
                return {"key": t.key, "payload": t.payload, "attempt": t.failures}
            # Ray's reason came before the restart unless its callback failed: wait a little for it
            await self._wait(lambda t=t: bool(self._gang_error) or self._in_flight is not t, REPORT_GRACE_S)
            if self._in_flight is t:
                self._fail_in_flight()
            await self._notify()
        await self._wait(lambda: bool(self._pending) or self._ended, timeout)
        if self._pending:
            t = self._in_flight = self._pending.popleft()
            self._gang_error, self._worker_died = "", False  # a failure between trials is not this one's
            return {"key": t.key, "payload": t.payload, "attempt": 0}
        return None if self._ended else WAIT

    async def put_event(self, key: str, event: dict) -> None:
        self._events[key].append(event)
        await self._notify()

    async def finish(self, key: str, result: dict) -> None:
        """Rank 0's result: the trial is done (finished, diverged or stopped)."""
        self._outcomes[key] = {"result": result}
        if self._in_flight is not None and self._in_flight.key == key:
            self._in_flight = None
        await self._notify()

    def failed(self, key: str, error: str) -> None:
        """A worker's error, sent before it raises (Ray Train then restarts the gang)."""
        if self._in_flight is not None and self._in_flight.key == key:
            self._in_flight.errors.append(error)

    def stop_kind(self, key: str) -> str:
        """"" (not asked), PRUNE or PREEMPT: what rank 0's poll (interrupt.follow_stop_flag) reads."""
        return self._stops.get(key, "")


def start_queue(**actor_options):
    """A GangQueue actor (num_cpus=0: it never waits for a core)."""
    import ray

    return ray.remote(num_cpus=0)(GangQueue).options(**actor_options).remote()


def failure_callback(queue):
    """A Ray Train UserCallback that hands the queue Ray's reason each time the gang's worker
    group fails (it runs in Ray Train's controller): a worker that died reports nothing itself."""
    from ray.train import UserCallback

    class GangFailure(UserCallback):
        def __init__(self, queue) -> None:
            self.queue = queue

        def after_exception(self, run_context, worker_exceptions: dict) -> None:
            from ray.exceptions import RayActorError
            from ray.train.v2._internal.exceptions import WorkerHealthCheckFailedError

            lines = [f"[Rank {rank}] {type(e).__name__}: {e}" for rank, e in sorted(worker_exceptions.items())]
            died = any(isinstance(e, (WorkerHealthCheckFailedError, RayActorError)) for e in worker_exceptions.values())
            self.queue.gang_failed.remote("WorkerGroupError: Training failed due to worker errors:\n"
                                          + "\n".join(lines), died=died)

    return GangFailure(queue)
