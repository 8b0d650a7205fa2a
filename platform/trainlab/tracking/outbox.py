"""The writer's queue of MLflow records: the spill file's undelivered part, then memory.

`put` (the stdin reader thread) only appends to memory, so it never waits on the server.
A `sync` record is a checkpoint's question "is everything before me safe?": it is answered
(`ack`, on stdout) once every record before it was delivered or written to the spill file;
during an outage memory goes to the spill file at once, so a sync never waits on the server.
`run` (the sender) delivers in order: what the spill file holds first, then memory, and
drops a record only once MLflow took it. While the server is unreachable it retries with
backoff; past `max_points` held points, memory moves to the end of the spill file. After
`end_input` it goes on delivering; once `close_timeout_s` have passed and the server does
not answer, it leaves what is left in the spill file and prints the command that delivers
it later. (A writer that is only slow, e.g. still starting on a busy machine at its low
priority, is not cut off: its server answers.)
"""

from __future__ import annotations

import collections
import itertools
import threading
import time

from trainlab.tracking.delivery import Delivery, Unreachable, warn
from trainlab.tracking.spill import MAX_BATCH, Spill, points

SYNC = "sync"
_BACKOFF_S = (0.5, 5.0)  # first and longest wait between attempts while unreachable


class Outbox:
    def __init__(self, *, delivery: Delivery, uri: str, spill_path: str | None, max_points: int,
                 close_timeout_s: float, ack=lambda sync_id: None):
        self._delivery = delivery
        self._ack = ack
        self._uri = uri
        self._spill = Spill(spill_path) if spill_path else None
        self._max_points = max_points
        self._close_timeout_s = close_timeout_s
        self._memory: collections.deque[dict] = collections.deque()
        self._memory_points = 0
        self._spill_points = 0
        self._resumes: list[dict] = []
        if self._spill is not None and self._spill.exists():  # left by an earlier writer
            self._spill_points = self._spill.check()[1]
            self._resumes = self._spill.resumed_runs()
        self._cond = threading.Condition()
        self._deadline: float | None = None  # set by end_input
        self._outage_since: float | None = None

    # -- the reader's side -----------------------------------------------------------------
    def put(self, record: dict) -> None:
        """Queue one record (metrics of more than MAX_BATCH points are split)."""
        if record["op"] == "metrics":
            items = record["items"]
            parts = [{**record, "items": items[i:i + MAX_BATCH]} for i in range(0, len(items), MAX_BATCH)]
        else:
            parts = [record]
        with self._cond:
            self._memory.extend(parts)
            self._memory_points += points(record)
            if record["op"] == SYNC and self._outage_since is not None and self._spill is not None:
                self._to_spill()  # the server is away: safe on disk now, not when it returns
            self._cond.notify()

    def end_input(self) -> None:
        with self._cond:
            self._deadline = time.monotonic() + self._close_timeout_s
            self._cond.notify()

    # -- the sender ------------------------------------------------------------------------
    def run(self) -> int:
        """Deliver until the input ended and nothing is left, or the close deadline passed
        with the server unreachable; returns the points left undelivered (in the spill file,
        or lost without one)."""
        retry_at, backoff = 0.0, _BACKOFF_S[0]
        while True:
            with self._cond:
                if self._spill and self._memory_points > self._max_points:
                    self._to_spill()
                while not self._backlog() and self._deadline is None:
                    self._cond.wait()
                if not self._backlog() or self._past_deadline():
                    break
                wait = retry_at - time.monotonic()
                if wait > 0:  # woken early (more input, end of input): check the limits again
                    self._cond.wait(min(wait, self._until_deadline()))
                    continue
            try:
                sent = self._send_next()
            except Unreachable as e:
                if self._outage_since is None:
                    self._outage_since = time.monotonic()
                    with self._cond:
                        if self._spill is not None and any(r["op"] == SYNC for r in self._memory):
                            self._to_spill()  # a checkpoint is waiting: put its records on disk
                    where = f"memory, then {self._spill.path}" if self._spill else "memory"
                    warn(f"MLflow server {self._uri} unreachable ({e}); holding metrics ({where}) "
                         "until it answers")
                retry_at, backoff = time.monotonic() + backoff, min(backoff * 2, _BACKOFF_S[1])
                continue
            if self._outage_since is not None:
                warn(f"MLflow server {self._uri} answers again after "
                     f"{time.monotonic() - self._outage_since:.0f} s; delivering the "
                     f"{self.held_points() + sent} metric points held")
                self._outage_since = None
            retry_at, backoff = 0.0, _BACKOFF_S[0]
        return self._give_up()

    def held_points(self) -> int:
        return self._memory_points + self._spill_points

    # -- internals -------------------------------------------------------------------------
    def _backlog(self) -> bool:
        return bool(self._memory or self._resumes or self._spill_next())

    def _spill_next(self) -> list[tuple[dict, int]]:
        return self._spill.read() if self._spill is not None else []

    def _past_deadline(self) -> bool:
        """Input ended `close_timeout_s` ago and the server did not answer the last call."""
        return self._deadline is not None and self._outage_since is not None and time.monotonic() >= self._deadline

    def _until_deadline(self) -> float:
        return 3600.0 if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def _send_next(self) -> int:
        """One MLflow call: from the spill file while it holds anything, else from memory;
        returns the metric points it delivered."""
        if self._resumes:  # runs resumed in a spill we took over: their filter comes first
            self._delivery.send([self._resumes[0]])
            self._resumes.pop(0)
            return 0
        chunk = self._spill_next()
        if chunk:
            n = self._delivery.send([r for r, _ in chunk])
            self._spill.delivered(chunk[n - 1][1])
            sent = sum(points(r) for r, _ in chunk[:n])
            self._spill_points -= sent
            if not self._spill_next():
                self._spill.finish()
            return sent
        with self._cond:
            if self._memory and self._memory[0]["op"] == SYNC:  # all before it is delivered
                self._ack(self._memory.popleft()["id"])
                return 0
            records = list(itertools.takewhile(lambda r: r["op"] != SYNC, itertools.islice(self._memory, 200)))
        n = self._delivery.send(records)
        sent = sum(points(r) for r in records[:n])
        with self._cond:
            for _ in range(n):
                self._memory.popleft()
            self._memory_points -= sent
        return sent

    def _to_spill(self) -> None:
        """Move memory to the end of the spill file (caller holds the lock)."""
        records = [self._delivery.keep(r) for r in self._memory if r["op"] != SYNC]
        self._spill.append([r for r in records if r["op"] != "metrics" or r["items"]])
        for sync in [r for r in self._memory if r["op"] == SYNC]:  # on disk: safe
            self._ack(sync["id"])
        self._spill_points += sum(points(r) for r in records)
        self._memory.clear()
        self._memory_points = 0

    def _give_up(self) -> int:
        with self._cond:
            left = self.held_points()
            if not self._backlog():
                return 0
            if self._spill is None:
                warn(f"MLflow server {self._uri} still unreachable; {left} metric points were not "
                     "recorded (no spill file was configured)")
                return left
            self._to_spill()
        warn(f"MLflow server {self._uri} still unreachable after {self._close_timeout_s:g} s; {left} metric "
             f"points are kept in {self._spill.path}; deliver them with: "
             f"trainlab import-spill {self._spill.path}")
        return left
