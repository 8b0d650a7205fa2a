"""What a trial came to, as the driver reports it: status, rank 0's result, its MLflow run.

launch.lifecycle makes one for every trial it runs, launch.interrupt for a trial stopped before it
started; the sweep and the summary read them.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainlab.events import TrialResult


@dataclass
class TrialOutcome:
    status: str
    result: TrialResult | None
    """Rank 0's result (None when the trial failed before reporting)."""
    run_id: str | None
    tracking_uri: str | None
    error: str = ""
    interrupted: int = 0
    """The signal (SIGINT, SIGTERM) that stopped the trial before its end; 0 if none did."""
    last_step: int | None = None
    """The last step the workers reported (what the tracker recorded), also when they failed."""
    pruned_reason: str = ""
    """Status pruned: why the sweep's pruner stopped it (its StopRequest's reason)."""
    experiment_id: str = ""
    """The MLflow experiment of its run ('' without one)."""
