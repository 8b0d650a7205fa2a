"""Hydra's Optuna sweeper's study, shared with trainlab's launcher (hydra.sweeper.storage).

Hydra's Optuna sweeper asks its study for trials, hands their overrides to the launcher and tells
the study each trial's return value, always as COMPLETE: a launcher has no way to say that a trial
was pruned, nor to report its curve. `trainlab train -m hydra/sweeper=optuna` therefore gives the
sweeper this storage (config.study_rule.storage_override, when hydra.sweeper.storage is unset): an
Optuna InMemoryStorage, so the study lives in the driver as it would by default, through which

- the launcher reports every validation of a trial as its intermediate value (step: tokens seen),
  as an Optuna objective's `trial.report` would;
- a trial that hydra.launcher.prune stopped is told PRUNED: the sweeper's COMPLETE becomes PRUNED
  here, its value the val loss it reached (what Optuna records for a pruned trial);
- at the study's end its trials (number, state, params, values) go to optuna_trials.json in the
  sweep folder, beside Hydra's optimization_results.yaml.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from optuna.storages import InMemoryStorage
from optuna.trial import TrialState

_CURRENT: list[StudyStorage] = []


class StudyStorage(InMemoryStorage):
    """The sweeper's study storage (Hydra instantiates it from hydra.sweeper.storage's _target_)."""

    def __init__(self) -> None:
        super().__init__()
        self._pruned: set[int] = set()
        self._bridge_lock = threading.Lock()
        _CURRENT[:] = [self]

    # -- what the launcher calls ---------------------------------------------------------------
    def batch(self, first_idx: int, n: int) -> dict[int, int]:
        """{job index: trial id} of the batch just asked: the sweeper asks n trials, then launches
        their jobs in that order, so they are the n newest RUNNING trials."""
        running = sorted((t for sid in self._study_ids() for t in self.get_all_trials(
            sid, deepcopy=False, states=(TrialState.RUNNING,))), key=lambda t: t.number)[-n:]
        return {first_idx + i: t._trial_id for i, t in enumerate(running)} if len(running) == n else {}

    def report(self, trial_id: int, *, tokens: int, val_loss: float) -> None:
        with self._bridge_lock:
            if self.get_trial(trial_id).state == TrialState.RUNNING:
                self.set_trial_intermediate_value(trial_id, int(tokens), float(val_loss))

    def mark_pruned(self, trial_id: int) -> None:
        """The sweeper's tell of this trial will say PRUNED."""
        with self._bridge_lock:
            self._pruned.add(trial_id)

    def write(self, path: Path) -> None:
        rows = [{"number": t.number, "state": t.state.name, "params": t.params, "values": t.values,
                 "intermediate_values": {str(k): v for k, v in sorted(t.intermediate_values.items())}}
                for sid in self._study_ids() for t in self.get_all_trials(sid, deepcopy=False)]
        path.write_text(json.dumps(rows, indent=2, default=str))

    def _study_ids(self) -> list[int]:
        return [summary._study_id for summary in self.get_all_study_summaries()]

    # -- what Optuna calls ---------------------------------------------------------------------
    def set_trial_state(self, trial_id: int, state: TrialState) -> bool:
        if state == TrialState.COMPLETE and trial_id in self._pruned:
            state = TrialState.PRUNED
        return super().set_trial_state(trial_id, state)


def current() -> StudyStorage | None:
    """The sweeper's storage of this process's multirun, if it is trainlab's."""
    return _CURRENT[0] if _CURRENT else None
