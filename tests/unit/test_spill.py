"""The spill file on its own: records come back in order, delivery progress survives a
stop halfway, and a marker left from an earlier file of the same name is not trusted. And what a
resumed run's delivery filters out."""

from __future__ import annotations

import pytest

from trainlab import names
from trainlab.tracking.delivery import Delivery
from trainlab.tracking.spill import Spill, SpillError


def _metrics(step: int) -> dict:
    return {"op": "metrics", "run_id": "r", "uri": "u", "items": [["loss", 1.0, 0, step]]}


def test_delivered_records_are_not_read_again_and_the_file_goes_when_all_are(tmp_path):
    path = tmp_path / "spill.jsonl"
    Spill(str(path)).append([_metrics(s) for s in range(5)])
    spill = Spill(str(path))
    chunk = spill.read(max_points=2)
    assert [r["items"][0][3] for r, _ in chunk] == [0, 1]
    spill.delivered(chunk[-1][1])
    assert not spill.finish(), "three records are not delivered yet"

    again = Spill(str(path))  # a later import, after a stop halfway
    assert again.check() == (3, 3)
    rest = again.read()
    assert [r["items"][0][3] for r, _ in rest] == [2, 3, 4]
    again.delivered(rest[-1][1])
    assert again.read() == [] and again.finish()
    assert not path.exists() and not (tmp_path / "spill.jsonl.delivered").exists()


def test_a_marker_of_an_earlier_file_is_ignored(tmp_path):
    path = tmp_path / "spill.jsonl"
    old = Spill(str(path))
    old.append([_metrics(0)])
    old.delivered(old.read()[-1][1])
    path.unlink()  # the marker stays, as after a crash between the two removals
    Spill(str(path)).append([_metrics(7)])
    assert [r["items"][0][3] for r, _ in Spill(str(path)).read()] == [7]


def test_a_torn_last_line_is_not_delivered_and_check_names_it(tmp_path):
    path = tmp_path / "spill.jsonl"
    Spill(str(path)).append([_metrics(0)])
    with open(path, "a") as f:
        f.write('{"op": "metrics", "run_id"')
    assert len(Spill(str(path)).read()) == 1
    with pytest.raises(SpillError, match="incomplete line"):
        Spill(str(path)).check()


def test_a_resumed_run_drops_replayed_steps_but_keeps_every_start():
    """A gang restarted before its first checkpoint was complete starts over at step 0: its
    steps are replays, its fault/ points at step 0 another start."""
    delivery = Delivery()
    delivery._last_steps["r"] = {"loss": 5, names.WORKERS: 0, names.RESTARTS: 0}  # what resume() read
    items = [["loss", 1.0, 0, 5], ["loss", 1.0, 0, 6], [names.WORKERS, 1.0, 0, 0], [names.RESTARTS, 0.0, 0, 0]]
    kept = delivery.keep({"op": "metrics", "run_id": "r", "uri": "u", "items": items})
    assert [(k, step) for k, _, _, step in kept["items"]] == [("loss", 6), (names.WORKERS, 0), (names.RESTARTS, 0)]
