"""The Ray Train run of a gang (launch.ray_train_run): Ray Train's own, less the Ray Data
plumbing (a DatasetManager actor, one process more at every gang start) for datasets trainlab
never gives it."""

from __future__ import annotations

from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

from trainlab.launch.ray_train_run import gang_run
from trainlab.launch.rendezvous import BoundTorchConfig


def _fn(config: dict) -> None:
    pass


def test_a_gang_run_starts_no_dataset_manager_and_keeps_the_rest_of_ray_train(tmp_path):
    trainer = gang_run(_fn, {"x": 1}, device="cpu", scaling={"num_workers": 2, "use_gpu": False},
                       name="g", storage_path=str(tmp_path), max_failures=3)
    kinds = [type(cb) for cb in trainer._create_default_callbacks()]
    assert DatasetsCallback not in kinds
    assert PlacementGroupCleanerCallback in kinds  # a dead controller's placement group is still removed
    assert isinstance(trainer.backend_config, BoundTorchConfig) and trainer.backend_config.backend == "gloo"
    assert trainer.scaling_config.num_workers == 2
    assert trainer.run_config.failure_config.max_failures == 3
