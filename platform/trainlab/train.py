"""`trainlab train` / `python -m trainlab.train`: the Hydra app of one trial.

Started by torchrun (WORLD_SIZE in the environment) it runs the engine in-process, no Ray;
otherwise it launches the trial as a Ray gang. Everything below takes a typed RunConfig.
"""

from __future__ import annotations

import dataclasses
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
    to_run_config,
)
from trainlab.redact import redact

register_configs()


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def run_engine_here(run: RunConfig):
    """torchrun path: every process runs the engine; rank 0 tracks, prints progress and, with
    tracking=mlflow, opens the trial's run and closes it with the trial's status."""
    from trainlab.console import ProgressLine, print0, status_text
    from trainlab.distributed import close_distributed
    from trainlab.engine.checkpoint import checkpoint_root
    from trainlab.engine.run import run_trial
    from trainlab.tracking import JsonlTracker
    from trainlab.tracking.runs import (
        close_trial_run,
        closing_tags,
        resolve_tracking_uri,
        spill_path,
        start_trial_tracking,
    )

    opened = []  # the TrialRun rank 0 opened, if any
    spill = spill_path(run.output_dir)  # held MLflow records if the server goes away

    def tracker_factory(dist_info, resumed: bool):
        if run.tracking.name == "mlflow":
            trial, tracker = start_trial_tracking(run, tracking_uri=resolve_tracking_uri(run.tracking.uri),
                                                  checkpoint_root=checkpoint_root(run), resumed=resumed)
            opened.append(trial)
            return tracker
        return JsonlTracker(os.path.join(run.output_dir, "metrics.jsonl"))

    progress = ProgressLine(description="train")
    try:
        result = run_trial(run, tracker_factory=tracker_factory, progress=progress)
    except Exception as e:
        for trial in opened:
            close_trial_run(trial, status=names.STATUS_FAILED, tags=closing_tags(None, f"{type(e).__name__}: {e}"),
                            spill=spill)
        raise
    finally:
        progress.close()
    close_distributed()  # every rank got here: no backend thread is left to abort the exit
    for trial in opened:
        close_trial_run(trial, status=result.status, tags=closing_tags(dataclasses.asdict(result), ""),
                        spill=spill)
    print0(f"status {status_text(result.status, dataclasses.asdict(result))}: {result.steps} steps, "
           f"loss {result.final_loss:.4f}, "
           f"val loss {result.final_val_loss:.4f}, {result.tokens_per_s:,.0f} tokens/s")
    return result


def run_config_from_hydra(cfg: DictConfig) -> RunConfig:
    """The job's typed config with every path absolute (launch.paths): the driver's one resolution."""
    from hydra.core.hydra_config import HydraConfig

    from trainlab.launch.paths import resolve_paths
    from trainlab.redact import redact_files

    if HydraConfig.initialized() and HydraConfig.get().output_subdir:  # Hydra saved the overrides there
        redact_files([os.path.join(HydraConfig.get().runtime.output_dir, HydraConfig.get().output_subdir)])
    run = to_run_config(cfg)
    if not run.output_dir:
        run.output_dir = HydraConfig.get().runtime.output_dir if HydraConfig.initialized() else os.getcwd()
    return resolve_paths(run)


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
    return outcome.result["final_val_loss"] if outcome.result else None


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
