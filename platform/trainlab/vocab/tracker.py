"""The Tracker protocol and its do-nothing and JSONL implementations.

The engine logs through a Tracker and never branches on whether tracking is on: non-zero
ranks and `tracking=none` get a tracker with the same methods that writes nowhere (or a
local JSONL file).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Protocol


class Tracker(Protocol):
    def log_metrics(self, metrics: dict[str, float], *, step: int) -> None: ...
    def set_tags(self, tags: dict[str, Any]) -> None: ...
    def log_artifact(self, path: str) -> None: ...
    """A file, or a folder (logged whole under its own name)."""
    def sync(self) -> None: ...
    """Return once everything logged so far is durable (before a checkpoint)."""
    def close(self) -> None: ...


class NullTracker:
    """Accepts everything, records nothing (ranks other than 0)."""

    def log_metrics(self, metrics: dict[str, float], *, step: int) -> None:
        pass

    def set_tags(self, tags: dict[str, Any]) -> None:
        pass

    def log_artifact(self, path: str) -> None:
        pass

    def sync(self) -> None:
        pass

    def close(self) -> None:
        pass


class JsonlTracker(NullTracker):
    """One JSON line per log call in `path` (tracking=none): greppable, no server, no store."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = self.path.open("a", buffering=1)

    def log_metrics(self, metrics: dict[str, float], *, step: int) -> None:
        self._f.write(json.dumps({"step": step, "time": time.time(), **metrics}) + "\n")

    def set_tags(self, tags: dict[str, Any]) -> None:
        self._f.write(json.dumps({"tags": {k: str(v) for k, v in tags.items()}}) + "\n")

    def sync(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()
