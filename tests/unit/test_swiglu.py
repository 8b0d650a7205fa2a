"""Smooth-SwiGLU (model.smooth_swiglu) and the SwiGLU outlier telemetry."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from trainlab.config.schema import ModelConfig
from trainlab.models import Transformer, build_model
from trainlab.names import (
    NUM_SWIGLU_ALIGNMENT,
    NUM_SWIGLU_AMAX,
    NUM_SWIGLU_OUTLIER,
    swiglu_metric,
)
from trainlab.telemetry.swiglu import SwigluMonitor, w13_alignment

BYTE_VOCAB = 256
OUTLIER_CHANNEL = 5


def tiny_model(*, smooth: bool, seed: int = 0) -> Transformer:
    """dim 64, ffn 192: multiples of 16, as FP8 matmuls need."""
    torch.manual_seed(seed)
    cfg = ModelConfig(name="tiny", dim=64, n_layers=2, n_heads=4, max_seq_len=64,
                      smooth_swiglu=smooth)
    return build_model(cfg, vocab_size=BYTE_VOCAB)


def tokens(b: int = 4, t: int = 64, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, BYTE_VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def plant_outlier(model: Transformer, *, gain: float, damp_w2: bool = False) -> Transformer:
    """Make channel OUTLIER_CHANNEL of every block an aligned outlier: w3's row = w1's row,
    both scaled by `gain`, so h_c = silu(a) * a with a = gain * w1[c] x grows as gain^2.
    damp_w2 divides w2's column c by gain^2: the block's output is then no longer
    dominated by that one channel, which is how a trained network carries such outliers."""
    for layer in model.layers:
        ff = layer.feed_forward
        ff.w3.weight[OUTLIER_CHANNEL] = ff.w1.weight[OUTLIER_CHANNEL]
        ff.w1.weight[OUTLIER_CHANNEL] *= gain
        ff.w3.weight[OUTLIER_CHANNEL] *= gain
        if damp_w2:
            ff.w2.weight[:, OUTLIER_CHANNEL] /= gain**2
    return model


def forward_backward(model: nn.Module, toks: torch.Tensor) -> torch.Tensor:
    logits = model(toks)
    logits.float().pow(2).mean().backward()
    return logits.detach()


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.float() - ref.float()).norm() / ref.float().norm()).item()


# --- the option -------------------------------------------------------------------------
def test_option_flows_from_config_to_every_block():
    assert all(not layer.feed_forward.smooth for layer in tiny_model(smooth=False).layers)
    assert all(layer.feed_forward.smooth for layer in tiny_model(smooth=True).layers)
    structured = OmegaConf.merge(OmegaConf.structured(ModelConfig),
                                 {"name": "x", "smooth_swiglu": True})
    assert build_model(structured, vocab_size=BYTE_VOCAB).args.smooth_swiglu


@pytest.mark.parametrize("gain", [1.0, 30.0])
def test_smooth_swiglu_is_the_same_function_and_gradients(gain):
    plain = plant_outlier(tiny_model(smooth=False), gain=gain)
    smooth = plant_outlier(tiny_model(smooth=True), gain=gain)
    # What the down projection receives: with smoothing every channel's amax is in (0.5, 1].
    seen: list[torch.Tensor] = []
    smooth.layers[0].feed_forward.w2.register_forward_pre_hook(
        lambda module, args: seen.append(args[0].detach()))
    toks = tokens()
    ref, out = forward_backward(plain, toks), forward_backward(smooth, toks)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    grads = dict(smooth.named_parameters())
    for name, p in plain.named_parameters():
        torch.testing.assert_close(grads[name].grad, p.grad, rtol=1e-5, atol=1e-8, msg=name)
    channel_amax = seen[0].abs().amax(dim=(0, 1))
    assert (channel_amax > 0.5).all() and (channel_amax <= 1.0).all()


def test_smooth_swiglu_keeps_bf16_dtype():
    model = tiny_model(smooth=True).to(torch.bfloat16)
    assert model(tokens(2, 16)).dtype == torch.bfloat16


# --- the reason it exists: FP8 cast of the down projection's input -------------------------
def test_smooth_swiglu_reduces_fp8_error_on_an_outlier_channel():
    import torchao.float8 as fp8  # pinned: an import that fails is a failure, not a skip
    recipe = fp8.Float8LinearConfig.from_recipe_name("tensorwise")

    def fp8_error(*, smooth: bool, gain: float) -> float:
        model = plant_outlier(tiny_model(smooth=smooth), gain=gain, damp_w2=True)
        toks = tokens()
        ref = forward_backward(copy.deepcopy(model), toks)
        fp8.convert_to_float8_training(model, config=recipe,
                                       module_filter_fn=lambda mod, fqn: fqn.endswith("w2"))
        assert type(model.layers[0].feed_forward.w2).__name__ == "Float8Linear"
        out = forward_backward(model, toks)
        w2 = model.layers[0].feed_forward.w2.weight
        assert w2.grad is not None and torch.isfinite(w2.grad).all()  # through functional_call
        return rel_err(out, ref)

    # gain 100 puts h_c near 2e3 against a median |h| near 4e-3: a per-tensor E4M3 scale
    # pushes almost all of h into subnormals or zero. (At gain 30 most of h is still
    # representable and smoothing gains only ~1.2x; without damp_w2 the outlier dominates
    # the block output, and its own rounding, which no rescaling changes, is the error.)
    clean = fp8_error(smooth=False, gain=1.0)
    plain = fp8_error(smooth=False, gain=100.0)
    smooth = fp8_error(smooth=True, gain=100.0)
    assert smooth < plain / 2, (clean, plain, smooth)
    assert smooth < 1.5 * clean, (clean, plain, smooth)  # back to the outlier-free error


# --- SwigluMonitor ------------------------------------------------------------------------
class Wrapper(nn.Module):
    """Stands in for DDP: the model sits under `.module`, names gain a prefix."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module


