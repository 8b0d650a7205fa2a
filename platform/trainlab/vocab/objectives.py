"""What a trial returns to a Hydra sweeper (hydra.launcher.objective), decided once.

    trainlab train -m hydra/sweeper=optuna hydra.launcher.objective=[val_loss,tokens_per_s] \
        'hydra.sweeper.direction=[minimize,maximize]' ...

Each objective has the direction a sweeper must optimize it in; the value a trial returned is
logged on its run as `objective/<name>` (names.objective_metric), so compare's Pareto front
reads exactly what the sweeper saw. The launcher returns one
float per objective, in the order given (a single objective as a plain float, as Hydra's sweepers
expect); the sweep's parent run records them (tag TAG_OBJECTIVE), and with several `trainlab
compare` marks the configurations on the Pareto front of exactly these metrics.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainlab import names

MINIMIZE, MAXIMIZE = "minimize", "maximize"


@dataclass(frozen=True)
class Objective:
    name: str
    """Its name in hydra.launcher.objective."""
    direction: str
    """MINIMIZE or MAXIMIZE: what the sweeper's direction must say for it."""
    what: str
    """One line for errors and docs."""

    @property
    def metric(self) -> str:
        """The metric each trial run carries with the value its sweeper got (compare's Pareto front
        reads it): `objective/<name>`."""
        return names.objective_metric(self.name)

    @property
    def better(self) -> int:
        """-1 where lower is better, +1 where higher is."""
        return -1 if self.direction == MINIMIZE else 1


OBJECTIVES: dict[str, Objective] = {o.name: o for o in (
    Objective("val_loss", MINIMIZE,
              "val loss at equal tokens (hydra.launcher.objective_tokens; 0 = each trial's last validation)"),
    Objective("tokens_per_s", MAXIMIZE, "training throughput, tokens per second (train/tokens_per_s)"),
    Objective("peak_mem_gb", MINIMIZE, "peak memory per rank in the steady state, GB (rank 0's, sys/peak_mem_gb)"),
    Objective("time_to_loss", MINIMIZE,
              "seconds of training to reach hydra.launcher.target_loss (tokens to it / tokens per second; "
              "inf where it never does)"),
)}
DEFAULT_OBJECTIVE = ("val_loss",)


def objective(name: str) -> Objective:
    """The objective of that name; ValueError naming the known ones."""
    try:
        return OBJECTIVES[name]
    except KeyError:
        raise ValueError(f"hydra.launcher.objective: {name!r} is not an objective; use one or several of "
                         f"{', '.join(OBJECTIVES)} (e.g. hydra.launcher.objective=[val_loss,tokens_per_s])") from None


def parse_objectives(text: str) -> tuple[Objective, ...]:
    """The comma list the parent run's TAG_OBJECTIVE holds (what `trainlab compare` reads back)."""
    return tuple(objective(n.strip()) for n in text.split(",") if n.strip())
