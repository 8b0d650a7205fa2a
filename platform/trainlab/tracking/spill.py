"""The spill file: where MLflow records wait while the tracking server is unreachable.

An append-only JSONL file (a trial's `<output_dir>/mlflow_spill.jsonl`). Its first line is
a header with a random id; every other line is one record that carries its run id and
tracking URI, so the file can be delivered without anything else:

    {"op": "metrics", "run_id": ..., "uri": ..., "items": [[key, value, timestamp_ms, step], ...]}
    {"op": "tags", ..., "tags": {...}}          {"op": "artifact", ..., "path": ...}
    {"op": "resume", ...}                       {"op": "terminate", ..., "status": "FINISHED"}

What was delivered is recorded beside it in `<spill>.delivered` (the header's id and a byte
offset, replaced atomically after each delivered batch): a delivery that stops halfway
(an outage, a crash, Ctrl-C) goes on where it stopped, and a second import delivers
nothing. The file is removed once all of it was delivered. Appends and the removal hold
an exclusive lock on the file, so the writer process and the driver can share it.
"""

from __future__ import annotations

import fcntl
import json
import os
import uuid

from trainlab.vocab.files import CONFIG_FILE_MAX_BYTES, open_file, read_text

MAX_BATCH = 1000
"""MLflow's limit of metrics per log_batch call; a metrics record holds at most this many."""
SPILL_MAX_BYTES = 16 << 30
"""16 GiB: tens of millions of metric points, far past what a trial spills during an outage
(delivering more would take MLflow days); a bigger file is not one trainlab wrote."""
MAX_LINE_BYTES = 64 << 20
"""The longest record line read: a metrics record of MAX_BATCH points is about 100 KB."""
_FIX = ("pass `trainlab import-spill` the mlflow_spill.jsonl a trial left in its output folder")


class SpillError(ValueError):
    """The spill file is missing or is not one trainlab wrote."""


def points(record: dict) -> int:
    """Metric points in a record (0 for tags, artifacts and run state)."""
    return len(record["items"]) if record["op"] == "metrics" else 0