def test_monitor_matches_hand_computed_values():
    model = tiny_model(smooth=False)
    monitor = SwigluMonitor(Wrapper(model))
    monitor.arm()
    tap0 = model.layers[0].feed_forward.swiglu_tap
    tap1 = model.layers[1].feed_forward.swiglu_tap
    tap0(torch.tensor([[3.0, -4.0], [0.0, 0.0]]))  # amax 4, rms sqrt(25/4) = 2.5: ratio 1.6
    tap0(torch.tensor([[1.0, 1.0], [1.0, -2.0]]))  # amax 2, rms sqrt(7/4): ratio 1.51
    tap1(torch.tensor([[-6.0, 0.0, 0.0, 0.0]]))    # amax 6, rms 3: ratio 2
    stats = monitor.collect()
    expected = {
        swiglu_metric(0, "amax"): 4.0, swiglu_metric(0, "outlier_ratio"): 4.0 / 2.5,
        swiglu_metric(1, "amax"): 6.0, swiglu_metric(1, "outlier_ratio"): 2.0,
        NUM_SWIGLU_AMAX: 6.0, NUM_SWIGLU_OUTLIER: 2.0,
    }
    assert stats == pytest.approx(expected, rel=1e-6)


def test_monitor_over_real_forwards_takes_the_max_over_micro_batches():
    model = plant_outlier(tiny_model(smooth=True), gain=30.0)
    outputs: dict[int, list[torch.Tensor]] = {0: [], 1: []}
    for i, layer in enumerate(model.layers):
        layer.feed_forward.swiglu_tap.register_forward_hook(
            lambda mod, args, out, i=i: outputs[i].append(out.detach()))
    monitor = SwigluMonitor(model)
    monitor.arm()
    with torch.no_grad():
        model(tokens(seed=1))
        model(tokens(seed=2))
    stats = monitor.collect()
    for i, hs in outputs.items():
        assert len(hs) == 2
        amax = max(h.abs().max().item() for h in hs)
        ratio = max((h.abs().max() / h.pow(2).mean().sqrt()).item() for h in hs)
        assert stats[swiglu_metric(i, "amax")] == pytest.approx(amax, rel=1e-6)
        assert stats[swiglu_metric(i, "outlier_ratio")] == pytest.approx(ratio, rel=1e-5)
    assert stats[NUM_SWIGLU_OUTLIER] == max(stats[swiglu_metric(i, "outlier_ratio")]
                                            for i in outputs)


