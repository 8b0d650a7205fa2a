"""`trainlab train` / `python -m trainlab.train`: the Hydra app of one trial.

It picks the executor of the trial's one lifecycle (launch.lifecycle.train): started by torchrun
(WORLD_SIZE in the environment) this process is one rank of the gang, no Ray (launch.executors.
Torchrun); otherwise the trial runs as a Ray gang (RayGang). Everything below takes a typed RunConfig.
"""

from __future__ import annotations

import logging
import os
import sys

import hydra
from omegaconf import DictConfig

from trainlab import names
from trainlab.config import (
    CONF_DIR,
    ConfigError,
    register_configs,
)
from trainlab.launch.paths import run_config_from_hydra
from trainlab.redact import redact

register_configs()


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def app(cfg: DictConfig) -> float | None:
    from trainlab.launch.executors import RayGang, Torchrun
    from trainlab.launch.interrupt import release_cluster
    from trainlab.launch.lifecycle import train

    executor = Torchrun() if under_torchrun() else RayGang()
    try:
        run = run_config_from_hydra(cfg)
        # Ray's driver: a stop signal (events.STOP_SIGNALS) stops after a checkpoint, ends the run KILLED
        with executor.signals():
            outcome = train(run, executor=executor)
            if outcome.interrupted:  # nothing of the trial outlives the command (inside: a signal again hurries it)
                release_cluster()
    except ConfigError as e:
        print(f"error: {redact(str(e))}", file=sys.stderr)
        sys.exit(2)
    if outcome.interrupted:
        sys.exit(128 + outcome.interrupted)
    if outcome.status == names.STATUS_FAILED:
        sys.exit(1)
    return outcome.result.final_val_loss if outcome.result else None


def main() -> None:
    """The command: the overrides composed once first, so a bad one is a one-line error with
    exit status 2 (as every bad input) rather than Hydra's report; then the Hydra app."""
    from trainlab.config.overrides import check_overrides
    from trainlab.config.study_rule import storage_override
    from trainlab.plan.derive_layout import plan_layout

    try:  # the layout too (the plan's check, before Hydra makes its folder and before torch loads)
        composed = check_overrides(sys.argv[1:], check_run=plan_layout)
    except ConfigError as e:
        print(f"error: {redact(str(e))}", file=sys.stderr)
        sys.exit(2)
    storage = storage_override(composed)  # Hydra's Optuna sweeper: its study shared with the launcher
    if storage is not None:
        sys.argv.append(storage)
    # Optuna's sweeper imports alembic, whose every plugin says "setup plugin ..." through Hydra's INFO logging
    logging.getLogger("alembic").setLevel(logging.WARNING)
    try:
        app()
    finally:  # a multirun ended (Hydra returned, or a sweeper raised): its study's table, answer and parent
        study = sys.modules.get("trainlab.launch.study")  # imported only where a multirun ran
        outcomes = study.close_open_studies() if study is not None else []
    failed = sum(o.failed for o in outcomes)
    if failed:
        from trainlab.console import console

        console.print(f"[red]{failed} of {sum(o.trials for o in outcomes)} trials failed[/]")
        sys.exit(1)


if __name__ == "__main__":
    main()
