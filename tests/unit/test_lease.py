"""One owner per trial (launch.lease): the driver that trains a trial holds a lease in its
checkpoint folder; a second driver is refused in one line naming the holder, a dead holder's
lease is taken over, and the lease is gone once its holder ends. In process, no Ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from trainlab.config import ConfigError
from trainlab.launch import lease
from trainlab.launch.lease import LEASE_FILE, LeaseHeld, acquire, check_free


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_lease_is_taken_before_anything_else_and_gone_after_release(tmp_path):
    root = tmp_path / "ckpt"
    held = acquire(root)
    record = json.loads((root / LEASE_FILE).read_text())
    assert record["pid"] == os.getpid() and record["host"] and record["holder"] == held.holder
    held.release()
    assert not (root / LEASE_FILE).exists()
    acquire(root).release()  # free again


def test_a_second_driver_is_refused_in_one_line_naming_the_holder(tmp_path):
    held = acquire(tmp_path)
    try:
        with pytest.raises(LeaseHeld) as e:
            acquire(tmp_path)
        said = str(e.value)
        assert isinstance(e.value, ConfigError) and "\n" not in said
        assert f"pid {os.getpid()}" in said and lease.host_name() in said and "since" in said
        assert str(tmp_path) in said and "train.checkpoint_dir" in said  # the safe way on
        with pytest.raises(LeaseHeld):
            check_free(tmp_path)  # the planner's early look says the same
    finally:
        held.release()


def test_a_dead_holders_lease_is_taken_over(tmp_path, capsys):
    record = {"holder": "gone", "host": lease.host_name(), "pid": _dead_pid(), "started": time.time() - 50,
              "heartbeat": time.time()}
    (tmp_path / LEASE_FILE).write_text(json.dumps(record))
    check_free(tmp_path)  # stale: no refusal
    held = acquire(tmp_path)
    try:
        assert json.loads((tmp_path / LEASE_FILE).read_text())["holder"] == held.holder
    finally:
        held.release()


def test_a_lease_whose_holders_pid_was_reused_is_taken_over(tmp_path):
    """The holder is named by its process (vocab.processes): a live process that took over a dead
    holder's pid (this one, started later than the holder) holds nothing, though its heartbeat is fresh."""
    from trainlab.vocab.processes import process_id

    host, pid, start = process_id().split(" ")
    record = {"holder": "gone", "host": host, "pid": int(pid), "process": f"{host} {pid} {int(start) - 1000}",
              "started": time.time() - 50, "heartbeat": time.time()}
    (tmp_path / LEASE_FILE).write_text(json.dumps(record))
    held = acquire(tmp_path)
    try:
        taken = json.loads((tmp_path / LEASE_FILE).read_text())
        assert taken["holder"] == held.holder and taken["process"] == process_id()
    finally:
        held.release()


def test_a_lease_whose_heartbeat_stopped_long_ago_is_stale_on_another_host(tmp_path):
    old = time.time() - 10 * lease.STALE_AFTER_S
    record = {"holder": "far", "host": "elsewhere.example", "pid": 1, "started": old, "heartbeat": old}
    (tmp_path / LEASE_FILE).write_text(json.dumps(record))
    acquire(tmp_path).release()
    record["heartbeat"] = time.time()  # alive elsewhere: refused
    (tmp_path / LEASE_FILE).write_text(json.dumps(record))
    with pytest.raises(LeaseHeld, match="host elsewhere.example, pid 1"):
        acquire(tmp_path)


def test_a_live_holder_on_this_host_keeps_its_lease_however_old_its_heartbeat(tmp_path):
    """A holder here whose heartbeat stalled (SIGSTOP, a suspended machine) still runs: taking its
    lease would give the trial two drivers the moment it wakes. Only its end frees the lease."""
    from trainlab.vocab.processes import process_id

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        old = time.time() - 10 * lease.STALE_AFTER_S
        record = {"holder": "stalled", "host": lease.host_name(), "pid": sleeper.pid,
                  "process": process_id(sleeper.pid), "started": old, "heartbeat": old}
        (tmp_path / LEASE_FILE).write_text(json.dumps(record))
        with pytest.raises(LeaseHeld, match=f"pid {sleeper.pid}, .* heartbeat \\d+ s ago"):
            acquire(tmp_path)
    finally:
        sleeper.kill()
        sleeper.wait()
    acquire(tmp_path).release()  # gone: taken over


