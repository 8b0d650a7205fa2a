"""The warm gang's queue (launch.gang_queue) as its actor runs it, without Ray: trials are handed
out in order, a restarted gang gets its trial in flight again within the trial's max_failures
and then the trial fails with the error its worker reported (or Ray's reason for a worker that
died) while the gang goes on with the next; events and outcomes reach the trial's reader."""

from __future__ import annotations

import asyncio

from trainlab.events import PREEMPT, PRUNE
from trainlab.launch.gang_queue import WAIT, GangQueue


def _run(coro):
    return asyncio.run(coro)


def test_trials_come_in_order_and_an_ended_empty_queue_ends_the_gang():
    async def scenario():
        q = GangQueue()
        assert await q.next(0.01) == WAIT  # nothing yet: ask again
        await q.submit("a", ["ref a"], 0)
        await q.submit("b", ["ref b"], 0)
        first = await q.next(0.01)
        assert (first["key"], first["payload"], first["attempt"]) == ("a", ["ref a"], 0)
        await q.put_event("a", {"kind": "step", "step": 1})
        await q.finish("a", {"status": "finished"})
        assert await q.take("a", 0.01) == ([{"kind": "step", "step": 1}], {"result": {"status": "finished"}})
        assert (await q.next(0.01))["key"] == "b"
        await q.finish("b", {"status": "finished"})
        await q.end()
        assert await q.next(0.01) is None

    _run(scenario())


def test_a_restarted_gang_resumes_its_trial_within_max_failures_then_fails_it_and_goes_on():
    async def scenario():
        q = GangQueue()
        await q.submit("a", {}, 1)
        await q.submit("b", {}, 0)
        assert (await q.next(0.01))["attempt"] == 0
        q.failed("a", "RuntimeError: first (rank 1)")  # the worker's report before it raised
        again = await q.next(0.01)  # Ray Train restarted the worker group: the same trial, resumed
        assert (again["key"], again["attempt"]) == ("a", 1)
        q.failed("a", "RuntimeError: second (rank 0)")
        q.failed("a", "RuntimeError: collateral (rank 1)")
        await q.gang_failed("WorkerGroupError: ... [Rank 0] RuntimeError: second", died=False)
        # max_failures=1 used: `a` failed as Ray reported the failure, before the gang restarted
        assert await q.take("a", 0.01) == ([], {"error": "RuntimeError: second (rank 0)"})
        assert (await q.next(0.01))["key"] == "b"  # the restarted gang takes the next

    _run(scenario())


def test_a_worker_that_died_fails_its_trial_with_rays_reason_not_the_survivors_errors():
    async def scenario():
        q = GangQueue()
        await q.submit("a", {}, 0)
        await q.next(0.01)
        q.failed("a", "RuntimeError: [pair.cc:537] Read error: Connection reset by peer (rank 0)")  # collateral
        await q.gang_failed("WorkerGroupError: Training failed due to worker errors:\n[Rank 1] died", died=True)
        _, outcome = await q.take("a", 0.01)
        assert outcome == {"error": "WorkerGroupError: Training failed due to worker errors:\n[Rank 1] died"}
        assert await q.next(0.01) == WAIT  # the restarted gang waits for the next trial

    _run(scenario())


def test_a_stop_reaches_only_its_trial_and_a_withdrawn_trial_never_starts():
    async def scenario():
        q = GangQueue()
        await q.submit("a", {}, 0)
        await q.submit("b", {}, 0)
        await q.next(0.01)
        q.stop("a", PRUNE)
        assert q.stop_kind("a") == PRUNE
        q.stop("a", PREEMPT)  # a signal after the pruner: stop with a checkpoint
        q.stop("a", PRUNE)
        assert q.stop_kind("a") == PREEMPT  # a prune never weakens it
        assert q.stop_kind("b") == ""
        assert q.withdraw("b") and not q.withdraw("a")  # `a` is in flight already
        await q.finish("a", {"status": "preempted"})
        await q.end()
        assert await q.next(0.01) is None

    _run(scenario())

