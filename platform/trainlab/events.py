"""What a running trial tells whoever launched it: typed progress events and its result.

Defined once, below the engine: the engine (rank 0) emits them, the Ray launcher carries them
to the driver (Ray pickles dataclasses), and the driver's console, the sweep and the torchrun
path read the same types. Every event has a `kind`:

    start     TrialStarted   an attempt starts training (again after a restart)
    step      StepDone       every train.log_every optimizer steps
    warning, resumed, resized, rollback
              Notice         a line for the person watching
    result    TrialFinished  rank 0's TrialResult, the last thing a gang sends
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Callable, Union

START, STEP, RESULT = "start", "step", "result"
WARNING, RESUMED, RESIZED, ROLLBACK, EXPORTED = "warning", "resumed", "resized", "rollback", "exported"
NOTICE_KINDS = (WARNING, RESUMED, RESIZED, ROLLBACK, EXPORTED)
"""Notices: a message about the trial (resumed, resized and rollback say it went on from a
checkpoint; exported names the folder train.export wrote)."""
PREEMPT, PRUNE = "preempt", "prune"
"""Why the driver stops a running trial: PREEMPT after a checkpoint (a signal), PRUNE without
one (the sweep's pruner); a PRUNE never weakens a PREEMPT."""


def stronger_stop(current: str, asked: str) -> str:
    """Why a trial stops once `asked` (PREEMPT or PRUNE) comes on top of `current` ("" = not yet
    asked): a PRUNE never weakens a PREEMPT (the trial must stay resumable), and a kind that is
    neither reads as PREEMPT. The one rule for every place that holds a stop request."""
    asked = asked if asked in (PREEMPT, PRUNE) else PREEMPT
    return PREEMPT if current == PREEMPT else asked

STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
"""The signals that mean "stop after a checkpoint" (PREEMPT), on the driver (launch.interrupt)
and in a worker that can take signals (engine.preemption): Ctrl-C, `kill` or a scheduler's
notice, and the terminal closing (SIGHUP, whose default would end the process at once and
leave its run RUNNING and a half-written checkpoint behind). The same signal again stops at
once. SIGKILL cannot be handled: the next start cleans up after it."""


@dataclass
class TrialResult:
    """What a finished (or stopped) trial reports back; identical on every rank."""

    status: str
    steps: int
    tokens_seen: int
    final_loss: float
    final_val_loss: float
    tokens_per_s: float
    """Median over steps after the first (which pays for warm-up)."""
    mfu: float | None
    """Median MFU against the peak of the mode's high-precision compute (bf16 for fp8 modes)."""
    peak_mem_gb: float
    """Peak memory since the end of the first step (that step's own when it was the only one)."""
    skipped_steps: int
    nonfinite_steps: int
    loss_spikes: int
    elapsed_s: float
    diverged_step: int | None = None
    first_nonfinite: str = ""
    loss_scale: float | None = None
    mfu_fp8: float | None = None
    """fp8 modes on a GPU with a known FP8 peak: median MFU against that peak."""
    rollbacks: int = 0
    """train.on_divergence=rollback: the divergences the trial rolled back from."""
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class TrialStarted:
    step: int
    """The step it starts from (0, or a checkpoint's)."""
    max_steps: int
    device: str
    """The device's name (`cpu (x86_64)`, `NVIDIA H100 80GB HBM3`)."""
    world_size: int
    unigram_entropy: float
    """The corpus's unigram entropy, nats: the loss a model of token frequencies reaches."""
    true_entropy: float | None = None
    """The corpus's entropy rate where it is known (markov), nats."""
    kind: str = field(default=START, init=False)


@dataclass(frozen=True)
class StepDone:
    step: int
    max_steps: int
    loss: float | None
    tokens_per_s: float | None
    val_loss: float | None = None
    """Set on the steps that validated."""
    tokens: int | None = None
    """Tokens seen by the end of the step: a sweep's pruner compares val losses at equal tokens."""
    kind: str = field(default=STEP, init=False)


@dataclass(frozen=True)
class Notice:
    kind: str
    """One of NOTICE_KINDS."""
    message: str

    def __post_init__(self) -> None:
        assert self.kind in NOTICE_KINDS, self.kind


@dataclass(frozen=True)
class TrialFinished:
    result: TrialResult
    kind: str = field(default=RESULT, init=False)


ProgressEvent = Union[TrialStarted, StepDone, Notice]
"""What a trial sends while it runs."""
Progress = Callable[[ProgressEvent], None]


def step_of(event: ProgressEvent) -> int | None:
    """The step a start or step event reports (None for a notice)."""
    return event.step if isinstance(event, (TrialStarted, StepDone)) else None
