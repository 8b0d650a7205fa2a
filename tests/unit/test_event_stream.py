"""The trial's event stream, which is also its stop flag (one actor per fresh gang): events come
back in order and a full stream drops all but the result; a PREEMPT request is never weakened by
a later PRUNE (the trial must stay resumable)."""

from __future__ import annotations

import asyncio

from trainlab.events import PREEMPT, PRUNE
from trainlab.launch.event_stream import EventStream


def test_events_come_back_in_order_and_a_full_stream_keeps_only_the_result():
    async def run():
        stream = EventStream(max_events=2)
        assert [await stream.put(e) for e in ("a", "b", "c")] == [True, True, False]
        assert await stream.put("result", final=True)
        return await stream.take(0.01), await stream.take(0.01), stream.dropped

    assert asyncio.run(run()) == (["a", "b", "result"], [], 1)


def test_the_stop_flag_says_why_and_preempt_is_never_weakened_to_prune():
    async def run():
        stream = EventStream()
        seen = [await stream.get()]
        await stream.raise_(PRUNE)
        seen.append(await stream.get())
        await stream.raise_(PREEMPT)
        await stream.raise_(PRUNE)
        seen.append(await stream.get())
        return seen

    assert asyncio.run(run()) == ["", PRUNE, PREEMPT]
