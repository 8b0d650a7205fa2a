"""What a sweep prints and writes about its trials: the estimated compute before the first starts,
one line per trial as it ends, the summary table (also the parent run's trials.md), the links
into MLflow's UI and sweep_timing.json."""

from __future__ import annotations

import json
from pathlib import Path

from rich.markup import escape

from trainlab import names
from trainlab.console import console, fmt, status_text
from trainlab.events import TrialResult
from trainlab.launch.sweep_trial import Trial, pick
from trainlab.redact import redact
from trainlab.tracking.mlflow_ui import sweep_link_lines


def print_links(uri: str, parent_id: str, run_ids: list[str | None]) -> None:
    """Where to look at the sweep in MLflow's UI; a store that stopped answering costs no more."""
    try:
        lines = sweep_link_lines(uri, parent_run_id=parent_id, run_ids=[r for r in run_ids if r])
    except Exception as e:  # the sweep is recorded; only its links are missing
        lines = [f"(no MLflow links: {redact(str(e)).splitlines()[0][:200]})"]
    for line in lines:
        console.print(line, markup=False, soft_wrap=True)  # one line each: a terminal opens it whole


def write_timing(trials: list[Trial], *, wall_s: float, concurrency: int, sweep_dir: Path) -> None:
    """sweep_timing.json in the multirun folder: how long trials waited, trained and took."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    rows = [{"idx": t.idx, "overrides": t.overrides, "status": t.status, "skipped": t.skipped,
             "gang": t.gang, "plan_s": t.extra.get("plan_s"), "start_latency_s": t.start_latency_s,
             "train_s": t.result.elapsed_s if t.result else None,
             "wall_s": (t.ended_at - t.submitted_at) if t.submitted_at else None} for t in trials]
    (sweep_dir / "sweep_timing.json").write_text(json.dumps(
        {"wall_s": wall_s, "concurrency": concurrency, "trials": rows}, indent=2))


def compute_line(todo: list[Trial]) -> str:
    """The sweep's estimated compute, before its first trial starts: each trial's estimated step
    time x train.max_steps x its ranks (trainlab.estimate, as planned), summed."""
    estimated = [t for t in todo if t.plan is not None and t.plan.estimate is not None]
    device_s = sum(t.plan.estimate.step_time_s * t.run.train.max_steps * len(t.plan.estimate.ranks)
                   for t in estimated)
    devices = sorted({t.plan.device for t in estimated}) or ["device"]
    amount = f"{device_s / 3600:,.2f} {'/'.join(devices)}-hours" if device_s >= 360 else \
        f"{device_s:,.0f} {'/'.join(devices)}-seconds"
    missing = f"; {len(todo) - len(estimated)} trials without an estimate" if len(estimated) < len(todo) else ""
    return (f"estimated compute: {amount} for {len(todo)} trials (step time x train.max_steps x ranks, "
            f"summed){missing}")


def status_markup(status: str, result: TrialResult | None = None, pruned_reason: str = "") -> str:
    color = {names.STATUS_FINISHED: "green", names.STATUS_DIVERGED: "yellow",
             names.STATUS_PRUNED: "cyan"}.get(status, "red")
    return f"[{color}]{escape(status_text(status, result, pruned_reason=pruned_reason))}[/]"


def report_table(trials: list[Trial], *, keys: list[str], wall_s: float, ran: list[Trial]) -> str:
    """Print the per-trial table; return it as Markdown for the parent run."""
    from rich.table import Table

    table = Table(title="sweep summary", title_justify="left")
    header = ["#", "trial", "status", "val loss", "tokens/s", "start s", "train s", "run id"]
    for h in header:
        table.add_column(h)
    rows = []
    for t in trials:
        r = t.result
        row = [str(t.idx), pick(t.overrides, keys),
               t.status + (f" at step {r.steps}" if t.status == names.STATUS_PRUNED and r else "")
               + (" (skipped: done before)" if t.skipped else " (resumed)" if t.resumed else "")
               + (f" (rolled back {r.rollbacks}x)" if r and r.rollbacks else ""),
               fmt(r.final_val_loss if r else t.extra.get("val_loss"), ".4f"),
               fmt(r.tokens_per_s if r else t.extra.get("tokens_per_s"), ",.0f"),
               fmt(t.start_latency_s, ".1f"), fmt(r and r.elapsed_s, ".1f"), t.run_id or "-"]
        rows.append(row)
        table.add_row(*row[:2], status_markup(t.status) + row[2][len(t.status):], *row[3:])
    console.print(table)
    for t in trials:
        if t.status == names.STATUS_PRUNED and t.pruned_reason:  # a person wants to know why
            console.print(f"#{t.idx} {escape(pick(t.overrides, keys))} pruned: {escape(t.pruned_reason)}")
    if ran:
        console.print(f"sweep wall time {wall_s:.1f}s for {len(ran)} trials")
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(md) + "\n"
