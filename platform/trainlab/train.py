"""`trainlab train` / `python -m trainlab.train`: the Hydra app of one trial.

Started by torchrun (WORLD_SIZE in the environment) it runs the engine in-process, no Ray;
otherwise it launches the trial as a Ray gang. Everything below takes a typed RunConfig.
"""

from __future__ import annotations

import os
import sys

import hydra
from omegaconf import DictConfig

from trainlab import names
from trainlab.config import (
    CONF_DIR,
    ConfigError,
    RunConfig,
    register_configs,
)
from trainlab.launch.paths import run_config_from_hydra
from trainlab.redact import redact

register_configs()


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def run_engine_here(run: RunConfig):
    """torchrun path: every process executes the trial's plan, made here as there is no driver
    (plan.here); rank 0 tracks the trial as the Ray path does (tracking.trial_tracking:
    the same run, tags, tracker and closing), prints its progress and the same summary."""
    from pathlib import Path

    from trainlab.console import ProgressLine
    from trainlab.distributed import close_distributed
    from trainlab.engine.run import run_trial
    from trainlab.launch.outcome import TrialOutcome
    from trainlab.launch.trial import print_summary
    from trainlab.plan.here import plan_here
    from trainlab.tracking.runs import default_run_name
    from trainlab.tracking.store_uri import resolve_tracking_uri
    from trainlab.tracking.trial_tracking import TrackingTarget, close_trial, open_trial, rank0_tracker

    uri = resolve_tracking_uri(run.tracking.uri) if run.tracking.name == "mlflow" else None
    plan = plan_here(run, tracking_uri=uri)
    opened = []  # rank 0's run (None with tracking=none): only rank 0 makes a tracker

    def tracker_factory(dist_info, resumed: bool):
        trial = open_trial(plan, resuming=resumed) if uri else None
        opened.append(trial)
        return rank0_tracker(plan, TrackingTarget(trial))

    progress = ProgressLine(description=default_run_name(run))
    try:
        result = run_trial(plan, tracker_factory=tracker_factory, progress=progress)
    except Exception as e:
        for trial in opened:
            close_trial(plan, trial, status=names.STATUS_FAILED, result=None, error=f"{type(e).__name__}: {e}")
        raise
    finally:
        progress.close()
    close_distributed()  # every rank got here: no backend thread is left to abort the exit
    for trial in opened:
        close_trial(plan, trial, status=result.status, result=result)
        outcome = TrialOutcome(status=result.status, result=result, run_id=trial.run_id if trial else None,
                               tracking_uri=uri, last_step=result.steps,
                               experiment_id=trial.experiment_id if trial else "")
        print_summary(run, outcome, Path(plan.paths.output_dir))
    return result


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def app(cfg: DictConfig) -> float | None:
    try:
        run = run_config_from_hydra(cfg)
        if under_torchrun():
            result = run_engine_here(run)
            return result.final_val_loss
        from trainlab.launch.interrupt import interruptible, release_cluster
        from trainlab.launch.trial import train

        with interruptible():  # Ctrl-C / SIGTERM: stop after a checkpoint, end the run KILLED
            outcome = train(run)
    except ConfigError as e:
        print(f"error: {redact(str(e))}", file=sys.stderr)
        sys.exit(2)
    if outcome.interrupted:  # nothing of the trial outlives the command
        release_cluster()
        sys.exit(128 + outcome.interrupted)
    if outcome.status == names.STATUS_FAILED:
        sys.exit(1)
    return outcome.result.final_val_loss if outcome.result else None


def main() -> None:
    """The command: the overrides composed once first, so a bad one is a one-line error with
    exit status 2 (as every bad input) rather than Hydra's report; then the Hydra app."""
    from trainlab.config.overrides import check_overrides

    try:
        check_overrides(sys.argv[1:])
    except ConfigError as e:
        print(f"error: {redact(str(e))}", file=sys.stderr)
        sys.exit(2)
    app()


if __name__ == "__main__":
    main()
