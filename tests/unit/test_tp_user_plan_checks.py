"""model.tp_plan is checked before launch, on the driver: every refusal names model.tp_plan (or
the field it conflicts with), the value, and a fix; a plan that fits goes through the same checks
and the memory estimate reads the shards it makes (one place decides them: parallel.tp.tp_plan)."""

from __future__ import annotations

import pytest
import torch

from custom_model import TP_PLAN
from trainlab.config import compose_run_config
from trainlab.config.convert import hashed_config
from trainlab.config.validate import check_run
from trainlab.launch.preflight import check_layout
from trainlab.models import build_model
from trainlab.parallel.tp import check_user_plan, param_shard_dims
from trainlab.plan.derive_layout import plan_layout

RUN = ["model=custom", "model._target_=custom_model.build_split", "model.dim=32", "model.n_layers=2",
       "model.n_heads=4", "data=text", "train.seq_len=32", "cluster.device=cpu", "parallel=tp",
       "cluster.num_workers=2"]


def as_override(plan: dict[str, str]) -> str:
    return "model.tp_plan={" + ",".join(f"{k}:{v}" for k, v in plan.items()) + "}"


def _checked(overrides: list[str], *, base: list[str] = RUN):
    run = compose_run_config([*base, *overrides])
    check_run(run)
    plan_layout(run)
    check_layout(run)
    return run


def _split_model():
    with torch.device("meta"):
        return build_model(compose_run_config(RUN).model, vocab_size=256, shapes_only=True)


def test_a_plan_from_the_command_line_passes_every_check_and_shards_the_estimate():
    run = _checked([as_override(TP_PLAN)])
    assert run.model.tp_plan == TP_PLAN
    dims = param_shard_dims(_split_model(), user_plan=run.model.tp_plan)
    assert {dims[f"layers.1.{n}.weight"] for n in ("q", "k", "v", "fc")} == {0}
    assert (dims["layers.1.proj.weight"], dims["layers.1.out.weight"]) == (1, 1)
    assert "layers.1.out.bias" not in dims and "wte.weight" not in dims  # replicated


@pytest.mark.parametrize(("plan", "says"), [
    ({"layers.*.fc": "rowise"}, "model.tp_plan.layers.*.fc='rowise' is not known; choose one of colwise, rowwise"),
    ({"layers.*.mlp.fc": "colwise"}, "model.tp_plan: 'layers.*.mlp.fc' matches no module of TinyGPT; write paths "
                                     "as named_modules() names them"),
    ({"layers.*.ln_1": "colwise"}, "model.tp_plan: 'layers.*.ln_1' matches layers.0.ln_1, a LayerNorm, not an "
                                   "nn.Linear (only linears are sharded); narrow 'layers.*.ln_1' to linears"),
    ({"layers.*.fc": "colwise", "layers.1.fc": "rowwise"}, "model.tp_plan: layers.1.fc is given both colwise and "
                                                           "rowwise"),
])
def test_a_plan_that_does_not_fit_the_module_is_refused_naming_the_pattern(plan, says):
    with pytest.raises(ValueError) as info:
        _checked([as_override(plan)])
    assert says in str(info.value)


@pytest.mark.parametrize(("overrides", "says"), [
    (["parallel.tp=3", "cluster.num_workers=3", "model.n_heads=3", "model.dim=48", "model.tp_plan={lm_head:colwise}"],
     "model.tp_plan: lm_head is colwise but its out_features=256 is not divisible by parallel.tp=3; set parallel.tp "
     "to a divisor of 256 or leave lm_head out of model.tp_plan"),
    (["parallel.tp=4", "cluster.num_workers=4", "model.n_heads=2", "model.tp_plan={layers.*.fc:colwise}"],
     "model.n_heads=2 is not divisible by parallel.tp=4: with model.tp_plan every rank holds whole heads; set "
     "parallel.tp to a divisor of 2 ([1, 2])"),
    (["parallel.sequence_parallel=true", "model.tp_plan={layers.*.fc:colwise}"],
     "parallel.sequence_parallel=true with model.tp_plan"),
])
def test_what_tp_does_not_divide_is_refused_with_the_fix(overrides, says):
    with pytest.raises(ValueError) as info:
        _checked(overrides)
    assert says in str(info.value)


def test_your_module_without_a_plan_is_refused_naming_model_tp_plan_and_pipelines_still_are():
    with pytest.raises(ValueError, match=r"parallel.tp=2 with model._target_=.* give one in model.tp_plan"):
        _checked([])
    with pytest.raises(ValueError, match=r"parallel.pp=2 with model._target_=.* no pipeline split"):
        _checked(["parallel=pp", as_override(TP_PLAN)])


def test_a_preset_takes_a_plan_too_and_the_built_in_one_keeps_its_config_hash():
    run = compose_run_config(["model=tiny", "parallel=tp", "cluster.num_workers=2", "cluster.device=cpu",
                              "model.tp_plan={layers.*.feed_forward.w1:colwise,layers.*.feed_forward.w3:colwise,"
                              "layers.*.feed_forward.w2:rowwise}"])
    plan_layout(run)
    check_layout(run)
    assert "model.tp_plan" in hashed_config(run)
    assert "model.tp_plan" not in hashed_config(compose_run_config(["model=tiny"]))
    with pytest.raises(ValueError, match="model.tp_plan: layers.0.attention.wo is rowwise but its in_features=64 "
                                         "is not divisible by parallel.tp=3"):
        check_user_plan(build_model(run.model, vocab_size=256), {"layers.*.attention.wo": "rowwise"}, 3)


