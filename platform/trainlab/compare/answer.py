"""The answer people open a comparison for: the fastest configuration whose verdict is ok.

One function (`answer`) computes it, once, where the sweep is summarized (summarize puts it on
the Summary as `summary.answer`); `trainlab compare` prints its line first, report.html and
summary.md open with it, and the sweep's parent MLflow run carries it
(tracking.sweep_runs.log_sweep_result), so all of them say the same thing. A study of several
objectives has a trade-off as well as a winner: its answer also names the Pareto front
(compare.pareto), on the line after.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from trainlab import names
from trainlab.compare import pareto
from trainlab.compare.records import Answer, ConfigRow, Summary

OK = "ok"  # summarize.verdict's word for "as good as the baseline"


UNFINISHED = "unfinished"  # running, preempted or stopped without a status: ConfigRow.n_running
COUNTED = ((names.STATUS_FINISHED, "n_finished"), (names.STATUS_FAILED, "n_failed"),
           (names.STATUS_DIVERGED, "n_diverged"), (names.STATUS_PRUNED, "n_pruned"),
           (UNFINISHED, "n_running"))


def _counts(rows: tuple[ConfigRow, ...]) -> tuple[tuple[str, int], ...]:
    return tuple((status, sum(getattr(r, field) for r in rows)) for status, field in COUNTED)


def _speed(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _why_none(summary: Summary) -> str:
    """Why no configuration is ok, e.g. 'precision=fp4 degraded, precision=fp8 diverged'."""
    others = [r for r in summary.rows if not r.is_baseline]
    if not others:
        return "the sweep has no configuration besides the baseline"
    verdicts = Counter(r.verdict or "-" for r in others)
    if len(others) <= 4:  # few: name each; many: count them
        return ", ".join(f"{r.label} {r.verdict or '-'}" for r in others)
    return ", ".join(f"{n} {v}" for v, n in verdicts.most_common())


def answer(summary: Summary) -> Answer:
    """The fastest configuration whose verdict is ok (highest speedup; ties by label), with its
    speedup and Δ val loss vs the baseline; when none is ok, a line that says why. In a study of
    several objectives, also its Pareto front and the line that names it."""
    result = _fastest_ok(summary)
    if not pareto.has_front(summary.objectives):
        return result
    return replace(result, pareto_front=summary.pareto_front,
                   pareto_line=pareto.front_line(summary.objectives, summary.pareto_front))


def _fastest_ok(summary: Summary) -> Answer:
    counts = _counts(summary.rows)
    if summary.baseline is None:
        return Answer(line="no configuration is ok: no configuration has a finished trial to be the "
                           "baseline", trials_by_status=counts)
    ok = [r for r in summary.rows if r.verdict == OK]
    if not ok:
        return Answer(line=f"no configuration is ok against the baseline {summary.baseline}: "
                           f"{_why_none(summary)}", baseline=summary.baseline, trials_by_status=counts)
    best = min(ok, key=lambda r: (-(r.speedup if r.speedup is not None else -1.0), r.label))
    gap = "-" if best.delta_val_loss is None else f"{best.delta_val_loss:+.3g}"
    slower = "; slower than the baseline, which stays the fastest" if (
        best.speedup is not None and best.speedup < 1) else ""
    line = (f"fastest ok: {best.label}: speedup {_speed(best.speedup)} vs the baseline {summary.baseline}, "
            f"Δ val loss {gap} at equal tokens"
            + ("" if best.final_val_loss_mean is None else f" (val loss {best.final_val_loss_mean:.4f})")
            + slower)
    return Answer(line=line, best=best.label, baseline=summary.baseline, speedup=best.speedup,
                  val_loss=best.final_val_loss_mean, delta_val_loss=best.delta_val_loss,
                  trials_by_status=counts)


def without_trials(why: str) -> Answer:
    """The answer of a sweep that has no trial runs to read: zero counts and a line that says why."""
    return Answer(line=f"no configuration is ok: {why}", trials_by_status=_counts(()))
