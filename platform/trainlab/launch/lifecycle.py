"""One trial's lifecycle, written once; executors (launch.executors) differ only in how they run the workers.

    plan      plan_for(run, executor.where): the lifecycle's one planning call
    own       the trial's lease (launch.lease) on its checkpoint folder, taken as soon as the plan
              decided that folder (a Ray driver: before Ray starts) and before anything of the trial
              is written, given back on every way out: a second driver is refused naming the holder
    start     the trial's MLflow run (none with tracking=none), tracking.trial_tracking.TrialTracking:
              opened by the driver before any worker starts, or by rank 0 of a gang without one
              once its ranks agreed on the checkpoint they start from
    execute   executor.execute: a Ray gang, a torchrun rank, or this process alone
    track     the progress events: the progress line, the last step, the caller's on_event
    interrupt Ctrl-C / SIGTERM (launch.interrupt): the gang stops after a checkpoint, the run ends KILLED
    finish    where it started: the run closed with the trial's status and result, the summary
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path
from typing import Callable

from rich.markup import escape

from trainlab import names
from trainlab.config import RunConfig
from trainlab.config.checkpoints import start_over
from trainlab.console import ProgressLine, console, fmt, status_text, summary_table
from trainlab.events import ProgressEvent, step_of
from trainlab.launch import interrupt, lease
from trainlab.launch.executors import CLUSTER, Executor, RayGang, Runner
from trainlab.launch.outcome import TrialOutcome
from trainlab.launch.plan import plan_launch
from trainlab.plan.here import plan_here
from trainlab.plan.trial_plan import TrialPlan
from trainlab.redact import redact
from trainlab.tracking.mlflow_ui import run_link
from trainlab.tracking.runs import default_run_name
from trainlab.tracking.store import resolve_tracking_uri, ui_command
from trainlab.tracking.trial_tracking import TrialTracking


def plan_for(run: RunConfig, where: str, *, parent_run_id: str | None = None,
             claim: Callable[[Path], None] | None = None) -> TrialPlan:
    """The trial's plan, made once, against `where` (launch.executors): the cluster the Ray
    driver joins (launch.plan.plan_launch: checks, placement, the resume) or this process's
    device (plan.here.plan_here). ConfigError before anything of the trial starts. `claim`:
    takes the trial's lease once its checkpoint folder is decided, before Ray starts."""
    if where == CLUSTER:
        return plan_launch(run, parent_run_id=parent_run_id, claim=claim)
    uri = resolve_tracking_uri(run.tracking.uri) if run.tracking.name == "mlflow" else None
    return plan_here(run, tracking_uri=uri)


def train(run: RunConfig | TrialPlan, *, executor: Executor | None = None, parent_run_id: str | None = None,
          extra_tags: dict | None = None, show_progress: bool = True,
          on_event: Callable[[ProgressEvent], None] | None = None, stop: interrupt.StopRequest | None = None,
          runner: Runner | None = None) -> TrialOutcome:
    """Run one trial and record it: plan, own, start, execute, finish (the module's docstring).
    A RunConfig is planned first (plan_for: ConfigError before anything starts); a TrialPlan
    (a sweep plans every trial before the first starts) runs as it is. `executor`: how its
    workers run, by default a Ray gang of its own on local Ray unless cluster.address is set;
    `runner` (run_on_ray's signature: a sweep's warm gang, launch.gang_pool) is RayGang(runner).
    `stop`: the sweep's pruner may end it early through it (status pruned, with the reason)."""
    assert executor is None or runner is None, "a runner is a RayGang's"
    executor = executor or RayGang(runner)
    held: list[lease.Lease] = []

    def claim(root: Path) -> None:  # LeaseHeld: one line naming the holder
        if owns_trial(executor) and not held:
            held.append(lease.acquire(root))

    try:
        # -- plan, and own: one driver per trial, from when its checkpoint folder is decided (a
        # Ray driver: before Ray starts) and before anything of it is written (its run, its checkpoints)
        try:
            plan = run if isinstance(run, TrialPlan) else plan_for(run, executor.where, parent_run_id=parent_run_id,
                                                                   claim=claim)
        except interrupt.StopBeforeStart:  # a signal during its checks: nothing of it started
            return interrupt.before_start(None, show=show_progress)
        claim(Path(plan.paths.checkpoint_root))  # planned elsewhere (a sweep) or here (no Ray)
        if interrupt.current().signum:  # while Ray started: no run opened, nothing to resume
            return interrupt.before_start(plan.tracking_uri, show=show_progress)
        return _train_owned(plan, executor=executor, parent_run_id=parent_run_id, extra_tags=extra_tags,
                            show_progress=show_progress, on_event=on_event, stop=stop)
    finally:
        for h in held:
            h.release()


def owns_trial(executor: Executor) -> bool:
    """Whether this process is the trial's driver (holds its lease): not a torchrun rank but rank 0."""
    return not executor.ranked or os.environ.get("RANK", "0") == "0"


def _train_owned(plan: TrialPlan, *, executor: Executor, parent_run_id: str | None, extra_tags: dict | None,
                 show_progress: bool, on_event: Callable[[ProgressEvent], None] | None,
                 stop: interrupt.StopRequest | None) -> TrialOutcome:
    """train() once this process holds the trial's lease: start, execute, finish."""
    run, root = plan.run, Path(plan.paths.checkpoint_root)
    out_dir = Path(plan.paths.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    # -- start: where the plan decided the resume, the run opens before any worker starts ----
    tracking = TrialTracking(plan, tags=extra_tags, parent_run_id=parent_run_id)
    if executor.where == CLUSTER:
        tracking.open(resuming=plan.resuming)
    if plan.continues_run and show_progress:
        console.print(f"resuming trial {default_run_name(run)} from step {plan.resume_step} of its run "
                      f"{tracking.run.run_id} (checkpoint {root}); {start_over(root)} starts over",
                      soft_wrap=True)

    # -- execute, following its progress ------------------------------------------------------
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
        result = executor.execute(plan, tracking, on_event=events, stop=stop)
        status = result.status if result else names.STATUS_FAILED
        if result is None and interrupt.current().signum:  # let go before it could save
            status = names.STATUS_PREEMPTED
            interrupt.current().cut_off.append(root)  # its save in progress, if any, is removed at the end
        elif result is None:
            error = "the workers ended without reporting a result"
    except Exception as e:  # a worker failed: record it, never lose the run
        status = names.STATUS_FAILED
        error = f"{type(e).__name__}: {e}"
        if executor.ranked:  # the process ends with it (torchrun reports the rank that failed)
            if tracking.started:
                tracking.close(status=status, result=None, error=error)
            raise
        traceback.print_exc()
    finally:
        if progress is not None:
            progress.close()

    # -- finish: on the driver, or the rank that started the trial's tracking ----------------
    pruned_reason = stop.reason if stop is not None and status == names.STATUS_PRUNED else ""
    trial = tracking.run
    outcome = TrialOutcome(status=status, result=result, run_id=trial.run_id if trial else None,
                           tracking_uri=plan.tracking_uri, error=error,
                           last_step=last_step[0] if last_step else None, pruned_reason=pruned_reason,
                           experiment_id=trial.experiment_id if trial else "")
    if executor.ranked and not tracking.started:  # a rank other than 0: it only executed
        return outcome
    tracking.close(status=status, result=result, error=error, pruned_reason=pruned_reason)
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
