"""trainlab.names: the names other systems carry, decided once."""

from __future__ import annotations

import pytest

from trainlab.names import ray_name


# issue 28: refusals
@pytest.mark.parametrize("name", ["café", "run-🚀", "ünï code", "漢字"])
def test_a_non_ascii_run_name_gets_one_ascii_form_for_ray(name):
    """Ray Train's metric tags must be ASCII: a café run used to pass every check, then fail in Ray."""
    ascii_form = ray_name(name)
    assert ascii_form.isascii() and ascii_form.isprintable() and ascii_form
    assert ascii_form == ray_name(name)  # the same name, the same form
    assert ray_name(name + "x") != ascii_form  # two names stay two


def test_an_ascii_run_name_reaches_ray_as_it_is_and_cafe_stays_readable():
    assert ray_name("tiny-bf16-ddp2-s0") == "tiny-bf16-ddp2-s0"
    assert ray_name("café").startswith("cafe-")


def test_ray_gets_the_ascii_form_and_mlflow_keeps_the_users_name(tmp_path):
    from trainlab.config import compose_run_config
    from trainlab.launch.executors import RayGang
    from trainlab.plan.trial_plan import Where, plan_trial
    from trainlab.tracking.runs import default_run_name

    run = compose_run_config(["model=tiny", "tracking=none", "tracking.run_name='café'", f"output_dir={tmp_path}"])
    seen = {}

    def runner(plan, *, name, **_):
        seen["name"] = name

    class Tracking:
        def open(self, **_):
            return None

    RayGang(runner).execute(plan_trial(run, Where(device="cpu")), Tracking(), on_event=print, stop=None)
    assert seen["name"] == ray_name("café") and default_run_name(run) == "café"
