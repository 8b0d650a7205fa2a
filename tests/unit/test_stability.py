"""Stability telemetry as a user reads it: a NaN ends the trial naming the module or gradient it
started in, fp16 turns an overflowing gradient into a skipped step, the numerics probe counts
exactly the values a cast loses, and sampled metrics land on the steps train.numerics_every
names."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from conftest import RecordingTracker
from trainlab import names
from trainlab.config import compose_run_config
from trainlab.engine.run import build_trainer
from trainlab.plan.trial_plan import Where, plan_trial
from trainlab.precision.fp8_delayed import DelayedScalingFp8Linear
from trainlab.precision.policy import CastSpec
from trainlab.telemetry import GradNormWindow, NumericsProbe, Peak, peak_flops, update_to_weight
from trainlab.vocab.format_names import parse_format

pytestmark = pytest.mark.usefixtures("one_thread")

E4M3 = parse_format("e4m3")
E5M2 = parse_format("e5m2")

TINY_RUN = [
    "model=tiny", "data=markov", "train.max_steps=12", "train.global_batch_size=4",
    "train.micro_batch_size=4", "train.seq_len=32", "cluster.num_workers=1",
    "train.eval_every=0", "train.eval_batches=1", "cluster.device=cpu",
]
BAD_GRAD_PARAM = "layers.1.feed_forward.w2.weight"


def trainer_for(overrides: list[str], dist_info, tracker=None):
    """build_trainer with a fixed CPU peak: the matmul probe measures nothing checked here."""
    run = compose_run_config(TINY_RUN + overrides)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(peak_flops, "cpu_probe_peak", lambda dtype, **_: Peak(1e11, f"probe:cpu:{dtype}"))
        return run, build_trainer(plan_trial(run, Where(device=dist_info.device.type)), dist_info, tracker=tracker)


def snapshot(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def make_grad(trainer, value: float, *, at_step: int) -> None:
    """BAD_GRAD_PARAM's gradient becomes `value` everywhere during optimizer step at_step."""
    param = dict(trainer.model.named_parameters())[BAD_GRAD_PARAM]
    param.register_hook(lambda g: torch.full_like(g, value) if trainer.step + 1 == at_step else g)


# ---------------------------------------------------------------------------- NaN injection
@pytest.mark.parametrize(("module", "step"), [
    ("layers.1.feed_forward", 4),
    ("layers.0.attention.wq", 2),
    ("output", 3),
])
def test_injected_nan_ends_the_trial_naming_its_module(module, step, dist_info):
    tracker = RecordingTracker()
    _, trainer = trainer_for([f"debug.inject_nan={module}@{step}", "train.max_steps=10"], dist_info, tracker)
    snaps = {0: snapshot(trainer.model)}
    trainer.add_hook(lambda tr, s, m: snaps.__setitem__(s, snapshot(tr.model)))
    result = trainer.train()

    assert result.status == names.STATUS_DIVERGED
    assert result.diverged_step == step == result.steps
    assert result.first_nonfinite == f"activation:{module}"
    losses = tracker.by_step(names.LOSS)
    assert sorted(losses) == list(range(1, step + 1))  # nothing logged after the NaN step
    assert math.isnan(losses[step]) and all(math.isfinite(losses[s]) for s in range(1, step))
    assert tracker.by_step(names.NONFINITE_STEPS)[step] == 1
    # the NaN step updated no weight (the saved model is the last healthy one)
    assert sorted(snaps) == list(range(step + 1))
    assert same(snaps[step - 1], snaps[step])
    assert not same(snaps[step - 2], snaps[step - 1])
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


# ---------------------------------------------------------------------------- gradient origin
def test_inf_gradient_without_loss_scaling_is_a_divergence_named_by_parameter(dist_info):
    tracker = RecordingTracker()
    _, trainer = trainer_for(["precision=fp32", "train.max_steps=8"], dist_info, tracker)
    make_grad(trainer, math.inf, at_step=3)
    result = trainer.train()

    assert result.status == names.STATUS_DIVERGED and result.diverged_step == 3
    assert result.first_nonfinite == f"grad:{BAD_GRAD_PARAM}"
    assert math.isfinite(tracker.by_step(names.LOSS)[3])  # the loss was fine: a gradient went first
    assert math.isinf(tracker.by_step(names.GRAD_NORM)[3])


