"""How a sweep names its trials: the swept dimensions, the label seeds are aggregated over."""

from __future__ import annotations

from trainlab.launch.sweep_trial import pick as _pick
from trainlab.launch.sweep_trial import varied_keys


def test_varied_keys_are_the_dimensions_that_differ():
    jobs = [["model=tiny", "precision=fp32", "seed=0"], ["model=tiny", "precision=fp16", "seed=0"],
            ["model=tiny", "precision=fp32", "seed=1"], ["model=tiny", "precision=fp16", "seed=1"]]
    assert varied_keys(jobs) == ["precision", "seed"]


def test_a_key_only_some_jobs_set_is_a_dimension():
    jobs = [["+sweep=x", "optim.lr=0.001"], ["+sweep=x"]]
    assert varied_keys(jobs) == ["optim.lr"]
    assert varied_keys([["model=tiny"]]) == []


def test_labels_drop_the_seed_and_the_fixed_overrides():
    keys = ["precision", "seed"]
    assert _pick(["model=tiny", "precision=fp16", "seed=1"], keys, skip=("seed",)) == "precision=fp16"
    assert _pick(["model=tiny", "precision=fp16", "seed=1"], keys) == "precision=fp16 seed=1"
    assert _pick(["model=tiny", "seed=1"], ["seed"], skip=("seed",)) == "default"
