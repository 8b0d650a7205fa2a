"""Which trials of a sweep may share a warm gang (launch.gang_pool): the same gang shape (worker
count, resources per worker, device) whatever their precision, layout or seed; an elastic trial
never shares one (a resize restarts Ray Train's worker group at another size)."""

from __future__ import annotations

import dataclasses

from trainlab.config import compose_run_config
from trainlab.launch.gang_pool import _plan, shape_key
from trainlab.plan.here import plan_here


def _plan_of(overrides: list[str], *, device: str = "cpu"):
    plan = plan_here(compose_run_config(overrides))
    if device == "cuda":  # as the driver plans it for a cluster with GPUs
        plan = dataclasses.replace(plan, device="cuda", gang=dataclasses.replace(plan.gang, gpus=True))
    return plan


def _key(*overrides: str) -> str:
    return shape_key(_plan_of(["cluster.num_workers=2", *overrides]))


def test_precision_layout_and_seed_share_a_shape_workers_and_resources_do_not():
    base = _key()
    assert _key("precision=bf16", "parallel=fsdp", "seed=4", "train.deterministic=true") == base
    assert _key("cluster.cpus_per_worker=2") != base
    assert shape_key(_plan_of(["cluster.num_workers=1", "parallel=ddp"])) != base
    assert shape_key(_plan_of(["cluster.num_workers=2"], device="cuda")) != base


def test_an_elastic_trial_gets_a_gang_of_its_own_and_says_why():
    elastic = _plan_of(["cluster.num_workers=2", "cluster.min_workers=1", "cluster.max_failures=1"])
    assert "elastic" in _plan(elastic).solo
    assert _plan(_plan_of(["cluster.num_workers=2"])).solo == ""