def test_inf_gradient_under_fp16_loss_scaling_is_a_skipped_step(dist_info):
    tracker = RecordingTracker()
    run, trainer = trainer_for(["precision=fp16", "precision.growth_interval=1000", "train.max_steps=8"],
                               dist_info, tracker)
    make_grad(trainer, math.inf, at_step=3)
    result = trainer.train()

    assert result.status == names.STATUS_FINISHED and result.steps == run.train.max_steps
    assert result.skipped_steps == 1 and result.diverged_step is None
    assert result.first_nonfinite == f"grad:{BAD_GRAD_PARAM}"  # still named, though not fatal
    assert result.loss_scale == run.precision.init_scale * run.precision.backoff_factor
    skipped = tracker.by_step(names.SKIPPED_STEPS)
    assert skipped[2] == 0 and skipped[3] == 1 and skipped[run.train.max_steps] == 1
    assert math.isfinite(result.final_loss)


@pytest.mark.parametrize(("value", "clip"), [(math.nan, []), (math.inf, ["optim.grad_clip=0"])],
                         ids=["nan_grad", "inf_grad_no_clip"])
def test_nonfinite_gradient_is_named_by_its_parameter_whatever_the_clipping(value, clip, dist_info):
    _, trainer = trainer_for(["precision=fp32", "train.max_steps=8", *clip], dist_info)
    make_grad(trainer, value, at_step=3)
    result = trainer.train()
    assert result.status == names.STATUS_DIVERGED and result.diverged_step == 3
    assert result.first_nonfinite == f"grad:{BAD_GRAD_PARAM}"


# ---------------------------------------------------------------------------- numerics probe
def crafted(shape: tuple[int, int], *, n_under: int, n_over: int, n_zero: int = 0) -> torch.Tensor:
    """1.0 everywhere but for n_under values below half e4m3's smallest subnormal (2**-10),
    n_over values above its largest (448) and n_zero zeros, at scattered positions."""
    x = torch.ones(shape).flatten()
    idx = torch.randperm(x.numel(), generator=torch.Generator().manual_seed(0))
    x[idx[:n_under]] = 2.0**-12
    x[idx[n_under:n_under + n_over]] = -1000.0
    x[idx[n_under + n_over:n_under + n_over + n_zero]] = 0.0
    return x.view(shape)


def _run_layers(layers: dict[str, nn.Linear], inputs: dict[str, torch.Tensor],
                grads: dict[str, torch.Tensor] | None = None) -> None:
    loss = sum((layers[n](inputs[n]) * (grads[n] if grads else 1.0)).sum() for n in layers)
    loss.backward()


def test_probe_counts_exactly_what_a_raw_cast_loses():
    torch.manual_seed(0)
    layers = {"a": nn.Linear(32, 32), "b": nn.Linear(32, 32)}
    spec = CastSpec(E4M3, E4M3, E5M2, scaling="none")
    probe = NumericsProbe([(n, m, spec) for n, m in layers.items()])
    shape = (4, 32)
    n = shape[0] * shape[1]
    inputs = {"a": crafted(shape, n_under=5, n_over=3, n_zero=2), "b": crafted(shape, n_under=7, n_over=0)}
    # gradient arriving at a's output: 4 values below half e5m2's smallest subnormal, 1 above 57344
    g = torch.ones(shape).flatten()
    g[:4], g[4] = 2.0**-20, 1e6
    grads = {"a": g.view(shape), "b": torch.ones(shape)}

    probe.arm()
    _run_layers(layers, inputs, grads)
    m = probe.collect()

    def cast(layer, tensor, stat):
        return m[names.cast_metric(layer, tensor, stat)]

    assert cast("a", "input", "underflow") == 5 / (n - 2)  # of the non-zero values
    assert cast("a", "input", "overflow") == 3 / n
    assert cast("a", "input", "amax") == 1000.0 and cast("a", "input", "scale") == 1.0
    assert cast("b", "input", "underflow") == 7 / n and cast("b", "input", "overflow") == 0.0
    # the max over layers is what to watch per tensor kind
    assert m[names.cast_max_metric("input", "underflow")] == max(5 / (n - 2), 7 / n)
    assert m[names.cast_max_metric("input", "overflow")] == 3 / n
    assert m[names.cast_max_metric("input", "amax")] == 1000.0
    # weights: measured from the layer itself
    for layer, module in layers.items():
        assert cast(layer, "weight", "amax") == float(module.weight.detach().abs().max())
        assert cast(layer, "weight", "overflow") == 0.0
    # incoming gradient (e5m2), measured in backward
    assert cast("a", "grad_output", "underflow") == 4 / n
    assert cast("a", "grad_output", "overflow") == 1 / n
    assert cast("b", "grad_output", "underflow") == 0.0 and cast("b", "grad_output", "amax") == 1.0
    assert m[names.cast_max_metric("grad_output", "overflow")] == 1 / n
    assert names.NUM_GRAD_UNDERFLOW not in m  # only loss-scaled (fp16) casts report it

    # not armed: the hooks are gone and nothing is measured
    _run_layers(layers, inputs, grads)
    assert probe.collect() == {}
    # armed again, it measures again
    probe.arm()
    _run_layers(layers, inputs, grads)
    again = probe.collect()
    assert again[names.cast_metric("a", "input", "overflow")] == 3 / n


