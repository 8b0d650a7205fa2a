"""trainlab.precision through the real Trainer: fp16 loss scaling skips an overflowing step and
backs off, fp16 emulation rounds like fp16, each recipe prepares and steps as named, and a
non-finite loss ends the trial as diverged."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import RecordingTracker
from trainlab import names
from trainlab.config import compose_run_config
from trainlab.config.schema import PrecisionConfig
from trainlab.engine.run import build_trainer
from trainlab.plan.trial_plan import Where, plan_trial
from trainlab.precision.emulate import emulate_fp16_linears, round_fp16
from trainlab.precision.recipes import build_recipe

pytestmark = pytest.mark.usefixtures("one_thread")

FP16 = torch.finfo(torch.float16)
FP16_MIN_SUBNORMAL = FP16.smallest_normal * 2.0 ** -10  # 2**-24

TINY_RUN = [
    "model=tiny", "data=markov", "train.max_steps=12", "train.global_batch_size=4",
    "train.micro_batch_size=4", "train.seq_len=32", "cluster.num_workers=1",
    "train.eval_every=0", "train.eval_batches=1", "cluster.device=cpu",
]


def _snapshot(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _changed(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return any(not torch.equal(x, y) for x, y in zip(a, b))


# ---------------------------------------------------------------------------- fp16 loss scaling
def test_fp16_overflow_skips_one_step_and_backs_off_the_scale(dist_info):
    run = compose_run_config(TINY_RUN + ["precision=fp16", "precision.growth_interval=1000"])
    tracker = RecordingTracker()
    trainer = build_trainer(plan_trial(run, Where(device=dist_info.device.type)), dist_info, tracker=tracker)
    assert trainer.recipe.emulated  # fp16_impl=auto on cpu
    init_scale = trainer.recipe.loss_scale
    assert init_scale == run.precision.init_scale

    armed_at = 4  # trainer.step during the 5th optimizer step
    bad_step = armed_at + 1
    param = next(trainer.model.parameters())
    param.register_hook(lambda g: g * float("inf") if trainer.step == armed_at else g)

    snaps = {0: _snapshot(trainer.model)}
    trainer.add_hook(lambda tr, step, metrics: snaps.__setitem__(step, _snapshot(tr.model)))
    result = trainer.train()

    assert result.status == names.STATUS_FINISHED
    assert result.steps == run.train.max_steps
    assert result.skipped_steps == 1
    assert result.loss_scale == trainer.recipe.loss_scale == init_scale * run.precision.backoff_factor
    assert math.isfinite(result.final_loss)

    # the skipped step left every parameter alone; every other step updated them
    assert sorted(snaps) == list(range(run.train.max_steps + 1))
    for step in range(1, run.train.max_steps + 1):
        changed = _changed(snaps[step - 1], snaps[step])
        assert changed == (step != bad_step), f"step {step}: changed={changed}"

    # what the tracker saw
    skipped = tracker.by_step(names.SKIPPED_STEPS)
    scale = tracker.by_step(names.LOSS_SCALE)
    assert skipped[bad_step - 1] == 0 and skipped[bad_step] == 1 and skipped[run.train.max_steps] == 1
    assert scale[bad_step - 1] == init_scale
    assert scale[bad_step] == init_scale * run.precision.backoff_factor
    assert all(scale[s] == scale[bad_step] for s in range(bad_step, run.train.max_steps + 1))
    assert not math.isfinite(tracker.by_step(names.GRAD_NORM)[bad_step])  # inf * 0 = NaN


def test_fp16_without_loss_scaling_reports_no_scale(dist_info):
    run = compose_run_config(TINY_RUN + ["precision=fp16", "precision.loss_scale=none",
                                         "train.max_steps=2"])
    tracker = RecordingTracker()
    result = build_trainer(plan_trial(run, Where(device=dist_info.device.type)), dist_info, tracker=tracker).train()
    assert result.status == names.STATUS_FINISHED and result.loss_scale is None
    assert tracker.by_step(names.LOSS_SCALE) == {}
    assert len(tracker.by_step(names.LOSS)) == 2


# ---------------------------------------------------------------------------- fp16 emulation
def test_round_fp16_overflows_to_inf():
    x = torch.tensor([FP16.max * 1.01, 1e5, 1e10, -1e5])
    y = round_fp16(x)
    assert y.dtype == torch.float32
    assert torch.isinf(y).all() and (torch.sign(y) == torch.sign(x)).all()
    assert round_fp16(torch.tensor([FP16.max])).item() == FP16.max  # largest finite stays


def test_round_fp16_underflows_to_zero():
    tiny = torch.tensor([FP16_MIN_SUBNORMAL * 0.4, 1e-9, -1e-9, 1e-20])
    assert (round_fp16(tiny) == 0).all()
    # the smallest subnormal itself survives
    assert round_fp16(torch.tensor([FP16_MIN_SUBNORMAL])).item() == FP16_MIN_SUBNORMAL


def test_round_fp16_matches_a_half_cast():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=gen) * torch.logspace(-9, 5, 4096)
    y = round_fp16(x)
    assert torch.equal(y, x.half().float())
    assert not torch.equal(y, x)  # rounding did happen


def test_round_fp16_rounds_the_gradient_on_the_way_back():
    x = torch.ones(3, requires_grad=True)
    round_fp16(x).backward(torch.tensor([1e-9, 1e5, 0.1]))
    assert x.grad[0] == 0  # underflow: the signal fp16 loss scaling exists to save
    assert math.isinf(x.grad[1])
    assert x.grad[2] == torch.tensor(0.1).half().float()


def test_emulated_linear_equals_linear_on_rounded_operands():
    torch.manual_seed(0)
    layer = nn.Linear(16, 8)
    model = nn.Sequential(layer, nn.ReLU(), nn.Linear(8, 4))
    keys = list(model.state_dict())
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(5, 16)
    plain = layer(x)

    assert emulate_fp16_linears(model) == 2
    out = layer(x)

    h = lambda t: t.half().float()  # noqa: E731
    expected = h(F.linear(h(x), h(layer.weight), h(layer.bias)))
    assert torch.equal(out, expected)
    assert not torch.equal(out, plain)
    assert list(model.state_dict()) == keys
    assert all(torch.equal(v, weights[k]) and v.dtype == torch.float32
               for k, v in model.state_dict().items())


# ---------------------------------------------------------------------------- build_recipe
def test_fp16_auto_is_emulated_on_cpu_and_native_is_not():
    auto = build_recipe(PrecisionConfig(name="fp16", fp16_impl="auto"), device_type="cpu")
    native = build_recipe(PrecisionConfig(name="fp16", fp16_impl="native"), device_type="cpu")
    assert auto.emulated and not native.emulated
    lin = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with auto.autocast():
        assert lin(x).dtype == torch.float32  # emulated: fp32 tensors, fp16 rounding
    with native.autocast():
        assert lin(x).dtype == torch.float16


def test_fp16_auto_is_native_on_cuda():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # GradScaler warns when CUDA is absent
        recipe = build_recipe(PrecisionConfig(name="fp16", fp16_impl="auto"), device_type="cuda")
    assert not recipe.emulated


def test_bf16_autocasts_and_bf16_pure_casts_parameters():
    lin = nn.Linear(4, 4)
    with build_recipe(PrecisionConfig(name="bf16"), device_type="cpu").autocast():
        assert lin(torch.randn(2, 4)).dtype == torch.bfloat16
    assert lin.weight.dtype == torch.float32  # bf16 autocast keeps fp32 master weights

    model = build_recipe(PrecisionConfig(name="bf16_pure"), device_type="cpu").prepare(
        nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)))
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())


def test_fp32_recipe_skips_the_update_when_grads_are_not_finite():
    recipe = build_recipe(PrecisionConfig(name="fp32"), device_type="cpu")
    assert recipe.loss_scale is None and not recipe.emulated
    lin = nn.Linear(4, 1)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    recipe.scale(lin(torch.randn(3, 4)).sum()).backward()
    before = _snapshot(lin)
    assert recipe.step(opt, grads_finite=False) is False
    assert not _changed(before, _snapshot(lin))
    assert recipe.step(opt, grads_finite=True) is True
    assert _changed(before, _snapshot(lin))


# ---------------------------------------------------------------------------- divergence
def test_nonfinite_loss_stops_the_trial_as_diverged(dist_info):
    run = compose_run_config(TINY_RUN + ["precision=fp32"])
    tracker = RecordingTracker()
    trainer = build_trainer(plan_trial(run, Where(device=dist_info.device.type)), dist_info, tracker=tracker)
    # NaN logits during the 3rd optimizer step (trainer.step counts completed steps)
    trainer.model.register_forward_hook(lambda m, i, out: out * float("nan") if trainer.step == 2 else out)
    result = trainer.train()
    assert result.status == names.STATUS_DIVERGED
    assert result.diverged_step == 3 and result.steps == 3
    assert result.first_nonfinite == "loss"
    assert math.isnan(result.final_loss)
    losses = tracker.by_step(names.LOSS)
    assert max(losses) == 3 and math.isnan(losses[3])  # the NaN step was logged, then nothing


def test_diverged_step_is_where_the_loss_went_nonfinite_after_an_fp16_overflow(dist_info):
    run = compose_run_config(TINY_RUN + ["precision=fp16", "precision.growth_interval=1000"])
    trainer = build_trainer(plan_trial(run, Where(device=dist_info.device.type)), dist_info)
    # a routine fp16 overflow at step 2 (skipped, training goes on) ...
    next(trainer.model.parameters()).register_hook(
        lambda g: g * float("inf") if trainer.step == 1 else g)
    # ... and a real divergence (NaN loss) at step 6
    trainer.model.register_forward_hook(lambda m, i, out: out * float("nan") if trainer.step == 5 else out)
    result = trainer.train()
    assert result.status == names.STATUS_DIVERGED and result.steps == 6
    assert result.skipped_steps >= 1
    assert result.diverged_step == 6


# ----------------------------------------------------------------------- emulated formats
def test_emulated_linear_casts_input_and_weight_forward_and_gradient_backward():
    from trainlab.precision.emulate import emulate_linear
    from trainlab.precision.fake_cast import quantize, tensor_scale
    from trainlab.vocab.format_names import parse_format

    e3m2, e2m1 = parse_format("e3m2"), parse_format("e2m1fn")
    torch.manual_seed(0)
    lin = nn.Linear(16, 8, bias=False)
    ref = nn.Linear(16, 8, bias=False)
    ref.load_state_dict(lin.state_dict())
    emulate_linear(lin, activations=e3m2, weights=e3m2, gradients=e2m1, scaled=True)

    def fq(t, fmt):  # the per-tensor scaled round trip, written out
        s = tensor_scale(t.abs().max(), fmt)
        return quantize(t * s, fmt, saturate=True) / s

    x = torch.randn(4, 16, requires_grad=True)
    y = lin(x)
    torch.testing.assert_close(y, F.linear(fq(x.detach(), e3m2), fq(lin.weight.detach(), e3m2)))
    g = torch.randn(4, 8)
    y.backward(g)
    # the incoming gradient is rounded to e2m1 before it meets the (rounded) weight
    torch.testing.assert_close(x.grad, fq(g, e2m1) @ fq(lin.weight.detach(), e3m2))
    assert lin.state_dict().keys() == ref.state_dict().keys()


def test_emulated_optimizer_states_hold_only_values_of_the_format(dist_info):
    from trainlab.precision.fake_cast import fake_quantize
    from trainlab.vocab.format_names import parse_format

    run = compose_run_config(TINY_RUN + ["precision=emulated", "precision.hp_dtype=fp32",
                                         "precision.formats.optimizer_states=e4m3",
                                         "train.max_steps=3"])
    trainer = build_trainer(plan_trial(run, Where(device=dist_info.device.type)), dist_info, tracker=RecordingTracker())
    assert trainer.train().status == names.STATUS_FINISHED
    e4m3 = parse_format("e4m3")
    for state in trainer.optimizer.state.values():
        for key in ("exp_avg", "exp_avg_sq"):
            # at most e4m3's 126 positive finite magnitudes (x one scale per tensor), and a
            # second rounding changes nothing but the last bit of the fp32 division
            assert state[key].abs().unique().numel() <= 127
            torch.testing.assert_close(state[key], fake_quantize(state[key], e4m3), rtol=1e-6, atol=0)


@pytest.mark.parametrize(("m", "v", "dtype"), [("bf16", "bf16", torch.bfloat16),
                                               ("e4m3", "e5m2", torch.float8_e4m3fn)])
def test_optimizer_moments_stored_as_configured(dist_info, m, v, dtype):
    run = compose_run_config(TINY_RUN + [f"optim.exp_avg_dtype={m}", f"optim.exp_avg_sq_dtype={v}",
                                         "train.max_steps=12"])
    tracker = RecordingTracker()
    trainer = build_trainer(plan_trial(run, Where(device=dist_info.device.type)), dist_info, tracker=tracker)
    result = trainer.train()
    assert result.status == names.STATUS_FINISHED
    losses = list(tracker.by_step(names.LOSS).values())
    assert losses[-1] < losses[0]  # it still trains
    state = next(iter(trainer.optimizer.state.values()))
    assert state["exp_avg"].dtype == dtype


def test_emulated_without_a_format_is_refused():
    with pytest.raises(Exception, match="precision.formats.activations"):
        compose_run_config(["precision=emulated", "precision.formats.activations=",
                            "precision.formats.weights=", "precision.formats.gradients="])
    with pytest.raises(Exception, match="precision.formats.weights: .*e9m"):
        compose_run_config(["precision=emulated", "precision.formats.weights=e9m"])


# ----------------------------------------------------------------------- bf16_pure updates
def _norm_weights(model: nn.Module) -> torch.Tensor:
    """Every RMSNorm weight (initialised to 1.0), flattened."""
    return torch.cat([p.detach().float().flatten() for n, p in model.named_parameters() if "norm" in n])


def test_bf16_pure_plain_loses_small_updates_that_kahan_and_stochastic_keep(dist_info):
    """A small constant LR (2e-4, as late in a cosine): Adam's steps of ~2e-4 are below half a
    bf16 ulp of most weights (2**-8 = 0.0039 at 1.0). Plain bf16_pure never moves a norm weight
    and its loss leaves bf16 autocast's (fp32 master weights) curve (here below it: steps
    between half and one ulp round up to a whole ulp, those below half vanish; at the end of a
    cosine it ends above, see the bf16_pure_updates sweep). Kahan and stochastic rounding move
    them and stay on bf16's curve. Measured (seeds 0-3) distance from bf16's val loss: plain
    0.015-0.025, stochastic 0.0006-0.004, kahan 0.0005-0.0012."""
    seed = 0
    common = ["model=tiny", "data=text", "train.max_steps=40", "train.global_batch_size=8",
              "train.micro_batch_size=8", "train.seq_len=64", "train.eval_every=0", "train.eval_batches=4",
              "optim.lr=2e-4", "optim.min_lr_ratio=1", "optim.warmup_steps=0", "cluster.num_workers=1",
              "cluster.device=cpu", f"seed={seed}"]
    val, norms = {}, {}
    for precision in ("bf16", "bf16_pure_plain", "bf16_pure_stochastic", "bf16_pure_kahan"):
        run = compose_run_config([*common, f"precision={precision}"])
        tracker = RecordingTracker()
        trainer = build_trainer(plan_trial(run, Where(device=dist_info.device.type)), dist_info, tracker=tracker)
        assert trainer.train().status == names.STATUS_FINISHED
        val[precision] = tracker.by_step(names.VAL_LOSS)[run.train.max_steps]
        norms[precision] = _norm_weights(trainer.model)
    # seen in bf16 (bf16's fp32 weights rounded): how many norm weights are no longer 1.0
    moved = {k: (w.bfloat16() != 1.0).float().mean().item() for k, w in norms.items()}
    assert moved["bf16_pure_plain"] == 0, moved  # 40 steps and not one norm weight moved
    for precision in ("bf16_pure_stochastic", "bf16_pure_kahan"):
        assert moved[precision] > 0.5 * moved["bf16"] > 0, moved
    # Kahan's master weight is bf16's fp32 one to ~16 bits: rounded, they are the same numbers
    same = (norms["bf16_pure_kahan"] == norms["bf16"].bfloat16().float()).float().mean().item()
    assert same > 0.9, same
    gap = abs(val["bf16_pure_plain"] - val["bf16"])
    assert gap > 0.005, val
    for precision in ("bf16_pure_stochastic", "bf16_pure_kahan"):
        assert abs(val[precision] - val["bf16"]) < gap / 3, val


def test_bf16_pure_kahan_keeps_a_bf16_compensation_per_parameter(dist_info):
    run = compose_run_config(TINY_RUN + ["precision=bf16_pure", "train.max_steps=2"])
    assert run.precision.bf16_update == "kahan"  # the default
    trainer = build_trainer(plan_trial(run, Where(device=dist_info.device.type)), dist_info)
    trainer.train()
    for p in trainer.model.parameters():
        state = trainer.optimizer.state[p]
        assert p.dtype == state["kahan_comp"].dtype == state["exp_avg"].dtype == torch.bfloat16
        assert state["exp_avg_sq"].dtype == torch.bfloat16  # bf16_pure's memory: all state bf16


def test_bf16_update_is_tagged_and_refused_or_ignored_by_name():
    from trainlab.config.validate import ignored_options
    from trainlab.tracking.runs import trial_tags

    tags = {u: trial_tags(compose_run_config([f"precision=bf16_pure_{u}"]))
            for u in ("plain", "stochastic", "kahan")}
    assert {t[names.TAG_PRECISION] for t in tags.values()} == {"bf16_pure"}
    assert {u: t[names.TAG_BF16_UPDATE] for u, t in tags.items()} == {u: u for u in tags}
    assert names.TAG_BF16_UPDATE not in trial_tags(compose_run_config(["precision=bf16"]))
    with pytest.raises(Exception, match=r"precision.bf16_update='nearest'.*plain, stochastic, kahan"):
        compose_run_config(["precision=bf16_pure", "precision.bf16_update=nearest"])
    notes = ignored_options(compose_run_config(["precision=bf16", "precision.bf16_update=stochastic"]))
    assert any("precision.bf16_update=stochastic only applies to precision=bf16_pure" in n for n in notes)
