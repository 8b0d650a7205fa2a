"""The MLflow writer's outbox once training closed its input: a writer that is only slow (its
low priority on a busy machine) delivers everything however long that takes; an unreachable
server is given close_timeout_s, then the points are left (in the spill file when there is one)."""

from __future__ import annotations

import time

from trainlab.tracking.delivery import Delivery, Unreachable
from trainlab.tracking.outbox import Outbox


class SlowDelivery(Delivery):
    """Each call takes `delay_s`, then stores one record, or fails as an unreachable server does."""

    def __init__(self, *, delay_s: float, reachable: bool):
        super().__init__()
        self.delay_s, self.reachable = delay_s, reachable
        self.delivered: list[dict] = []

    def send(self, records: list[dict]) -> int:
        time.sleep(self.delay_s)
        if not self.reachable:
            raise Unreachable("connection refused")
        self.delivered.append(records[0])
        return 1


def _metrics(step: int) -> dict:
    return {"op": "metrics", "run_id": "run", "uri": "sqlite:///x.db", "items": [["train/loss", 1.0, 0, step]]}


def test_a_slow_writer_delivers_everything_past_the_close_timeout():
    delivery = SlowDelivery(delay_s=0.1, reachable=True)
    outbox = Outbox(delivery=delivery, uri="sqlite:///x.db", spill_path=None, max_points=100,
                    close_timeout_s=0.05)
    for step in range(5):
        outbox.put(_metrics(step))
    outbox.end_input()
    assert outbox.run() == 0  # nothing left undelivered
    assert [r["items"][0][3] for r in delivery.delivered] == [0, 1, 2, 3, 4]


def test_an_unreachable_server_gets_the_close_timeout_then_the_points_are_left(capfd):
    outbox = Outbox(delivery=SlowDelivery(delay_s=0.0, reachable=False), uri="http://127.0.0.1:9",
                    spill_path=None, max_points=100, close_timeout_s=0.5)
    for step in range(3):
        outbox.put(_metrics(step))
    t0 = time.monotonic()
    outbox.end_input()
    assert outbox.run() == 3
    assert 0.5 <= time.monotonic() - t0 < 5
    assert "3 metric points were not recorded" in capfd.readouterr().err
