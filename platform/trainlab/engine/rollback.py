"""The divergence policy's rollback: back to the last good checkpoint, retry more carefully.

With ``train.on_divergence=rollback`` a trial whose loss went non-finite does not end. Every
rank rebuilds its trainer, loads the newest checkpoint (each was saved at a finite step: the
loop stops on the step that diverged, before any save), or starts over when none was written
yet; if a retry diverges again before saving a newer checkpoint, the next one goes back
further (that checkpoint led nowhere good). It trains on with the whole learning-rate schedule times ``train.rollback_lr_factor``
(compounding over retries) and/or in ``train.rollback_precision``. After
``train.max_rollbacks`` retries a divergence ends the trial as ``diverged`` after all.

The retry's state travels with its checkpoints: the optimizer and schedule carry the lowered
learning rate and ``trainlab.json`` the `Rollback` record (count, learning-rate scale,
precision), so a worker restarted after a rollback resumes in the retry's precision and
learning rate.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainlab.config import RunConfig
from trainlab.config.schema import PrecisionConfig

if TYPE_CHECKING:
    from trainlab.config.checkpoints import Checkpoint


@dataclass
class Rollback:
    """How far a trial has rolled back: the state its current attempt runs with."""

    count: int = 0
    """Rollbacks so far (0: the first attempt)."""
    lr_scale: float = 1.0
    """The learning-rate schedule's multiplier (rollback_lr_factor ** count)."""
    precision: str = ""
    """The precision retries run in; empty = the trial's own."""
    history: str = ""
    """One entry per rollback, for a person: 'step 6 -> 4 (lr x0.5, fp32)'."""
    back_to: int = -1
    """The step the last rollback went back to (-1: none yet)."""

    def next(self, run: RunConfig, *, diverged_at: int, back_to: int) -> Rollback:
        """The state of the retry after a divergence at step `diverged_at`, resumed at `back_to`."""
        t = run.train
        lr_scale = self.lr_scale * t.rollback_lr_factor
        precision = t.rollback_precision or self.precision
        how = ", ".join(x for x in (f"lr x{lr_scale:g}" if lr_scale != 1.0 else "", precision) if x)
        entry = f"step {diverged_at} -> {back_to} ({how})"
        return Rollback(count=self.count + 1, lr_scale=lr_scale, precision=precision,
                        history="; ".join(x for x in (self.history, entry) if x), back_to=back_to)

    def target(self, checkpoints: list[Checkpoint]) -> Checkpoint | None:
        """The checkpoint to go back to among `checkpoints` (oldest first; None = step 0): the
        newest, unless the retry from it diverged before saving a newer one; then one before it."""
        if not checkpoints:
            return None
        if checkpoints[-1].step > self.back_to:
            return checkpoints[-1]
        older = [c for c in checkpoints if c.step < self.back_to]
        return older[-1] if older else None

    def as_state(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_state(cls, state: dict | None) -> Rollback:
        return cls(**state) if state else cls()


def rolls_back(run: RunConfig, rollback: Rollback) -> bool:
    """A diverged attempt is retried: the policy is on and retries are left."""
    return run.train.on_divergence == "rollback" and rollback.count < run.train.max_rollbacks


def attempt_config(run: RunConfig, rollback: Rollback) -> RunConfig:
    """The config an attempt builds its trainer from: the trial's, in the retry's precision."""
    if not rollback.precision or rollback.precision == run.precision.name:
        return run
    return dataclasses.replace(run, precision=PrecisionConfig(name=rollback.precision))


def scale_lr(trainer, *, loaded: float, wanted: float) -> None:
    """Set the trainer's learning-rate schedule to `wanted` times the configured one; the
    optimizer and schedule it loaded from a checkpoint carry `loaded` times it (1 for none)."""
    ratio = wanted / loaded
    if ratio == 1.0:
        return
    for group in trainer.optimizer.param_groups:  # ZeRO-1: the wrapper's, copied to the shard's
        group["lr"] *= ratio
        if "initial_lr" in group:
            group["initial_lr"] *= ratio
    trainer.scheduler.base_lrs = [lr * ratio for lr in trainer.scheduler.base_lrs]
    # what get_last_lr() reports until the next step: the rate the optimizer now applies
    trainer.scheduler._last_lr = [group["lr"] for group in trainer.optimizer.param_groups]