def test_a_linear_tied_to_a_module_left_replicated_is_refused():
    model = _split_model()
    model.lm_head.weight = model.wte.weight
    with pytest.raises(ValueError, match=r"model.tp_plan: lm_head shares a parameter with wte \(tied weights\), which "
                                         r"sharding it would untie; leave lm_head out of model.tp_plan"):
        check_user_plan(model, {"lm_head": "colwise"}, 2)


# ---------------------------------------------------------------- shards that do not fit together on a rank
TINY = ["model=tiny", "parallel=tp", "cluster.num_workers=2", "cluster.device=cpu", "train.seq_len=32"]
ATTENTION = "{layers.*.attention.wq:colwise,layers.*.attention.wk:colwise,layers.*.attention.wv:colwise,"


@pytest.mark.parametrize(("model", "plan", "says", "fix"), [
    # the tester's case: q sharded, k/v/o whole; both ranks died on a shape error after a minute
    (TINY, "{layers.*.attention.wq:colwise}",
     "model.tp_plan: layers.*.attention.wq is colwise, but layers.*.attention.wk colwise, layers.*.attention.wv "
     "colwise, layers.*.attention.wo rowwise are missing: layers.0.attention fails on one rank's shapes "
     "(RuntimeError: The size of tensor a (2) must match the size of tensor b (4)",
     ATTENTION + "layers.*.attention.wo:rowwise}"),
    (TINY, ATTENTION[:-1] + "}", "layers.*.attention.wo rowwise is missing: layers.0.attention.wo fails",
     ATTENTION + "layers.*.attention.wo:rowwise}"),
    (TINY, "{layers.*.attention.wo:rowwise}", "layers.*.attention.wo is rowwise, but layers.*.attention.wq colwise, "
     "layers.*.attention.wk colwise, layers.*.attention.wv colwise are missing",
     "{layers.*.attention.wo:rowwise,layers.*.attention.wq:colwise,layers.*.attention.wk:colwise,"
     "layers.*.attention.wv:colwise}"),
    (TINY, "{layers.*.feed_forward.w1:colwise,layers.*.feed_forward.w2:rowwise}",
     "but layers.*.feed_forward.w3 colwise is missing: layers.0.feed_forward fails",
     "{layers.*.feed_forward.w1:colwise,layers.*.feed_forward.w2:rowwise,layers.*.feed_forward.w3:colwise}"),
    (TINY, ATTENTION + "layers.*.attention.wo:rowwise,output:colwise}",
     "output is colwise, but no linear after it takes the slice it returns: Transformer returns logits of shape "
     "[1, 32, 128] on one rank instead of logits of shape [1, 32, 256]; leave output out",
     ATTENTION + "layers.*.attention.wo:rowwise}"),
    (RUN, "{layers.*.q:colwise}", "layers.*.q is colwise, but layers.*.k colwise, layers.*.v colwise, layers.*.proj "
     "rowwise are missing: layers.0 fails", "{layers.*.q:colwise,layers.*.k:colwise,layers.*.v:colwise,"
     "layers.*.proj:rowwise}"),
    (RUN, "{layers.*.fc:colwise}", "layers.*.out rowwise is missing: layers.0.out fails on one rank's shapes",
     "{layers.*.fc:colwise,layers.*.out:rowwise}"),
    (RUN, "{layers.1.q:colwise}", "layers.1.k colwise, layers.1.v colwise, layers.1.proj rowwise are missing: "
     "layers.1 fails", "{layers.1.q:colwise,layers.1.k:colwise,layers.1.v:colwise,layers.1.proj:rowwise}"),
])
def test_a_plan_whose_shards_do_not_fit_together_is_refused_with_a_plan_that_does(model, plan, says, fix):
    with pytest.raises(ValueError) as info:
        _checked([f"model.tp_plan={plan}"], base=model)
    message = str(info.value)
    assert says in message and "\n" not in message
    assert message.endswith(f"give 'model.tp_plan={fix}'")
    _checked([f"model.tp_plan={fix}"], base=model)  # the plan it gives passes


def test_a_plan_nothing_can_complete_is_refused_with_the_rule():
    with pytest.raises(ValueError, match=r"model.tp_plan: output is colwise, but the linears around it are not sharded "
                                         r"to match: .*\[1, 32, 128\] on one rank .* a rowwise linear after it must take; "
                                         r"fix model.tp_plan so, or shard by data instead \(parallel=fsdp\)"):
        _checked(["model.tp_plan={output:colwise}"], base=TINY)


def test_the_shape_check_of_a_7b_runs_one_of_its_alike_blocks_and_leaves_the_model_whole():
    import time

    run = compose_run_config(["model=7b", "parallel=tp", "cluster.num_workers=2", "train.seq_len=4096"])
    with torch.device("meta"):
        model = build_model(run.model, vocab_size=32000, shapes_only=True)
    linears = [name for name, _ in model.named_modules()]
    start = time.process_time()
    with pytest.raises(ValueError, match="layers.0.attention fails on one rank's shapes"):
        check_user_plan(model, {"layers.*.attention.wq": "colwise"}, 2, seq_len=4096)
    assert time.process_time() - start < 3  # 32 blocks run 3 times (plain, sharded, the fix) took 8 s of CPU
    assert [name for name, _ in model.named_modules()] == linears  # every block back, every linear its own
