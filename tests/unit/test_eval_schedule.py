"""train.eval_every: auto gives every run a val curve, long runs validate every 50 steps, and an
explicit value means what it says; auto keeps the config hash the fixed default had."""

from __future__ import annotations

import pytest

from trainlab.config import compose_run_config, config_hash


@pytest.mark.parametrize(("overrides", "interval"), [
    (["train.max_steps=8"], 1),          # auto: every step, 8 points
    (["train.max_steps=20"], 4),         # auto: 5 points
    (["train.max_steps=150"], 30),       # the demo's default length: 5 points, not 3
    (["train.max_steps=5000"], 50),      # long: as cheap as the fixed default was
    (["train.max_steps=20", "train.eval_every=50"], 50),  # explicit: what it says (the end only)
    (["train.max_steps=20", "train.eval_every=3"], 3),
    (["train.max_steps=20", "train.eval_every=0"], 0),    # only at the end
])
def test_eval_interval(overrides, interval):
    assert compose_run_config(["model=tiny", *overrides]).train.eval_interval == interval


def test_auto_hashes_as_the_fixed_default_did():
    auto = compose_run_config(["model=tiny", "train.max_steps=20"])
    assert auto.train.eval_every == -1
    assert config_hash(auto) == config_hash(compose_run_config(["model=tiny", "train.max_steps=20",
                                                                "train.eval_every=50"]))
    assert config_hash(auto) != config_hash(compose_run_config(["model=tiny", "train.max_steps=20",
                                                                "train.eval_every=10"]))


def test_a_bad_value_names_the_rule():
    with pytest.raises(ValueError, match=r"train.eval_every=-2 .*-1 = auto, 0 = only at the end"):
        compose_run_config(["train.eval_every=-2"])
