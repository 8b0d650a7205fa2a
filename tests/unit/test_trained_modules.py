"""Everything that holds state about particular layers follows the modules that train, under
the model's names: the precision recipe's casts (every recipe), fp8_delayed's scales, the
numerics probe and NaN injection, when the model was cut into pipeline stages (deep copies:
parallel.pp.split_stages). No process group: a rank's stages are built as that
rank would build them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from trainlab import names
from trainlab.config import compose_run_config
from trainlab.config.schema import EmulatedFormats, PrecisionConfig
from trainlab.models import build_model
from trainlab.parallel.parts import holds_stages, model_parts, modules_by_name
from trainlab.parallel.pp import split_stages
from trainlab.precision.fp8_delayed import DelayedScalingFp8Linear
from trainlab.precision.recipes import build_recipe
from trainlab.telemetry import NonFiniteMonitor, NumericsProbe, inject_nan

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, PP = 256, 2
RECIPES = [
    PrecisionConfig(name="bf16"),
    PrecisionConfig(name="fp16", fp16_impl="emulated"),
    # tiny's linears are too small for FP8 to pay (keep_hp 'small'): convert them anyway
    PrecisionConfig(name="fp8_tensorwise", fp8_impl="emulated", hp_dtype="fp32", keep_hp=["output", "unaligned"]),
    PrecisionConfig(name="fp8_delayed", fp8_impl="emulated", hp_dtype="fp32", keep_hp=["output", "unaligned"]),
    PrecisionConfig(name="emulated", hp_dtype="fp32", formats=EmulatedFormats(activations="e4m3")),
]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return build_model(compose_run_config(["model=tiny", "model.n_layers=4"]).model, vocab_size=VOCAB)


def _stages(model: nn.Module, rank: int) -> nn.ModuleList:
    """What the trainer of pipeline rank `rank` (of PP) gets: its stage copies in a list."""
    return nn.ModuleList(split_stages(model, pp_rank=rank, pp_size=PP))


def _step(model: nn.Module, recipe) -> None:
    """One forward/backward of the stages in order (as the schedule chains them) and the
    recipe's step."""
    tokens = torch.randint(0, VOCAB, (2, 17), generator=torch.Generator().manual_seed(1))
    h = tokens[:, :-1]
    with recipe.autocast():
        for stage in model:
            h = stage(h)
    F.cross_entropy(h.float().flatten(0, 1), tokens[:, 1:].flatten()).backward()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    recipe.step(optimizer, grads_finite=True)


def test_parts_name_the_modules_of_stages_as_the_model_does():
    model = _model()
    whole = dict(model.named_modules())
    ranks = [_stages(model, r) for r in range(PP)]
    held = [modules_by_name(stages) for stages in ranks]
    assert all(holds_stages(stages) for stages in ranks) and not holds_stages(model)
    assert held[0].keys() & held[1].keys() == {"layers"}  # each stage's block container
    assert {*held[0], *held[1]} == set(whole) - {""}  # the model's names, split between the ranks
    assert "layers.3.feed_forward.w2" in held[1] and "layers.3.feed_forward.w2" not in held[0]
    assert held[1]["layers.3.feed_forward.w2"] is not whole["layers.3.feed_forward.w2"]  # a copy
    assert model_parts(model) == [model] and modules_by_name(model)["output"] is model.output


@pytest.mark.parametrize("cfg", RECIPES, ids=lambda c: c.name)
def test_attach_binds_every_recipe_to_the_stage_copies(cfg):
    """prepare() sees the whole model; the stages are copies made after it: attach() moves the
    casts (what the numerics probe watches) onto the copies this rank runs."""
    model = _model()
    recipe = build_recipe(cfg, device_type="cpu")
    model = recipe.prepare(model)
    prepared = [name for name, _, _ in recipe.casts]
    assert prepared
    stages = _stages(model, 1)
    recipe.attach(stages)
    running = modules_by_name(stages)
    assert [name for name, _, _ in recipe.casts] == [n for n in prepared
                                                     if n.startswith(("layers.2.", "layers.3.", "output"))]
    assert all(module is running[name] for name, module, _ in recipe.casts)


def test_fp8_delayed_scales_the_stage_copies_and_the_probe_reports_them():
    """Rank 1 of a pipeline: its stage copies cast with scales from their own amaxes (the
    model they were cut from never runs), and the probe measures the copies."""
    model = _model()
    recipe = build_recipe(RECIPES[3], device_type="cpu")
    model = recipe.prepare(model)
    whole = dict(model.named_modules())
    stages = nn.ModuleList([*split_stages(model, pp_rank=0, pp_size=PP), *split_stages(model, pp_rank=1, pp_size=PP)])
    recipe.attach(stages)  # one process holding both stages: every name is here
    probe = NumericsProbe(recipe.casts)
    delayed = {n: m for n, m in modules_by_name(stages).items() if isinstance(m, DelayedScalingFp8Linear)}
    assert len(delayed) == len(recipe.casts) == 4 * 7
    for _ in range(2):
        used = {name: module.current_scales() for name, module in delayed.items()}
        probe.arm()
        _step(stages, recipe)
        metrics = probe.collect()
    for name, scales in used.items():  # the second step cast with scales from the first's amaxes
        assert all(s != 1.0 for s in scales.values()), name
        for kind, scale in scales.items():
            assert metrics[names.cast_metric(name, kind, names.CAST_SCALE)] == pytest.approx(scale)
        assert whole[name].current_scales() == {"input": 1.0, "weight": 1.0, "grad_output": 1.0}


def test_nan_injection_hooks_the_copy_on_the_rank_that_holds_it():
    model = _model()
    ranks = [_stages(model, r) for r in range(PP)]
    handles = [inject_nan(stages, "layers.3.feed_forward", at_step=1, current_step=lambda: 1) for stages in ranks]
    assert handles[0] is None and handles[1] is not None  # the block lives on rank 1's stage
    x = torch.randint(0, VOCAB, (1, 8))
    assert torch.isnan(ranks[1][0](ranks[0][0](x))).all()
    assert torch.isfinite(model(x)).all()  # the model the stages were cut from is left alone
    with pytest.raises(ValueError, match="debug.inject_nan"):
        inject_nan(model, "layers.9.feed_forward", at_step=1, current_step=lambda: 1)


def test_a_nonfinite_gradient_of_a_stage_is_named_as_in_the_model():
    model = _model()
    stages = _stages(model, 1)
    for name, param in stages[0].named_parameters():
        param.grad = torch.full_like(param, float("inf") if name == "layers.2.attention.wo.weight" else 1.0)
    assert NonFiniteMonitor(stages).first_gradient() == "grad:layers.2.attention.wo.weight"