class Spill:
    """One spill file: append records, read back the undelivered ones, mark them delivered."""

    def __init__(self, path: str):
        self.path = str(path)
        self.marker = self.path + ".delivered"

    # -- writing ---------------------------------------------------------------------------
    def append(self, records: list[dict]) -> None:
        """Append records (whole lines, flushed to disk), creating the file with its header."""
        if not records:
            return
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        with self._locked("a") as f:
            if f.tell() == 0:
                f.write(json.dumps({"trainlab_spill": 1, "id": uuid.uuid4().hex}) + "\n")
            f.write("".join(json.dumps(r) + "\n" for r in records))
            f.flush()
            os.fsync(f.fileno())

    # -- reading ---------------------------------------------------------------------------
    def exists(self) -> bool:
        return os.path.exists(self.path)

    def read(self, *, max_points: int = MAX_BATCH, max_records: int = 200) -> list[tuple[dict, int]]:
        """The next undelivered records, each with the byte offset just after it: up to
        `max_points` points (at least one record), complete lines only."""
        if not self.exists():
            return []
        got, total = [], 0
        with self._open() as f:
            spill_id, start = self._start(f)
            f.seek(start)
            for line in self._lines(f):
                if not line.endswith(b"\n"):
                    break  # a line still being written, or torn by a crash: see check()
                record = self._parse(line, f.tell())
                if got and (total + points(record) > max_points or len(got) >= max_records):
                    break
                got.append((record, f.tell()))
                total += points(record)
        self._id = spill_id
        return got

    def check(self) -> tuple[int, int]:
        """Validate every undelivered line; returns (records, points) still to deliver."""
        if not self.exists():
            raise SpillError(f"{self.path} does not exist")
        records = total = 0
        with self._open() as f:
            _, start = self._start(f)
            f.seek(start)
            for line in self._lines(f):
                if not line.endswith(b"\n"):
                    raise SpillError(f"{self.path} ends in an incomplete line at byte {f.tell() - len(line)} "
                                     "(a crash while writing it); remove that line and import again")
                record = self._parse(line, f.tell())
                records, total = records + 1, total + points(record)
        return records, total

    def resumed_runs(self) -> list[dict]:
        """The `resume` records among the lines already delivered: the later points of those
        runs must still be checked against the steps the runs already have."""
        if not self.exists():
            return []
        runs = []
        with self._open() as f:
            _, start = self._start(f)
            f.seek(0)
            f.readline(MAX_LINE_BYTES)
            while f.tell() < start:
                line = self._line(f)
                if b'"resume"' in line:
                    record = self._parse(line, f.tell())
                    if record["op"] == "resume" and record not in runs:
                        runs.append(record)
        return runs

    # -- delivery progress -----------------------------------------------------------------
    def delivered(self, offset: int) -> None:
        """Record that everything before byte `offset` was delivered (atomic replace)."""
        tmp = self.marker + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"id": self._id, "offset": offset}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.marker)

    def finish(self) -> bool:
        """Remove the file and its marker if everything in it was delivered."""
        try:
            with self._locked("rb") as f:
                _, start = self._start(f)
                if start < os.fstat(f.fileno()).st_size:
                    return False
                os.unlink(self.path)
        except FileNotFoundError:
            pass
        if os.path.exists(self.marker):
            os.unlink(self.marker)
        return True

    # -- internals -------------------------------------------------------------------------
    def _open(self):
        """The file opened for reading: a regular file of at most SPILL_MAX_BYTES (a FIFO, a
        device or a directory is refused in one line, never waited on or read)."""
        return open_file(self.path, field="spill file", fix=_FIX, max_bytes=SPILL_MAX_BYTES)

    def _line(self, f) -> bytes:
        line = f.readline(MAX_LINE_BYTES + 1)
        if len(line) > MAX_LINE_BYTES:
            raise SpillError(f"{self.path}: the line at byte {f.tell() - len(line)} is longer than "
                             f"{MAX_LINE_BYTES >> 20} MiB, which no spill record is; the file was changed "
                             "by something other than trainlab")
        return line

    def _lines(self, f):
        while line := self._line(f):
            yield line

    def _locked(self, mode: str):
        """The file opened and exclusively locked, retried if another process removed it
        between our open and our lock (then we would hold a lock on a deleted file)."""
        while True:
            f = open(self.path, mode)
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                if os.stat(self.path).st_ino == os.fstat(f.fileno()).st_ino:
                    return f
            except FileNotFoundError:
                pass
            f.close()

    def _start(self, f) -> tuple[str, int]:
        """(the header's id, where undelivered lines start) of the open file `f`."""
        f.seek(0)
        first = f.readline(MAX_LINE_BYTES)
        try:
            header = json.loads(first)
            spill_id = header["id"] if header.get("trainlab_spill") == 1 else None
        except (ValueError, AttributeError, KeyError, TypeError):
            spill_id = None
        if spill_id is None:
            raise SpillError(f"{self.path} is not a trainlab spill file (its first line is not the "
                             "header trainlab writes)")
        start = f.tell()
        if not os.path.lexists(self.marker):
            return spill_id, start  # nothing delivered yet
        # a marker that is there but no file (a FIFO, a directory) is refused: taking it for
        # "nothing delivered" would deliver everything twice
        text = read_text(self.marker, field="delivery marker", max_bytes=CONFIG_FILE_MAX_BYTES,
                         fix=f"remove it only if nothing of {self.path} was delivered yet")
        try:
            mark = json.loads(text)
            if mark.get("id") == spill_id:
                start = max(start, int(mark["offset"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            pass  # a marker of an earlier file of that name: nothing delivered yet
        return spill_id, start

    def _parse(self, line: bytes, end: int) -> dict:
        try:
            record = json.loads(line)
            ok = isinstance(record, dict) and {"op", "run_id", "uri"} <= record.keys()
        except ValueError:
            ok = False
        if not ok:
            raise SpillError(f"{self.path}: the line ending at byte {end} is not a spill record "
                             f"({line[:80]!r}); the file was changed by something other than trainlab")
        return record
