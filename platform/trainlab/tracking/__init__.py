"""Trackers: the protocol, a no-op and JSONL one, and MLflow (imported only where used)."""

from trainlab.tracking.base import JsonlTracker, NullTracker, Tracker

__all__ = ["JsonlTracker", "NullTracker", "Tracker"]
