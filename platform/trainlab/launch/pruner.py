"""Stopping a sweep's hopeless trials early (hydra.launcher.prune): the rules, on the driver.

The sweep feeds every trial's progress events in; each validation is a point (tokens seen, val
loss) of that trial's curve. Trials may differ in batch size, so they are compared at equal
TOKENS: a curve's value at T tokens is its val losses linearly interpolated there, never
extrapolated (as compare's Δ val @ equal tokens).

- divergence: with train.stop_on_nonfinite (the default) the engine stops a diverged trial
  itself (status diverged), as it always did. A non-finite val loss that still reaches the
  pruner (train.stop_on_nonfinite=false) stops the trial at once, grace or not: no rule can
  rank it, nothing comes back from NaN weights.
- margin: once a trial has trained `grace` tokens, it stops when its val loss at T tokens is
  above (1 + margin) x the lowest val loss any other trial of the sweep (running, ended or
  pruned) had at T. Where no other trial's curve covers T yet, it goes on; it is judged again
  at its next validation, and also as soon as another trial's validation covers T (trials
  started later catch up: a hopeless trial that ran ahead is stopped then, not at its end).
- asha: asynchronous successive halving as Ray Tune's ASHAScheduler runs it (one bracket):
  rungs at grace x rf^k tokens, below the longest trial's end. When a trial first validates at
  or past a rung it is recorded there with its val loss interpolated AT the rung (equal tokens)
  and goes on only if that loss is no worse than the best 1/rf quantile of the losses recorded
  at the rung before it (the first to reach a rung always goes on). As in Ray Tune, a
  validation that passes several rungs at once is judged at the highest of them.

Decisions are the driver's; the sweep stops a pruned trial through its StopRequest
(launch.interrupt) and records the reason this module gives.
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from trainlab.config.prune_rule import PruneConfig
from trainlab.events import ProgressEvent, StepDone

Point = tuple[int, float]
"""(tokens seen, val loss) at one validation."""


def value_at(points: Sequence[Point], tokens: float) -> float | None:
    """The curve's val loss at `tokens`, linearly interpolated between its validations; None
    outside [first, last] (no extrapolation)."""
    if not points or not points[0][0] <= tokens <= points[-1][0]:
        return None
    i = bisect_left([t for t, _ in points], tokens)
    t1, v1 = points[i]
    if t1 == tokens or i == 0:
        return v1
    t0, v0 = points[i - 1]
    return v0 + (v1 - v0) * (tokens - t0) / (t1 - t0)


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile, linearly interpolated between order statistics (numpy's default),
    with +inf kept as the worst value instead of turning into NaN."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    i = math.floor(pos)
    frac = pos - i
    if frac == 0 or s[i] == s[i + 1]:
        return s[i]
    return s[i] + (s[i + 1] - s[i]) * frac


def rungs(*, grace: int, last: int, reduction_factor: float) -> list[int]:
    """ASHA's milestones in tokens: grace x rf^k below `last` (a decision at a trial's end
    saves nothing)."""
    out, r = [], float(grace)
    while r < last:
        out.append(round(r))
        r *= reduction_factor
    return out


def fmt_tokens(n: float) -> str:
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:.0f}"


@dataclass
class _Curve:
    label: str
    points: list[Point] = field(default_factory=list)
    step: int = 0
    """The step of the last point."""
    stopped: str = ""
    """Why the pruner stopped it ("" while it goes on)."""
    ended: bool = False
    """The trial ended (finished, diverged, failed): its curve stays, nothing is decided for it."""

    def add(self, tokens: int, val_loss: float) -> None:
        # a rollback (train.on_divergence=rollback) trains tokens again: the curve goes on from there
        while self.points and self.points[-1][0] >= tokens:
            self.points.pop()
        self.points.append((tokens, val_loss))


class Pruner:
    """The sweep's pruning rule over its trials' curves; thread-safe (each trial's events
    arrive on its own thread)."""

    def __init__(self, config: PruneConfig, *, grace: int, longest: int, labels: Mapping[Hashable, str]) -> None:
        """grace: tokens (config.prune_grace_tokens resolved); longest: the tokens of the
        sweep's longest trial; labels: how each trial is named in a reason."""
        assert config.enabled and grace > 0
        self.config, self.grace = config, grace
        self.rungs = rungs(grace=grace, last=longest, reduction_factor=config.prune_reduction_factor) \
            if config.prune == "asha" else []
        self._recorded: list[dict[Hashable, float]] = [{} for _ in self.rungs]
        """Per rung: the val loss at the rung of each trial that reached it."""
        self._curves = {key: _Curve(label) for key, label in labels.items()}
        self._lock = threading.Lock()

    def saw(self, key: Hashable, event: ProgressEvent) -> dict[Hashable, str]:
        """A progress event of trial `key`: the running trials to stop now, with why (each said once)."""
        if not isinstance(event, StepDone) or event.val_loss is None or event.tokens is None:
            return {}
        return self.report(key, step=event.step, tokens=event.tokens, val_loss=event.val_loss)

    def add(self, labels: Mapping[Hashable, str]) -> None:
        """The trials of a sweeper's later batch (launch.study): judged with the others from now on."""
        with self._lock:
            for key, label in labels.items():
                self._curves.setdefault(key, _Curve(label))

    def ended(self, key: Hashable, **_) -> None:
        """Trial `key` ended: it is never stopped, its curve still compares (its status and final
        value are for launch.optuna_pruner's study)."""
        with self._lock:
            self._curves[key].ended = True

    def report(self, key: Hashable, *, step: int, tokens: int, val_loss: float) -> dict[Hashable, str]:
        """Trial `key` validated: the running trials to stop now (it, or with margin others its
        curve now covers), with why; each trial is said once."""
        with self._lock:
            curve = self._curves[key]
            loss = float(val_loss) if math.isfinite(val_loss) else math.inf
            curve.add(tokens, loss)
            curve.step = step
            stop: dict[Hashable, str] = {}
            if not curve.stopped and not curve.ended:
                if loss == math.inf:
                    stop[key] = f"val loss is {val_loss} at step {step}: it diverged"
                elif self.config.prune == "margin":
                    stop[key] = self._margin(key)
                else:
                    stop[key] = self._asha(key, step=step, tokens=tokens)
            if self.config.prune == "margin" and math.isfinite(loss):
                # the trials behind whose last validation this curve now reaches, judged again
                first = curve.points[0][0]
                for other, c in self._curves.items():
                    if other != key and c.points and not (c.stopped or c.ended) and first <= c.points[-1][0] <= tokens:
                        stop[other] = self._margin(other)
            stop = {k: why for k, why in stop.items() if why}
            for k, why in stop.items():
                self._curves[k].stopped = why
            return stop

    def _margin(self, key: Hashable) -> str:
        """Trial `key` judged at its last validation."""
        curve = self._curves[key]
        (tokens, loss), step = curve.points[-1], curve.step
        if tokens < self.grace or not math.isfinite(loss):
            return ""
        best, best_key = math.inf, None
        for other, c in self._curves.items():
            v = value_at(c.points, tokens) if other != key else None
            if v is not None and math.isfinite(v) and v < best:
                best, best_key = v, other
        margin = self.config.prune_margin
        if best_key is None or loss <= best * (1 + margin):
            return ""
        return (f"val loss {loss:.4f} at {fmt_tokens(tokens)} tokens (step {step}) is "
                f"{100 * (loss / best - 1):.1f}% above the best trial's {best:.4f} at equal tokens "
                f"({self._curves[best_key].label}); margin {100 * margin:g}%")

    def _asha(self, key: Hashable, *, step: int, tokens: int) -> str:
        curve = self._curves[key]
        for i in reversed(range(len(self.rungs))):  # the highest rung reached, as Ray Tune judges
            rung, recorded = self.rungs[i], self._recorded[i]
            if tokens < rung or key in recorded:
                continue
            # at the rung itself: equal tokens for every trial (the first validation past it
            # stands in when the curve starts after the rung)
            here = value_at(curve.points, rung)
            here = curve.points[0][1] if here is None else here
            others = list(recorded.values())
            recorded[key] = here
            rf = self.config.prune_reduction_factor
            cutoff = quantile(others, 1 / rf) if others else None
            if cutoff is None or here <= cutoff:
                return ""
            digits = next(d for d in (4, 6, 9, 17) if f"{here:.{d}f}" != f"{cutoff:.{d}f}")  # never 'x above x'
            return (f"val loss {here:.{digits}f} at the {fmt_tokens(rung)}-token rung (step {step}) is not among "
                    f"the best 1/{rf:g} of the {len(others)} trial{'s' * (len(others) > 1)} that reached it "
                    f"before (cutoff {cutoff:.{digits}f})")
        return ""
