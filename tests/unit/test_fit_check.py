"""A trial's estimate where it is planned (estimate.fit_check, launch.estimate_cluster): placement keeps
a trial off GPU types its estimate overfills, a trial no type can hold is refused with the numbers
and the fix, a running cluster's nodes become the cluster estimated on, and a trial planned in
process (torchrun, a test) carries its estimate."""

from __future__ import annotations

import re

import pytest

from trainlab.config import compose_run_config
from trainlab.estimate.fit_check import refusal
from trainlab.estimate.trial_estimate import estimate_trial
from trainlab.launch.estimate_cluster import ray_cluster
from trainlab.launch.placement import GpuPool, PlacementError, place
from trainlab.plan.derive_layout import plan_layout
from trainlab.plan.here import plan_here
from trainlab.vocab.gpus import ray_type_of
from trainlab.vocab.nodes import ClusterSpec, NodeSpec

POOLS = [GpuPool("V100", 2, 1), GpuPool("H100", 2, 1)]
BIG = ["model=7b", "parallel=fsdp", "precision=fp16", "cluster.num_workers=2"]
"""7B on 2 ranks, fully sharded: its per-rank state fits an H100's memory, not a V100's."""


def _run(*overrides: str):
    return compose_run_config(["model=tiny", *overrides])


def _fits(run, node: str) -> bool:
    return estimate_trial(run, ClusterSpec.of_nodes([node]), trial_layout=plan_layout(run)).fits


def test_same_type_passes_over_a_type_the_estimate_does_not_fit():
    big = _run(*BIG)
    assert not _fits(big, "2xV100") and _fits(big, "2xH100")  # the premise, by the estimate itself
    assert place(_run("precision=fp16"), POOLS).types == ("V100",)  # the least capable type that holds it
    assert place(big, POOLS).types == ("H100",)
    assert place(_run(*BIG, "cluster.placement=pack"), POOLS).types == ("H100",)


def test_a_trial_no_type_can_hold_is_refused_with_the_numbers_and_the_fix():
    run = _run("model=7b", "parallel=ddp", "precision=fp16", "cluster.num_workers=2")
    with pytest.raises(PlacementError) as e:
        place(run, POOLS)
    msg = str(e.value)
    est = estimate_trial(run, ClusterSpec.of_nodes(["2xH100"]), trial_layout=plan_layout(run))
    for kind in ("V100", "H100"):
        assert re.search(rf"{kind}: by its estimate, rank \d needs [\d.]+ GB \(parameters [\d.]+, .*\) but its "
                         rf"{kind} holds [\d.]+ GB \(short by [\d.]+ GB\)", msg), msg
    assert f"needs {est.tightest.memory.total_gb:.1f} GB" in msg
    assert "parallel=fsdp" in msg and "train.micro_batch_size (now 8)" in msg


def test_the_refusal_names_only_fixes_the_config_does_not_use_already():
    run = _run("model=7b", "parallel=fsdp", "parallel.activation_checkpoint=block", "train.micro_batch_size=1",
               "train.global_batch_size=2", "cluster.num_workers=2")
    est = estimate_trial(run, ClusterSpec.of_nodes(["2xV100"]), trial_layout=plan_layout(run))
    assert not est.fits
    msg = refusal(run, est)
    assert "activation_checkpoint=block" not in msg and "micro_batch_size" not in msg
    assert "cluster.num_workers=2" in msg  # more ranks to shard over
    run = _run()
    assert refusal(run, estimate_trial(run, ClusterSpec.of_nodes(["2xH100"]), trial_layout=plan_layout(run))) is None


