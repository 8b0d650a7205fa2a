"""Optuna's pruners over a multirun's trials (hydra.launcher.prune=median|successive_halving|hyperband).

Hydra's Optuna sweeper proposes trials and is told their results, but its trials never report
while they run: it has no pruner. The launcher runs Optuna's own pruner instead, over a study of
its own that mirrors the multirun's trials (an in-memory Optuna study, one Optuna trial per
trainlab trial, whatever sweeper proposed them): each validation is reported as an intermediate
value, and `should_prune()` is asked, exactly as an Optuna objective would.

Intermediate values are at equal TOKENS, not steps, so trials of other batch sizes compare: step k
of the Optuna trial is the val loss at k x `unit` tokens, the trial's curve interpolated there
(launch.pruner.value_at; never extrapolated), `unit` the shortest validation interval in tokens of
the first trials. prune_grace_tokens is the pruners' warm-up (MedianPruner's n_warmup_steps,
the halving pruners' min_resource), prune_reduction_factor their reduction factor and
prune_startup_trials MedianPruner's n_startup_trials.
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from optuna.trial import TrialState

from trainlab.config.prune_rule import PruneConfig
from trainlab.events import ProgressEvent, StepDone
from trainlab.launch.pruner import Point, fmt_tokens, value_at

PRUNER_CLASSES = {"median": "MedianPruner", "successive_halving": "SuccessiveHalvingPruner",
                  "hyperband": "HyperbandPruner"}


def make_pruner(config: PruneConfig, *, warmup_steps: int, max_steps: int):
    """Optuna's pruner of the rule, its knobs in grid steps."""
    import optuna

    if config.prune == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=config.prune_startup_trials,
                                           n_warmup_steps=warmup_steps)
    rf = max(2, round(config.prune_reduction_factor))
    if config.prune == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=max(1, warmup_steps), reduction_factor=rf)
    return optuna.pruners.HyperbandPruner(min_resource=max(1, warmup_steps), max_resource=max(2, max_steps),
                                          reduction_factor=rf)


@dataclass
class _Mirror:
    label: str
    trial: object
    """Its Optuna trial in the launcher's study."""
    points: list[Point] = field(default_factory=list)
    reported: int = 0
    """Grid steps reported so far (1..reported)."""
    stopped: str = ""
    ended: bool = False


class OptunaPruner:
    """The launcher's Optuna study and pruner; thread-safe (each trial's events arrive on its own
    thread). Same calls as launch.pruner.Pruner: saw, ended, add."""

    def __init__(self, config: PruneConfig, *, grace: int, longest: int, unit: int,
                 labels: Mapping[Hashable, str]) -> None:
        """grace, longest, unit: tokens (the warm-up, the longest trial, the grid's spacing)."""
        import optuna

        assert config.prune in PRUNER_CLASSES and unit > 0
        logging.getLogger("optuna").setLevel(logging.WARNING)  # a line per trial asked and told is Optuna's noise
        self.config, self.unit, self.grace = config, unit, grace
        self.name = PRUNER_CLASSES[config.prune]
        self.pruner = make_pruner(config, warmup_steps=math.ceil(grace / unit), max_steps=math.ceil(longest / unit))
        self._study = optuna.create_study(direction="minimize", pruner=self.pruner,
                                          sampler=optuna.samplers.RandomSampler(seed=0))
        self._mirrors: dict[Hashable, _Mirror] = {}
        self._lock = threading.Lock()
        self.add(labels)

    def add(self, labels: Mapping[Hashable, str]) -> None:
        """The trials of a later batch: each gets its Optuna trial now, in the order given."""
        with self._lock:
            for key, label in labels.items():
                if key not in self._mirrors:
                    self._mirrors[key] = _Mirror(label, self._study.ask())

    def saw(self, key: Hashable, event: ProgressEvent) -> dict[Hashable, str]:
        if not isinstance(event, StepDone) or event.val_loss is None or event.tokens is None:
            return {}
        return self.report(key, step=event.step, tokens=event.tokens, val_loss=event.val_loss)

    def report(self, key: Hashable, *, step: int, tokens: int, val_loss: float) -> dict[Hashable, str]:
        """Trial `key` validated: {key: why} if Optuna's pruner stops it now."""
        with self._lock:
            m = self._mirrors[key]
            if m.stopped or m.ended:
                return {}
            if not math.isfinite(val_loss):
                m.stopped = f"val loss is {val_loss} at step {step}: it diverged"
                return {key: m.stopped}
            while m.points and m.points[-1][0] >= tokens:  # a rollback trains tokens again
                m.points.pop()
            m.points.append((tokens, float(val_loss)))
            last = None
            while (m.reported + 1) * self.unit <= tokens:
                value = value_at(m.points, (m.reported + 1) * self.unit)
                if value is None:  # before its first validation: nothing to interpolate from
                    m.reported += 1
                    continue
                m.reported += 1
                m.trial.report(value, m.reported)
                last = value
            if last is None or not m.trial.should_prune():
                return {}
            m.stopped = self._why(m, last, step=step)
            return {key: m.stopped}

    def _why(self, m: _Mirror, value: float, *, step: int) -> str:
        at = m.reported * self.unit
        where = f"val loss {value:.4f} at {fmt_tokens(at)} tokens (step {step})"
        if self.config.prune == "median":
            # as MedianPruner judges: the trial's best so far against the median of the COMPLETE trials there
            others = [t.intermediate_values[m.reported] for t in self._study.get_trials(deepcopy=False)
                      if t.state == TrialState.COMPLETE and m.reported in t.intermediate_values]
            best = min(m.trial.storage.get_trial(m.trial._trial_id).intermediate_values.values())
            if others:
                return (f"Optuna's MedianPruner: {where} (its best so far {best:.4f}) is worse than the median "
                        f"{statistics.median(others):.4f} of the {len(others)} finished trials at equal tokens")
        return f"Optuna's {self.name}: {where} is not among the trials kept at its rung"

    def ended(self, key: Hashable, *, status: str = "", value: float | None = None) -> None:
        """Trial `key` ended: told to the launcher's study (pruned, failed, or complete with its
        last val loss), so later trials are judged against it."""
        from trainlab import names

        with self._lock:
            m = self._mirrors[key]
            if m.ended:
                return
            m.ended = True
            if m.stopped or status == names.STATUS_PRUNED:
                self._study.tell(m.trial, state=TrialState.PRUNED)
            elif value is not None and math.isfinite(value) and m.points:
                self._study.tell(m.trial, value)
            else:
                self._study.tell(m.trial, state=TrialState.FAIL)
