"""The driver's view of one trial: plan it (launch.plan), open its MLflow run, run the gang, close, summarise."""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Callable

from rich.markup import escape

from trainlab import names
from trainlab.config import RunConfig
from trainlab.console import ProgressLine, console, fmt, status_text, summary_table
from trainlab.events import ProgressEvent, TrialResult, step_of
from trainlab.launch import interrupt
from trainlab.launch.outcome import TrialOutcome
from trainlab.launch.plan import plan_launch
from trainlab.plan.trial import TrialPlan
from trainlab.redact import redact
from trainlab.tracking.mlflow_ui import run_link
from trainlab.tracking.runs import TrialRun, default_run_name
from trainlab.tracking.store_uri import credentials_env, ui_command
from trainlab.tracking.trial_tracking import TrackingTarget, close_trial, open_trial


def train(run: RunConfig | TrialPlan, *, parent_run_id: str | None = None, extra_tags: dict | None = None,
          show_progress: bool = True, on_event: Callable[[ProgressEvent], None] | None = None,
          stop: interrupt.StopRequest | None = None,
          runner: Callable[..., TrialResult | None] | None = None) -> TrialOutcome:
    """Run one trial on Ray (local cluster unless cluster.address is set) and record it.
    A RunConfig is planned first (launch.plan.plan_launch: ConfigError before anything
    starts); a TrialPlan (a sweep plans every trial before the first starts) runs as it is.
    `stop`: the sweep's pruner may end it early through it (status pruned, with the reason).
    `runner` runs the planned trial and returns rank 0's result (run_on_ray's signature and
    contract); by default a Ray Train gang of its own (run_on_ray), in a sweep a warm gang
    (launch.gang_pool)."""
    plan = run if isinstance(run, TrialPlan) else plan_launch(run, parent_run_id=parent_run_id)
    run, uri, root = plan.run, plan.tracking_uri, Path(plan.paths.checkpoint_root)
    if interrupt.current().signum:  # while Ray started: no run opened, nothing to resume
        return interrupt.before_start(uri)
    out_dir = Path(plan.paths.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    trial: TrialRun | None = None
    if uri is not None:
        trial = open_trial(plan, resuming=plan.resuming, tags=extra_tags, parent_run_id=parent_run_id)
    if plan.continues_run and show_progress:
        console.print(f"resuming trial {default_run_name(run)} from step {plan.resume_step} of its run "
                      f"{trial.run_id} (checkpoint {root}); train.resume=never starts over",
                      soft_wrap=True)
    target = TrackingTarget(trial, credentials=credentials_env() if trial else {})

    from trainlab.launch.ray_trial import run_on_ray

    progress = ProgressLine(description=default_run_name(run)) if show_progress else None

    last_step: list[int] = []

    def events(event: ProgressEvent) -> None:
        if step_of(event) is not None:
            last_step[:] = [step_of(event)]
        if progress is not None:
            progress(event)
        if on_event is not None:
            on_event(event)

    result, error = None, ""
    try:
        result = (runner or run_on_ray)(plan, name=default_run_name(run), tracking=target, on_event=events,
                                        stop=stop)
        status = result.status if result else names.STATUS_FAILED
        if result is None and interrupt.current().signum:  # let go before it could save
            status = names.STATUS_PREEMPTED
        elif result is None:
            error = "the workers ended without reporting a result"
    except Exception as e:  # a worker failed: record it, never lose the run
        status = names.STATUS_FAILED
        error = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    finally:
        if progress is not None:
            progress.close()

    pruned_reason = stop.reason if stop is not None and status == names.STATUS_PRUNED else ""
    close_trial(plan, trial, status=status, result=result, error=error, pruned_reason=pruned_reason)
    outcome = TrialOutcome(status=status, result=result, run_id=trial.run_id if trial else None,
                           tracking_uri=uri, error=error, last_step=last_step[0] if last_step else None,
                           pruned_reason=pruned_reason, experiment_id=trial.experiment_id if trial else "")
    if status == names.STATUS_PREEMPTED and interrupt.current().signum:
        outcome.interrupted = interrupt.current().signum
    if show_progress:
        print_summary(run, outcome, out_dir)
        if outcome.interrupted:
            interrupt.say_stopped(run, step=result.steps if result else outcome.last_step or 0, root=root,
                                  tracked=trial is not None, at_once=result is None)
    return outcome


def print_summary(run: RunConfig, outcome: TrialOutcome, out_dir: Path) -> None:
    r = outcome.result
    extra = r.extra if r else {}

    def value(name: str):  # of the result, None without one
        return getattr(r, name) if r else None

    rows = {
        # the error as it is (torch's "[enforce fail at ...]" is no rich markup), credentials masked
        "status": status_text(outcome.status, r) + (f" ({escape(redact(outcome.error))})" if outcome.error else ""),
        "steps": (f"{r.steps} ({r.tokens_seen:,} tokens)" if r
                  else f"{outcome.last_step or 0} (the last the workers reported)"),
        "train loss": fmt(value("final_loss"), ".4f"),
        "val loss": fmt(value("final_val_loss"), ".4f"),
        "unigram entropy": fmt(extra.get("unigram_entropy"), ".4f"),
        "tokens/s": fmt(value("tokens_per_s"), ",.0f"),
        "MFU": fmt(value("mfu"), ".2%"),
        "skipped / non-finite steps": f"{r.skipped_steps} / {r.nonfinite_steps}" if r else "- / -",
        "output dir": str(out_dir),
    }
    if extra.get("true_entropy"):
        rows["true entropy"] = fmt(extra["true_entropy"], ".4f")
    if extra.get(names.TAG_PARAMS_SHA):  # the first 12 hex tell runs apart at a glance
        rows["checksums (params / loss)"] = (f"{extra[names.TAG_PARAMS_SHA][:12]} / "
                                             f"{extra[names.TAG_LOSS_CURVE_SHA][:12]}")
    if outcome.run_id:
        rows["MLflow run"] = f"{outcome.run_id} in {redact(outcome.tracking_uri)}"
        rows["view it"] = ui_command(outcome.tracking_uri)
        if outcome.experiment_id:
            rows["run page"] = run_link(outcome.tracking_uri, experiment_id=outcome.experiment_id,
                                        run_id=outcome.run_id)
    console.print(summary_table(f"trial {default_run_name(run)}", rows))
