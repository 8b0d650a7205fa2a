"""When a sweep's trials trained, read back from MLflow: each trial's window runs from the
timestamp of its first `train/loss` point to that of its last (each point keeps the time its
step was logged at, on the worker)."""

from __future__ import annotations

from trainlab import names


def training_window(client, run_id: str) -> tuple[int, int]:
    """(first, last) `train/loss` timestamps of the run, in ms."""
    history = client.get_metric_history(run_id, names.LOSS)
    assert history, f"run {run_id} logged no {names.LOSS}"
    return window_of(history)


def window_of(history) -> tuple[int, int]:
    """(first, last) timestamps, in ms, of a metric history already read."""
    return min(m.timestamp for m in history), max(m.timestamp for m in history)


def most_at_once(windows: list[tuple[int, int]]) -> int:
    """The largest number of windows open at one instant (a window ending when another starts
    does not overlap it)."""
    edges = sorted([(start, 1) for start, _ in windows] + [(end, -1) for _, end in windows],
                   key=lambda e: (e[0], e[1]))  # at a tie the end comes first
    most = now = 0
    for _, delta in edges:
        now += delta
        most = max(most, now)
    return most
