"""Routing trials to the GPU types of a mixed cluster: by precision, by the trial's asks, and a
clear refusal (one reason per type) when no type can run a trial."""

from __future__ import annotations

import pytest

from trainlab.config import compose_run_config
from trainlab.launch.placement import GpuPool, Placement, PlacementError, gpu_pools, place, scaling_options

MIXED = [GpuPool("H100", gpus=2, nodes=1), GpuPool("A100", gpus=2, nodes=1), GpuPool("V100", gpus=4, nodes=2)]


def _run(*overrides: str):
    return compose_run_config(["model=tiny", "cluster.device=cuda", "cluster.num_workers=2", *overrides])


def test_pools_come_from_ray_nodes_by_accelerator_type():
    nodes = [
        {"Alive": True, "Resources": {"CPU": 8, "GPU": 2, "accelerator_type:H100": 1}},
        {"Alive": True, "Resources": {"CPU": 8, "GPU": 4, "accelerator_type:V100": 1}},
        {"Alive": True, "Resources": {"CPU": 8, "GPU": 4, "accelerator_type:V100": 1}},
        {"Alive": False, "Resources": {"CPU": 8, "GPU": 8, "accelerator_type:A100": 1}},
        {"Alive": True, "Resources": {"CPU": 16}},
    ]
    assert gpu_pools(nodes) == [GpuPool("V100", 8, 2), GpuPool("H100", 2, 1)]


@pytest.mark.parametrize(("precision", "types"), [
    ("fp8_tensorwise", ("H100",)),
    ("bf16", ("H100", "A100")),
    ("fp16", ("H100", "A100", "V100")),
])
def test_each_precision_goes_to_the_types_that_can_run_it(precision, types):
    assert place(_run(f"precision={precision}", "cluster.placement=pack"), MIXED).types == types


def test_same_type_takes_the_least_capable_pool_that_holds_the_whole_gang():
    # fp16 runs anywhere: it goes to the V100s and leaves the H100s to the trials that need them
    assert place(_run("precision=fp16"), MIXED).types == ("V100",)
    assert place(_run("precision=bf16"), MIXED).types == ("A100",)
    assert place(_run("precision=fp8_tensorwise"), MIXED).types == ("H100",)
    assert place(_run("precision=fp16", "cluster.num_workers=4", "train.global_batch_size=32"), MIXED).types == ("V100",)
    with pytest.raises(PlacementError, match="same_type"):
        place(_run("precision=bf16", "cluster.num_workers=3", "train.global_batch_size=24"), MIXED)
    mixed = place(_run("precision=bf16", "cluster.num_workers=3", "train.global_batch_size=24", "cluster.placement=spread"), MIXED)
    assert (mixed.types, mixed.strategy) == (("H100", "A100"), "SPREAD")


def test_trial_asks_narrow_the_types():
    assert place(_run("precision=fp16", "cluster.accelerator_type=A100"), MIXED).types == ("A100",)
    assert place(_run("precision=fp16", "cluster.min_capability=8.0", "cluster.placement=pack"),
                 MIXED).types == ("H100", "A100")


def test_a_trial_no_type_can_run_is_refused_with_each_types_reason():
    with pytest.raises(PlacementError) as info:
        place(_run("precision=fp8_tensorwise"), [GpuPool("A100", 8, 1), GpuPool("V100", 8, 1)])
    msg = str(info.value)
    assert "precision=fp8_tensorwise" in msg
    assert "A100: " in msg and "V100: " in msg and "FP8 tensor cores" in msg
    with pytest.raises(PlacementError, match="no GPU nodes"):
        place(_run("precision=bf16"), [])


def test_bad_capability_and_placement_values_name_the_field():
    with pytest.raises(ValueError, match="cluster.min_capability='sm90'"):
        place(_run("cluster.min_capability=sm90"), MIXED)
    with pytest.raises(ValueError, match="cluster.placement='anywhere'"):
        _run("cluster.placement=anywhere")


def test_placement_becomes_ray_train_scaling_options():
    from ray.train import ScalingConfig

    one = scaling_options(Placement(types=("H100",), strategy="PACK"))
    assert one == {"accelerator_type": "H100", "placement_strategy": "PACK"}
    two = scaling_options(Placement(types=("H100", "A100"), strategy="SPREAD"), all_types=("H100", "A100", "V100"))
    assert two["label_selector"] == {"ray.io/accelerator-type": "in(H100, A100)"}
    every = scaling_options(Placement(types=("H100", "V100"), strategy="PACK"), all_types=("V100", "H100"))
    assert every == {"placement_strategy": "PACK"}  # any GPU of the cluster will do
    ScalingConfig(num_workers=2, use_gpu=True, **one)  # keywords Ray Train accepts
    ScalingConfig(num_workers=2, use_gpu=True, **two)