def test_monitor_collects_nothing_unless_armed_and_removes_its_hooks():
    model = tiny_model(smooth=False)
    taps = [layer.feed_forward.swiglu_tap for layer in model.layers]
    monitor = SwigluMonitor(model)
    assert monitor.collect() == {}
    monitor.arm()
    assert all(len(tap._forward_hooks) == 1 for tap in taps)
    with torch.no_grad():
        model(tokens(2, 16))
    assert monitor.collect()
    assert all(not tap._forward_hooks for tap in taps)
    with torch.no_grad():
        model(tokens(2, 16))
    assert monitor.collect() == {}


def test_monitor_finds_blocks_through_the_compile_wrapper():
    model = tiny_model(smooth=False)
    monitor = SwigluMonitor(torch.compile(model))  # construction only: nothing is compiled
    monitor.arm()
    model.layers[1].feed_forward.swiglu_tap(torch.ones(2, 2))
    assert monitor.collect()[swiglu_metric(1, "amax")] == 1.0


# --- w13_alignment -------------------------------------------------------------------------
def test_alignment_is_one_for_a_parallel_row_and_small_at_init():
    model = tiny_model(smooth=False)
    at_init = w13_alignment(model)
    # max over 192 rows of |cos| of independent Gaussian vectors in 64 dims: each is about
    # N(0, 1/64); the max of 384 half-normals sits near sqrt(2 ln 384 / 64) = 0.43.
    bound = 1.4 * math.sqrt(2 * math.log(2 * 192) / 64)
    assert set(at_init) == {swiglu_metric(0, "w13_alignment"), swiglu_metric(1, "w13_alignment"),
                            NUM_SWIGLU_ALIGNMENT}
    assert 0 < at_init[NUM_SWIGLU_ALIGNMENT] < bound
    with torch.no_grad():
        ff = model.layers[1].feed_forward
        ff.w3.weight[7] = -2.0 * ff.w1.weight[7]  # antiparallel counts: |cos|
    aligned = w13_alignment(model)
    assert aligned[swiglu_metric(1, "w13_alignment")] == pytest.approx(1.0, abs=1e-6)
    assert aligned[swiglu_metric(0, "w13_alignment")] == at_init[swiglu_metric(0, "w13_alignment")]
    assert aligned[NUM_SWIGLU_ALIGNMENT] == pytest.approx(1.0, abs=1e-6)


def test_alignment_reads_bf16_and_fp8_converted_weights():
    model = plant_outlier(tiny_model(smooth=False), gain=1.0)  # w3 row = w1 row: |cos| 1
    fp32 = w13_alignment(model)
    assert fp32[NUM_SWIGLU_ALIGNMENT] == pytest.approx(1.0, abs=1e-6)
    as_bf16 = w13_alignment(copy.deepcopy(model).to(torch.bfloat16))
    assert as_bf16[NUM_SWIGLU_ALIGNMENT] == pytest.approx(1.0, abs=1e-6)
    import torchao.float8 as fp8  # pinned: an import that fails is a failure, not a skip
    fp8.convert_to_float8_training(model,
                                   config=fp8.Float8LinearConfig.from_recipe_name("tensorwise"))
    assert type(model.layers[0].feed_forward.w1).__name__ == "Float8Linear"
    assert w13_alignment(model) == fp32