def test_a_running_clusters_nodes_are_read_by_type_and_count():
    nodes = [
        {"Alive": True, "Resources": {"CPU": 8, "GPU": 4, "accelerator_type:V100": 1}},
        {"Alive": True, "Resources": {"CPU": 8, "GPU": 8, "accelerator_type:H100": 1}},
        {"Alive": True, "Resources": {"CPU": 8, "GPU": 4, "accelerator_type:V100": 1}},
        {"Alive": False, "Resources": {"CPU": 8, "GPU": 8, "accelerator_type:A100": 1}},
        {"Alive": True, "Resources": {"CPU": 6}},
    ]
    run = _run("cluster.cpus_per_worker=2")
    assert ray_cluster(nodes, run, gpus=True).nodes == (NodeSpec("H100", 8), NodeSpec("V100", 4), NodeSpec("V100", 4))
    assert ray_cluster(nodes, run, gpus=True, types=("V100",)).describe() == "4xV100 + 4xV100"
    assert ray_cluster(nodes, run, gpus=False).nodes == (NodeSpec("cpu", 4),) * 3 + (NodeSpec("cpu", 3),)
    with pytest.raises(ValueError, match="cluster.nodes="):
        ray_cluster(nodes, run, gpus=True, types=("B200",))


def test_cuda_device_names_become_rays_accelerator_types():
    assert ray_type_of("NVIDIA H100 80GB HBM3") == "H100"
    assert ray_type_of("Tesla V100-SXM2-16GB") == "V100"
    assert ray_type_of("NVIDIA A100-SXM4-80GB") == "A100"


def test_a_trial_planned_in_process_carries_its_estimate():
    run = _run("cluster.num_workers=2", "tracking=none")
    plan = plan_here(run)
    assert plan.estimate is not None
    assert [r.device.name for r in plan.estimate.ranks] == ["cpu", "cpu"]
    expected = estimate_trial(run, ClusterSpec.cpu(ranks=2), trial_layout=plan_layout(run))
    assert plan.estimate.tokens_per_step == expected.tokens_per_step


def test_a_planned_estimate_refuses_a_gpu_or_cpu_gang_and_lets_an_unknown_device_go_on():
    """The one rule the Ray driver and torchrun apply (estimate.fit_check.checked_estimate): a
    trial that does not fit is refused wherever it would run (issue 28: a CPU host's memory too,
    which used to be a warning and then an allocation of terabytes in the worker)."""
    from trainlab.config import ConfigError
    from trainlab.estimate.fit_check import checked_estimate, estimate_run

    run = compose_run_config(["model=7b", "parallel=ddp", "precision=fp16", "cluster.num_workers=2"])
    est = estimate_trial(run, ClusterSpec.of_nodes(["2xV100"]), trial_layout=plan_layout(run))
    warned: list[str] = []
    with pytest.raises(ConfigError, match=r"rank \d needs [\d.]+ GB .* holds [\d.]+ GB .*fix: parallel=fsdp"):
        checked_estimate(run, lambda: est, warn=warned.append)
    small_host = estimate_trial(run, ClusterSpec.cpu(ranks=2), trial_layout=plan_layout(run))  # 7b on a host
    with pytest.raises(ConfigError, match=r"rank \d needs [\d.]+ GB .* its cpu holds [\d.]+ GB"):
        checked_estimate(run, lambda: small_host, warn=warned.append)
    # a model no layout could hold: refused from its dimensions, without building 10,000 blocks
    huge = _run("model.n_layers=10000", "model.dim=1000000", "cluster.num_workers=2")
    with pytest.raises(ConfigError, match=r"model.n_layers=10000 model.dim=1000000 .* training it takes at least "
                                          r"[\d,.]+ GB .*\(cpu\) hold [\d,.]+ GB together; fix: a smaller model"):
        checked_estimate(huge, lambda: estimate_run(huge, ClusterSpec.cpu(ranks=2), trial_layout=plan_layout(huge)),
                         warn=warned.append)
    assert not warned

    def unknown():
        raise ValueError("cluster.nodes entry 'X1' is not a GPU type the estimate knows")

    assert checked_estimate(run, unknown, warn=warned.append) is None
    assert warned[-1].startswith("no estimate of the trial: cluster.nodes")
