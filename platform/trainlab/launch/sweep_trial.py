"""One job of a multirun as the launcher holds it (Trial), and how a person reads it: the swept
keys and a trial's values of them ('optim.lr=0.003 precision=bf16')."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from hydra.core.utils import JobReturn

from trainlab.config import RunConfig
from trainlab.events import TrialResult
from trainlab.launch import interrupt
from trainlab.launch.preflight import TrialChecks
from trainlab.plan.trial_plan import TrialPlan


@dataclass
class Trial:
    idx: int
    overrides: list[str]
    run: RunConfig
    job_return: JobReturn | None = None
    label: str = ""
    status: str = "pending"
    run_id: str | None = None
    plan: TrialPlan | None = None
    """As the driver resolved it before the first trial started (launch.plan)."""
    checks: TrialChecks | None = None
    """What the sweep's checks found of it (run_sweep): its plan checks none of it again; None
    where no sweep checked it (execute_sweep called directly): its plan checks it all."""
    result: TrialResult | None = None
    error: str = ""
    skipped: bool = False
    resumed: bool = False
    """Stopped before its end in an earlier run of the sweep: goes on from its checkpoints."""
    pruned_reason: str = ""
    """Status pruned: why hydra.launcher.prune stopped it."""
    submitted_at: float = 0.0
    first_step_at: float | None = None
    ended_at: float = 0.0
    extra: dict = field(default_factory=dict)
    gang: str = ""
    """Which gang ran it (tag `gang`): 'warm #3 on gang 1' or 'fresh: <why> (gang 2)'."""
    stop: interrupt.StopRequest = field(default_factory=interrupt.StopRequest)
    """stop(reason) ends this trial alone after its step, `pruned` (the sweep's pruner; its gang
    then takes the next)."""

    curve: list[tuple[int, float]] = field(default_factory=list)
    """(tokens seen, val loss) at each validation, as its events came: what its objectives read."""
    objective_values: tuple[float, ...] | None = None
    """What it returned to the sweeper (launch.objectives), one value per objective."""

    @property
    def start_latency_s(self) -> float | None:
        return None if self.first_step_at is None else self.first_step_at - self.submitted_at


def key_value(override: str) -> tuple[str, str]:
    key, _, value = override.lstrip("+~").partition("=")
    return key, value


def varied_keys(job_overrides: Sequence[Sequence[str]]) -> list[str]:
    """Override keys whose value differs between jobs (or that only some jobs set): the
    dimensions of the sweep."""
    per_job = [dict(key_value(o) for o in overrides) for overrides in job_overrides]
    keys = set().union(*per_job) if per_job else set()
    return sorted(k for k in keys if len({job.get(k) for job in per_job}) > 1)


def pick(overrides: Sequence[str], keys: list[str], *, skip: tuple[str, ...] = ()) -> str:
    """The overrides of `keys` (minus `skip`) as 'k=v k=v', the way a person reads a trial."""
    pairs = [key_value(o) for o in overrides]
    return " ".join(f"{k}={v}" for k, v in pairs if k in keys and k not in skip) or "default"


def search_keys(task_overrides: Sequence[str], sweeper_params: dict | None) -> list[str]:
    """The keys a sweeper searches: the command line's sweep overrides (`a=1,2`, `interval(...)`,
    `range(...)`, `choice(...)`) and hydra.sweeper.params's. A study's trials are labelled by these
    from its first batch on, whatever values that batch happened to draw."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    lines = [*task_overrides, *(f"{k}={v}" for k, v in (sweeper_params or {}).items())]
    parsed = OverridesParser.create().parse_overrides([str(line) for line in lines])
    return sorted({o.get_key_element().lstrip("+~") for o in parsed if o.is_sweep_override()})