def test_probe_with_tensor_scaling_overflows_nothing():
    torch.manual_seed(0)
    layer = nn.Linear(32, 32)
    probe = NumericsProbe([("lin", layer, CastSpec(E4M3, E4M3, E5M2, scaling="tensor"))])
    x = crafted((4, 32), n_under=5, n_over=3)
    probe.arm()
    layer(x).sum().backward()
    m = probe.collect()
    assert m[names.cast_metric("lin", "input", "overflow")] == 0.0
    assert m[names.cast_metric("lin", "input", "amax")] == 1000.0
    assert m[names.cast_metric("lin", "input", "scale")] == pytest.approx(E4M3.max_value / 1000.0)
    # scaling down to fit 1000 pushes the tiny values further below the format: still lost
    assert m[names.cast_metric("lin", "input", "underflow")] == 5 / 128


def edge_input(shape: tuple[int, int]) -> torch.Tensor:
    """A random tensor whose largest element lands above 448 in fp32's x * (448 / amax)."""
    g = torch.Generator().manual_seed(0)
    for _ in range(100):
        x = torch.randn(shape, generator=g)
        if (x * (E4M3.max_value / x.abs().amax())).abs().max() > E4M3.max_value:
            return x
    raise AssertionError("no random tensor on the edge")


def test_probe_reports_overflow_only_where_the_cast_saturates():
    """Current scaling (tensorwise, rowwise) cannot overflow, even where fp32's x * (448 / amax)
    lands above 448; a stale delayed scale does, as does a raw cast."""
    torch.manual_seed(0)
    specs = {"tensor": CastSpec(E4M3, E4M3, E5M2, scaling="tensor"),
             "row": CastSpec(E4M3, E4M3, E5M2, scaling="row"),
             "raw": CastSpec(E4M3, E4M3, E5M2, scaling="none")}
    layers = {n: nn.Linear(32, 32) for n in specs}
    delayed = DelayedScalingFp8Linear(32, 32)
    delayed._push_amax(torch.tensor([1.0, 1.0, 1.0]))  # the history saw amax 1: input scale 448
    probe = NumericsProbe([*((n, layers[n], specs[n]) for n in specs),
                           ("delayed", delayed, CastSpec(E4M3, E4M3, E5M2, scaling="delayed"))])
    x = edge_input((4, 32))
    inputs = {"tensor": x, "row": x, "raw": x * 500.0, "delayed": x}
    probe.arm()
    _run_layers({**layers, "delayed": delayed}, inputs)
    m = probe.collect()

    for layer in ("tensor", "row"):
        for kind in ("input", "weight", "grad_output"):
            assert m[names.cast_metric(layer, kind, "overflow")] == 0.0, (layer, kind)
    # the delayed cast clamps every |x| * 448 that rounds above 448; the raw one every 500 |x|
    assert m[names.cast_metric("delayed", "input", "overflow")] == float((x.abs() * 448).gt(464).float().mean())
    assert m[names.cast_metric("raw", "input", "overflow")] == float((x.abs() * 500).gt(464).float().mean())
    assert m[names.cast_metric("delayed", "input", "overflow")] > 0.1
    assert m[names.cast_max_metric("input", "overflow")] == max(
        m[names.cast_metric(n, "input", "overflow")] for n in ("delayed", "raw"))


