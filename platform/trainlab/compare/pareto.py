"""The Pareto front of a study of several objectives: the configurations no other one beats on all.

A sweeper given several objectives (hydra.launcher.objective=[val_loss,tokens_per_s]) finds a
trade-off, not a winner, so compare marks the configurations on its front, from exactly the values
the sweeper got (`objective/<name>` on each trial run, vocab.objectives), each configuration's
seeds averaged. A sweep of one objective has no front: nothing here is shown for it.

Pure functions over records; summarize fills ConfigRow.objective_values and ConfigRow.pareto.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from trainlab import names
from trainlab.compare import curves
from trainlab.compare.records import ConfigRow, Trial
from trainlab.vocab.objectives import Objective

Point = tuple[float | None, ...]
"""A configuration's value of each objective, in the study's order; None where it has none."""

MEASURED = (names.STATUS_FINISHED, names.STATUS_PRUNED)
"""The trials whose objective values count: a pruned trial's value is what its sweeper got too."""


def has_front(objectives: Sequence[Objective]) -> bool:
    """A front needs two objectives at least; with one, the answer's winner says it all."""
    return len(objectives) >= 2


def trial_value(trial: Trial, objective: Objective) -> float | None:
    """What the trial returned to its sweeper for `objective`; None where it did not finish or
    prune, or the value is not finite (a diverged trial's inf says it lost, not by how much)."""
    if trial.status not in MEASURED:
        return None
    return curves.last_value(trial.series(objective.metric))


def objective_means(trials: Sequence[Trial], objectives: Sequence[Objective]) -> Point:
    """One configuration's point: per objective, the mean over its trials with a value."""
    out = []
    for o in objectives:
        values = [v for v in (trial_value(t, o) for t in trials) if v is not None]
        out.append(math.fsum(values) / len(values) if values else None)
    return tuple(out)


def dominates(a: Point, b: Point, better: Sequence[int]) -> bool:
    """a is at least as good as b on every objective and strictly better on one (better: -1 where
    lower is better, +1 where higher is, per objective). A point with a None dominates nothing."""
    if None in a or None in b:
        return False
    signed = [(s * x, s * y) for s, x, y in zip(better, a, b, strict=True)]
    return all(x >= y for x, y in signed) and any(x > y for x, y in signed)


def non_dominated(points: Sequence[Point], better: Sequence[int]) -> list[bool]:
    """For each point, whether no other point dominates it. Equal points do not dominate each other:
    both are on the front. A point missing a value is not on it."""
    return [None not in p and not any(dominates(q, p, better) for q in points) for p in points]


def front(rows: Sequence[ConfigRow], objectives: Sequence[Objective]) -> tuple[str, ...]:
    """The labels of the rows on the front of their objective_values, best first on the first
    objective (then the next ones, then the label): read left to right, it trades the first
    objective for the others. () for fewer than two objectives."""
    if not has_front(objectives):
        return ()
    better = [o.better for o in objectives]
    on = [r for r, ok in zip(rows, non_dominated([r.objective_values for r in rows], better)) if ok]
    return tuple(r.label for r in sorted(on, key=lambda r: (
        *(-s * v for s, v in zip(better, r.objective_values)), r.label)))


def arrow(objective: Objective) -> str:
    return "↑" if objective.better > 0 else "↓"


def better_words(objective: Objective) -> str:
    return "higher is better" if objective.better > 0 else "lower is better"


def front_line(objectives: Sequence[Objective], labels: Sequence[str]) -> str:
    """The line after the answer, e.g. 'Pareto front (val_loss ↓, tokens_per_s ↑): A; B'."""
    head = ", ".join(f"{o.name} {arrow(o)}" for o in objectives)
    body = "; ".join(labels) if labels else (
        "none (no configuration has a finished or pruned trial with a finite value of every objective)")
    return f"Pareto front ({head}): {body}"
