"""The driver's view of one trial: check, open the MLflow run, run the gang, close, summarise."""

from __future__ import annotations

import dataclasses
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rich.markup import escape

from trainlab import names
from trainlab.config import ConfigError, RunConfig
from trainlab.config.load import hashed_config
from trainlab.console import ProgressLine, console, fmt, status_text, summary_table
from trainlab.engine.checkpoint import CheckpointError, checkpoint_root
from trainlab.engine.resume import resolve_resume, verify_here
from trainlab.launch import interrupt
from trainlab.launch.paths import resolve_paths
from trainlab.launch.preflight import preflight
from trainlab.redact import redact
from trainlab.tracking.resume import open_or_resume_trial_run, unfinished_trial
from trainlab.tracking.runs import (
    TrialRun,
    close_trial_run,
    closing_tags,
    default_run_name,
    resolve_tracking_uri,
    tracker_options,
    trial_tags,
    ui_command,
)
from trainlab.tracking.store_uri import credentials_env


@dataclass
class TrialOutcome:
    status: str
    result: dict | None
    """Rank 0's TrialResult as a dict (None when the trial failed before reporting)."""
    run_id: str | None
    tracking_uri: str | None
    error: str = ""
    interrupted: int = 0
    """The signal (SIGINT, SIGTERM) that stopped the trial before its end; 0 if none did."""
    last_step: int | None = None
    """The last step the workers reported (what the tracker recorded), also when they failed."""


def train(run: RunConfig, *, parent_run_id: str | None = None, extra_tags: dict | None = None,
          show_progress: bool = True, on_event: Callable[[dict], None] | None = None,
          runner: Callable[..., dict | None] | None = None) -> TrialOutcome:
    """Run one trial on Ray (local cluster unless cluster.address is set) and record it.

    `runner` runs the planned trial and returns rank 0's result (run_on_ray's signature and
    contract); by default a Ray Train gang of its own (run_on_ray), in a sweep a warm gang
    (launch.gang_pool)."""
    run = resolve_paths(run)  # workers run elsewhere: absolute paths (a no-op for the CLI's, resolved already)
    uses_mlflow = run.tracking.name == "mlflow"
    uri = resolve_tracking_uri(run.tracking.uri) if uses_mlflow else None
    device = preflight(run, tracking_uri=uri)  # raises ConfigError before anything starts
    found = unfinished_trial(run, tracking_uri=uri, parent_run_id=parent_run_id) if uses_mlflow else None
    root = found.root if found else checkpoint_root(run)  # a rerun goes on where the trial stopped
    run = dataclasses.replace(run, train=dataclasses.replace(run.train, checkpoint_dir=str(root)))
    # the workers' config: cluster.device as resolved here ('auto' on a remote cluster matches any)
    fields = hashed_config(dataclasses.replace(run, cluster=dataclasses.replace(run.cluster, device=device)))
    try:  # every file read back against its digest at save; another config's checkpoint refused
        resuming = resolve_resume(run.train.resume, root, expect_config=fields, verify=verify_here,
                                  warn=lambda m: console.print(f"[yellow]warning:[/] {m}")) is not None
    except CheckpointError as e:  # damaged, missing or another trial's: refused before any worker starts
        raise ConfigError(str(e)) from None
    gang = plan(run, device)
    if interrupt.current().signum:  # while Ray started: no run opened, nothing to resume
        return interrupt.before_start(uri)
    out_dir = Path(run.output_dir or ".").resolve()
    out_dir.mkdir(parents=True, exist_ok=True)

    trial: TrialRun | None = None
    if uses_mlflow:
        trial, _ = open_or_resume_trial_run(run, tracking_uri=uri, tags={**trial_tags(run), **(extra_tags or {})},
                                            root=root, resuming=resuming, parent_run_id=parent_run_id)
    if found is not None and show_progress:
        console.print(f"resuming trial {default_run_name(run)} from step {found.step} of its run {trial.run_id} "
                      f"(checkpoint {found.root}); train.resume=never starts over", soft_wrap=True)
    options = tracker_options(run)  # its spill file is the writer's and this close's, for an outage
    spill = options["spill_path"]
    mlflow_payload = None if trial is None else {
        "run_id": trial.run_id, "tracking_uri": trial.tracking_uri, **options,
        "credentials": credentials_env(),  # a worker on another node lacks this driver's environment
    }

    from trainlab.launch.ray_trial import run_on_ray

    progress = ProgressLine(description=default_run_name(run)) if show_progress else None

    last_step: list[int] = []

    def events(event: dict) -> None:
        if event.get("kind") in ("start", "step") and isinstance(event.get("step"), int):
            last_step[:] = [event["step"]]
        if progress is not None:
            progress(event)
        if on_event is not None:
            on_event(event)

    result, error = None, ""
    try:
        result = (runner or run_on_ray)(run, gang=gang, storage_path=str(out_dir / "ray"),
                                        name=default_run_name(run), mlflow_run=mlflow_payload, on_event=events)
        status = result["status"] if result else names.STATUS_FAILED
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

    if trial is not None:
        close_trial_run(trial, status=status, tags=closing_tags(result, error), spill=spill)
    outcome = TrialOutcome(status=status, result=result, run_id=trial.run_id if trial else None,
                           tracking_uri=uri, error=error, last_step=last_step[0] if last_step else None)
    if status == names.STATUS_PREEMPTED and interrupt.current().signum:
        outcome.interrupted = interrupt.current().signum
    if show_progress:
        print_summary(run, outcome, out_dir)
        if outcome.interrupted:
            interrupt.say_stopped(run, step=(result or {}).get("steps", outcome.last_step or 0), root=root,
                                  tracked=trial is not None, at_once=result is None)
    return outcome


def plan(run: RunConfig, device: str):
    """The trial's gang on the cluster (see ray_trial.plan_gang); a trial no GPU type can run
    is a ConfigError at submission, with each type's reason, instead of a gang pending forever."""
    from trainlab.launch.placement import PlacementError
    from trainlab.launch.ray_trial import plan_gang

    try:
        return plan_gang(run, device)
    except PlacementError as e:
        raise ConfigError(str(e)) from None


def print_summary(run: RunConfig, outcome: TrialOutcome, out_dir: Path) -> None:
    r = outcome.result or {}
    extra = r.get("extra", {})
    rows = {
        # the error as it is (torch's "[enforce fail at ...]" is no rich markup), credentials masked
        "status": status_text(outcome.status, r) + (f" ({escape(redact(outcome.error))})" if outcome.error else ""),
        "steps": (f"{r['steps']} ({r.get('tokens_seen', 0):,} tokens)" if "steps" in r
                  else f"{outcome.last_step or 0} (the last the workers reported)"),
        "train loss": fmt(r.get("final_loss"), ".4f"),
        "val loss": fmt(r.get("final_val_loss"), ".4f"),
        "unigram entropy": fmt(extra.get("unigram_entropy"), ".4f"),
        "tokens/s": fmt(r.get("tokens_per_s"), ",.0f"),
        "MFU": fmt(r.get("mfu"), ".2%"),
        "skipped / non-finite steps": f"{r.get('skipped_steps', '-')} / {r.get('nonfinite_steps', '-')}",
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
    console.print(summary_table(f"trial {default_run_name(run)}", rows))
