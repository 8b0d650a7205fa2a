"""The one Ray Train run every trainlab gang is, a trial's own (launch.ray_trial) or a warm one
(launch.gang_pool): Ray Train's TorchTrainer with the process group bound to each node's own
address (launch.rendezvous), less the Ray Data plumbing trainlab never uses.

Ray Train (2.60) starts a DatasetManager actor, one process more, for every run, datasets given
or not, and hands the workers a shard provider for `ray.train.get_dataset_shard`. A trainlab
trial reads its own data (trainlab.data) and passes no datasets, so its runs leave that callback
out: on the 2-core CI machine each such process costs 2-3 CPU-seconds of imports at every gang
start. Everything else (placement group cleaner, health checks, failure policy) is Ray Train's.
"""

from __future__ import annotations

from typing import Callable

from ray.train import FailureConfig, ScalingConfig
from ray.train import RunConfig as RayRunConfig
from ray.train.torch import TorchTrainer
from ray.train.v2._internal.callbacks.datasets import DatasetsCallback

from trainlab.distributed import backend_for
from trainlab.launch.rendezvous import BoundTorchConfig


class GangTrainer(TorchTrainer):
    """TorchTrainer without the DatasetsCallback: trainlab gives Ray Train no datasets."""

    def _create_default_callbacks(self):
        return [cb for cb in super()._create_default_callbacks() if not isinstance(cb, DatasetsCallback)]


def gang_run(train_fn: Callable[[dict], None], config: dict, *, device: str, scaling: dict, name: str,
             storage_path: str, max_failures: int, callbacks: list | None = None) -> GangTrainer:
    """The Ray Train run of one gang: `train_fn(config)` on every worker, `scaling`
    (launch.placement.scaling of the gang), `max_failures` restarts of its worker group."""
    return GangTrainer(
        train_fn,
        train_loop_config=config,
        torch_config=BoundTorchConfig(backend=backend_for(device)),  # listens on the node's IP only
        scaling_config=ScalingConfig(**scaling),
        run_config=RayRunConfig(name=name, storage_path=storage_path,
                                failure_config=FailureConfig(max_failures=max_failures), callbacks=callbacks),
    )
