"""Elastic data parallel without a process group: which configs may be elastic (and the message
for those that may not), the config resized to the gang it got, and what Ray and MLflow are
asked for."""

from __future__ import annotations

import pytest

from trainlab import names
from trainlab.config import ConfigError, compose_run_config, config_hash
from trainlab.engine.elastic import elastic_metrics, fit_to_gang, shrunk_note
from trainlab.plan.derive_layout import plan_layout
from trainlab.plan.trial_plan import Where, plan_trial, replan

ELASTIC = ["cluster.num_workers=2", "cluster.min_workers=1", "cluster.max_failures=1",
           "train.global_batch_size=16", "train.micro_batch_size=2"]


def _refused(overrides: list[str]) -> str:
    """The refusal of `overrides`: composition's, or the plan's where the layout cannot run."""
    with pytest.raises(ConfigError) as info:
        plan_layout(compose_run_config(overrides))
    return str(info.value)


@pytest.mark.parametrize("overrides, says", [
    (["cluster.min_workers=3"], ["cluster.min_workers=3", "[0, cluster.num_workers=2]"]),
    (["cluster.min_workers=-1"], ["cluster.min_workers=-1", "[0, cluster.num_workers=2]"]),
    ([*ELASTIC, "cluster.resize_interval_s=0"], ["cluster.resize_interval_s=0.0", "in (0, 86400]"]),
    ([*ELASTIC, "parallel=fsdp"], ["cluster.min_workers=1", "parallel.data_parallel=fsdp", "parallel=ddp"]),
    ([*ELASTIC, "parallel=tp"], ["parallel.tp=2", "parallel=ddp", "cluster.min_workers=0"]),
    ([*ELASTIC, "parallel.dp=2"], ["parallel.dp=2", "parallel.dp=0"]),
    ([*ELASTIC, "parallel.dp_balance=accumulate"], ["parallel.dp_balance=accumulate", "parallel.dp_balance=equal"]),
    ([*ELASTIC, "cluster.max_failures=0"], ["cluster.max_failures=0", "a lost node is a worker failure",
                                            "cluster.max_failures=1"]),
    ([*ELASTIC, "cluster.num_workers=4"],  # 16 sequences do not split over 3 workers of 2-sequence micro-batches
     ["train.global_batch_size=16", "3 workers (2 x 3 = 6)", "multiple of 24", "train.global_batch_size=24"]),
    ([*ELASTIC, "cluster.num_workers=5", "cluster.min_workers=3"],
     ["3 workers (2 x 3 = 6) and 5 workers (2 x 5 = 10)", "multiple of 120", "train.global_batch_size=120"]),
])
def test_configs_that_cannot_be_elastic_are_refused_with_the_fix(overrides, says):
    message = _refused(overrides)
    for part in says:
        assert part in message, message


@pytest.mark.parametrize("overrides", [[], ["cluster.min_workers=2"], ["cluster.num_workers=4", "cluster.min_workers=0"]])
def test_a_fixed_gang_is_not_held_to_the_elastic_rules(overrides):
    run = compose_run_config(["parallel=fsdp", "cluster.max_failures=0", "train.micro_batch_size=2", *overrides])
    assert fit_to_gang(run, world_size=1) is run  # a gang of another size still fails build_trainer's check
    plan = plan_trial(run, Where(device="cpu"))
    assert elastic_metrics(None, plan) == {} and shrunk_note(None, plan) == ""


def test_an_elastic_config_is_resized_to_the_gang_it_got():
    run = compose_run_config([*ELASTIC, "cluster.num_workers=4", "train.global_batch_size=24",
                              "debug.slowdown=[1,2,3,4]"])
    span = (1, 4)
    on3 = fit_to_gang(run, world_size=3)
    assert on3.cluster.num_workers == 3 and on3.debug.slowdown == [1.0, 2.0, 3.0]
    assert on3.train == run.train and on3.parallel == run.parallel  # the global batch is kept
    assert config_hash(on3) != config_hash(run)  # hence run_trial keeps the hash it was launched with
    plan3 = replan(plan_trial(run, Where(device="cpu")), run=on3)  # as run_trial re-plans for the gang it got
    assert elastic_metrics(span, plan3) == {names.GRAD_ACCUM: 4}  # 24 / (2 x 3)
    assert shrunk_note(span, plan3) == "continuing on 3 of 4 workers: global batch 24 kept with 4 micro-batches per step"
    assert shrunk_note(span, plan_trial(run, Where(device="cpu"))) == ""  # the full gang
    assert fit_to_gang(run, world_size=4) is run
    with pytest.raises(ValueError, match="5 workers, outside the range cluster.min_workers=1 to cluster.num_workers=4"):
        fit_to_gang(run, world_size=5)


def test_how_a_trial_survives_faults_is_not_what_it_trains():
    assert config_hash(compose_run_config(ELASTIC)) == config_hash(compose_run_config(
        [*ELASTIC, "cluster.min_workers=0", "cluster.max_failures=0", "cluster.resize_interval_s=5"]))


def test_ray_is_asked_for_a_range_and_the_run_is_tagged_elastic():
    from trainlab.launch.placement import scaling
    from trainlab.plan.trial_plan import GangShape
    from trainlab.tracking.runs import trial_tags

    elastic = compose_run_config([*ELASTIC, "cluster.resize_interval_s=5"])
    fixed = compose_run_config([])
    asked, asked_fixed = scaling(GangShape.of(elastic, gpus=False)), scaling(GangShape.of(fixed, gpus=False))
    assert asked["num_workers"] == (1, 2)
    assert asked["elastic_resize_monitor_interval_s"] == 5.0
    assert asked_fixed["num_workers"] == 2 and "elastic_resize_monitor_interval_s" not in asked_fixed
    assert trial_tags(elastic)[names.TAG_ELASTIC] == "1-2"
    assert names.TAG_ELASTIC not in trial_tags(fixed)