def test_release_leaves_a_lease_taken_over_by_another_alone(tmp_path):
    held = acquire(tmp_path)
    other = {"holder": "other", "host": "elsewhere.example", "pid": 1, "started": time.time(),
             "heartbeat": time.time()}
    (tmp_path / LEASE_FILE).write_text(json.dumps(other))
    held.release()
    assert json.loads((tmp_path / LEASE_FILE).read_text())["holder"] == "other"


def test_the_heartbeat_renews_the_lease(tmp_path, monkeypatch):
    monkeypatch.setattr(lease, "HEARTBEAT_S", 0.05)
    held = acquire(tmp_path)
    try:
        first = json.loads((tmp_path / LEASE_FILE).read_text())["heartbeat"]
        deadline = time.monotonic() + 5
        while json.loads((tmp_path / LEASE_FILE).read_text())["heartbeat"] == first:
            assert time.monotonic() < deadline, "no heartbeat"
            time.sleep(0.02)
    finally:
        held.release()


def test_a_corrupt_lease_file_is_refused_not_overwritten(tmp_path):
    (tmp_path / LEASE_FILE).write_text("{half")
    with pytest.raises(LeaseHeld, match="unreadable"):
        acquire(tmp_path)
    assert (tmp_path / LEASE_FILE).read_text() == "{half"


def test_a_fifo_where_the_lease_belongs_is_refused_in_one_line_without_waiting(tmp_path):
    os.mkfifo(tmp_path / LEASE_FILE)  # reading it would wait for a writer forever
    with pytest.raises(LeaseHeld) as e:
        acquire(tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and LEASE_FILE in msg and "FIFO" in msg and "move it out" in msg
    assert (tmp_path / LEASE_FILE).exists()  # refused, not replaced


def test_the_lifecycle_refuses_a_held_trial_before_writing_anything_of_it(tmp_path):
    from trainlab.config import compose_run_config
    from trainlab.launch.executors import InProcess
    from trainlab.launch.lifecycle import train

    root = tmp_path / "ckpt"
    run = compose_run_config(["model=tiny", "tracking=none", "train.max_steps=2", f"train.checkpoint_dir={root}",
                              f"output_dir={tmp_path / 'out'}"])
    held = acquire(root)
    try:
        with pytest.raises(LeaseHeld, match=f"pid {os.getpid()}"):
            train(run, executor=InProcess(), show_progress=False)
        assert sorted(p.name for p in root.iterdir()) == [LEASE_FILE]  # no trial.json, no checkpoint
        assert json.loads((root / LEASE_FILE).read_text())["holder"] == held.holder  # still the holder's
    finally:
        held.release()


def _race(root, start, decided, out) -> None:
    start.wait()
    try:
        held = acquire(root)
    except LeaseHeld:
        out.put("refused")
        return
    out.put("held")
    # held until every racer has answered: a racer a busy machine starts late must meet the lease, not
    # find it let go (a fixed 0.5 s hold would let it through)
    decided.wait(timeout=60)
    held.release()


def test_drivers_racing_for_one_trial_get_exactly_one_lease(tmp_path):
    import multiprocessing as mp

    ctx = mp.get_context("fork")  # the imports are inherited: each racer costs a fork
    start, decided, out = ctx.Event(), ctx.Event(), ctx.Queue()
    racers = [ctx.Process(target=_race, args=(tmp_path, start, decided, out)) for _ in range(4)]
    for p in racers:
        p.start()
    start.set()
    said = sorted(out.get(timeout=120) for _ in racers)
    decided.set()
    for p in racers:
        p.join(timeout=60)
    assert said == ["held", "refused", "refused", "refused"]
    assert not (tmp_path / LEASE_FILE).exists()