def test_fp16_loss_scaling_rescues_gradients_from_underflow(dist_info):
    tracker = RecordingTracker()
    run, trainer = trainer_for(["precision=fp16", "precision.loss_scale=dynamic", "train.numerics_every=1"],
                               dist_info, tracker)
    result = trainer.train()
    assert result.status == names.STATUS_FINISHED
    scaled = tracker.by_step(names.NUM_GRAD_UNDERFLOW)
    unscaled = tracker.by_step(names.NUM_GRAD_UNDERFLOW_UNSCALED)
    steps = list(range(1, run.train.max_steps + 1))
    assert sorted(scaled) == sorted(unscaled) == steps  # sampled every step
    assert all(0 <= scaled[s] <= unscaled[s] <= 1 for s in steps), (scaled, unscaled)
    assert sum(unscaled.values()) > sum(scaled.values())  # the scale saves gradients fp16 would zero


# ---------------------------------------------------------------------------- grad norms, updates
def test_grad_norm_window_percentiles_are_nearest_rank_and_reset():
    window = GradNormWindow()
    for v in [*range(100, 0, -1), math.inf, math.nan]:  # 100..1, unsorted, plus non-finite
        window.add(float(v))
    assert window.percentiles() == {names.GRAD_NORM_P50: 50.0, names.GRAD_NORM_P90: 90.0,
                                    names.GRAD_NORM_P99: 99.0}
    assert window.percentiles() == {}  # a new window starts after each reading
    window.add(3.0)
    assert window.percentiles() == dict.fromkeys((names.GRAD_NORM_P50, names.GRAD_NORM_P90,
                                                  names.GRAD_NORM_P99), 3.0)


def test_update_to_weight_ratio_on_known_tensors():
    before = [torch.ones(4), torch.full((9,), 2.0)]          # norms 2 and 6
    after = [torch.ones(4) * 1.1, torch.full((9,), 2.0)]    # first moved by 0.1 per element
    out = update_to_weight(after, before)
    assert out[names.UPDATE_TO_WEIGHT_MAX] == pytest.approx(0.1)  # ||0.1 * ones(4)|| / ||ones(4)||
    # all parameters: ||delta|| = 0.2 over ||w|| = sqrt(4 + 36)
    assert out[names.UPDATE_TO_WEIGHT] == pytest.approx(0.2 / math.sqrt(40))


# ---------------------------------------------------------------------------- sampling
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_numerics_are_sampled_on_the_first_and_every_nth_step(precision, dist_info):
    tracker = RecordingTracker()
    _, trainer = trainer_for([f"precision={precision}", "train.numerics_every=5", "train.max_steps=10"],
                             dist_info, tracker)
    trainer.train()
    sampled = [1, 5, 10]
    assert tracker.steps_with(names.NUM_PREFIX) == sampled
    for key in (names.UPDATE_TO_WEIGHT, names.UPDATE_TO_WEIGHT_MAX, names.GRAD_NORM_P50, names.GRAD_NORM_P99,
                names.NUM_SWIGLU_AMAX, names.NUM_SWIGLU_ALIGNMENT, names.swiglu_metric(1, "amax")):
        assert sorted(tracker.by_step(key)) == sampled, key
    assert all(0 < v < 1 for v in tracker.by_step(names.UPDATE_TO_WEIGHT).values())

    # each percentile covers the steps since the previous sample: 2..5, then 6..10
    norms = tracker.by_step(names.GRAD_NORM)
    p50, p99 = tracker.by_step(names.GRAD_NORM_P50), tracker.by_step(names.GRAD_NORM_P99)
    assert p50[1] == p99[1] == norms[1]
    window = sorted(norms[s] for s in range(2, 6))
    assert (p50[5], p99[5]) == (window[1], window[-1])
    window = sorted(norms[s] for s in range(6, 11))
    assert (p50[10], p99[10]) == (window[2], window[-1])

    # cast statistics come from modes with low-precision casts: bf16 autocasts every linear
    cast_key = names.cast_max_metric("input", "amax")
    assert sorted(tracker.by_step(cast_key)) == (sampled if precision == "bf16" else [])


def test_numerics_every_zero_samples_nothing(dist_info):
    tracker = RecordingTracker()
    _, trainer = trainer_for(["precision=bf16", "train.numerics_every=0", "train.max_steps=6"],
                             dist_info, tracker)
    trainer.train()
    assert sorted(tracker.by_step(names.LOSS)) == list(range(1, 7))
    assert tracker.steps_with(names.NUM_PREFIX) == []
    assert tracker.by_step(names.UPDATE_TO_WEIGHT) == {} and tracker.by_step(names.GRAD_NORM_P50) == {}
