"""The answer people open a comparison for: the fastest configuration whose verdict is ok.

One function (`answer`) computes it from a Summary; `trainlab compare` prints its line first,
report.html and summary.md open with it, and the sweep's parent MLflow run carries it
(tracking.sweep_runs.log_sweep_result), so all of them say the same thing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from trainlab import names
from trainlab.compare.load import load_sweep
from trainlab.compare.records import ConfigRow, Summary
from trainlab.compare.summarize import summarize
from trainlab.console import console
from trainlab.redact import redact
from trainlab.tracking.sweep_runs import log_sweep_result

OK = "ok"  # summarize.verdict's word for "as good as the baseline"


@dataclass(frozen=True)
class Answer:
    """The sweep's result: the winner (None when no configuration is ok) and its numbers."""

    line: str
    """One sentence for a person: the winner with its speedup and val-loss gap, or why none."""
    best: str | None = None  # the winner's configuration label
    baseline: str | None = None
    speedup: float | None = None  # the winner's tokens/s / the baseline's
    val_loss: float | None = None  # the winner's mean final val loss
    delta_val_loss: float | None = None  # vs the baseline at equal tokens (negative = better)
    trials_by_status: tuple[tuple[str, int], ...] = ()
    """Trials per status (names.STATUS_* and UNFINISHED) over every configuration, zeros included;
    a rerun job counts once (its latest attempt, as compare.load reads it)."""


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
    speedup and Δ val loss vs the baseline; when none is ok, a line that says why."""
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


def sweep_answer(*, tracking_uri: str, parent_run_id: str) -> Answer:
    """The answer for a sweep's parent run as `trainlab compare --parent` computes it (default
    baseline, target and tolerance), read back from MLflow; a sweep without trial runs gets
    zero counts and a line that says so."""
    try:
        data = load_sweep(tracking_uri=tracking_uri, parent_run_id=parent_run_id)
    except ValueError as e:  # no trial runs yet (every job refused at submission)
        return Answer(line=f"no configuration is ok: {e}", trials_by_status=_counts(()))
    return answer(summarize(data.trials))


def log_sweep_answer(*, tracking_uri: str, parent_run_id: str) -> Answer | None:
    """sweep_answer onto the parent run (tracking.sweep_runs.log_sweep_result), at a sweep's
    end. None, with a warning, when that fails: the trials' runs are what matter, the parent's
    summary can be had again with `trainlab compare`."""
    from rich.markup import escape


    try:
        result = sweep_answer(tracking_uri=tracking_uri, parent_run_id=parent_run_id)
        log_sweep_result(tracking_uri=tracking_uri, parent_run_id=parent_run_id, result=result)
    except Exception as e:  # noqa: BLE001 - a summary must never fail the sweep it summarizes
        console.print(f"[yellow]warning:[/] the sweep's result was not logged to its parent run "
                      f"{parent_run_id} ({escape(type(e).__name__ + ': ' + redact(str(e))[:300])}); "
                      f"`trainlab compare --parent {parent_run_id}` computes it")
        return None
    return result
