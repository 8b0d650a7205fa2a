"""How `trainlab calibrate` reads a run back (calibrate.observations): the RunConfig from the params as
tracking logged them (every type of field: ints, floats, None, lists, per-run keys from their
tags), and the cluster from the hardware tags the trial set."""

from __future__ import annotations

import pytest

from trainlab import names
from trainlab.calibrate.observations import cluster_of, run_config_of
from trainlab.config import compose_run_config, flatten
from trainlab.tracking.runs import config_of, split_config
from trainlab.vocab.nodes import ClusterSpec, NodeSpec


@pytest.mark.parametrize("overrides", [
    ["model=tiny", "train.max_steps=7", "optim.lr=3e-4"],
    ["model=small", "precision=fp8_tensorwise", "parallel=fsdp", "cluster.num_workers=2"],
    ["precision=bf16_pure", "parallel=ddp", "cluster.num_workers=2", "parallel.dp_weights=[1,2.5]",
     "output_dir=/tmp/x y", "seed=3"],
])
def test_a_run_config_comes_back_from_its_params(overrides):
    run = compose_run_config(overrides)
    knobs, tags = split_config(run)  # as open_trial_run logs them: str(value) params, per-run keys as tags
    params = {k: str(v) for k, v in knobs.items()}
    back = run_config_of(config_of(params, tags))
    assert flatten(back) == flatten(run)


def test_a_key_the_schema_lost_is_named():
    run = compose_run_config(["model=tiny"])
    knobs, tags = split_config(run)
    params = {**{k: str(v) for k, v in knobs.items()}, "train.gone_knob": "3"}
    with pytest.raises(ValueError, match="gone_knob"):
        run_config_of(config_of(params, tags))


@pytest.mark.parametrize(("tags", "expected"), [
    ({names.TAG_DEVICE_TYPES: "cpu (x86_64):2", names.TAG_NODE_COUNT: "1"}, [NodeSpec("cpu", 2)]),
    ({names.TAG_DEVICE_TYPES: "H100:16", names.TAG_NODE_COUNT: "2"}, [NodeSpec("H100", 8), NodeSpec("H100", 8)]),
    ({names.TAG_DEVICE_TYPES: "H100:3", names.TAG_NODE_COUNT: "2"}, [NodeSpec("H100", 2), NodeSpec("H100", 1)]),
    ({names.TAG_DEVICE_TYPES: "A100:2,H100:2", names.TAG_NODE_COUNT: "2"}, [NodeSpec("A100", 2), NodeSpec("H100", 2)]),
])
def test_the_cluster_comes_back_from_the_hardware_tags(tags, expected):
    cluster = cluster_of(tags, {"cluster.network_gb_s": "25.0"})
    assert cluster == ClusterSpec(nodes=tuple(expected), network_gb_s=25.0, source="store")


def test_a_run_without_hardware_tags_is_named():
    with pytest.raises(ValueError, match=names.TAG_DEVICE_TYPES):
        cluster_of({}, {})
