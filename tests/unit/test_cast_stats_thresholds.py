"""cast_stats counts underflow and overflow from thresholds (fake_cast.cast_limits), without
rounding: its counts must be exactly those of the cast itself, quantize, for every format, at
and beside each threshold, in every input dtype it compares in, with and without scales."""

from __future__ import annotations

import math
from dataclasses import astuple

import pytest
import torch

from trainlab import names
from trainlab.precision.fake_cast import CastStats, cast_limits, cast_stats, quantize
from trainlab.precision.policy import CastSpec
from trainlab.telemetry.numerics import NumericsProbe
from trainlab.vocab.format_names import FloatFormat, parse_format

NAMED = ["e4m3fn", "e5m2", "fp16", "bf16", "e5m0", "e5m0fn", "e2m1fn", "e2m1", "e3m2", "e2m3", "e3m2fn",
         "e2m3fn", "e8m0", "e4m0fn", "e1m2", "e1m2fn", "e8m3"]


def every_format() -> list[FloatFormat]:
    """Every format FloatFormat accepts (the named ones first): emulation takes any eXmY."""
    fmts = [parse_format(name) for name in NAMED]
    for e in range(1, 9):
        for m in range(0, 16 - e):
            for has_inf in (True, False):
                try:
                    fmt = FloatFormat(e, m, has_inf=has_inf)
                except ValueError:
                    continue
                if fmt not in fmts:
                    fmts.append(fmt)
    return fmts


FORMATS = every_format()


def reference_cast_stats(x: torch.Tensor, fmt: FloatFormat, scale=1.0, *, max_elements: int = 1 << 20) -> CastStats:
    """The counts read off the rounded values themselves (cast_stats before thresholds)."""
    amax = torch.where(x.isfinite(), x.abs(), 0).amax() if x.numel() else x.new_zeros(())
    scale_t = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    if x.numel() > max_elements:
        flat = torch.arange(max_elements, device=x.device) * x.numel() // max_elements
        where = torch.unravel_index(flat, x.shape)
        scale_t = torch.broadcast_to(scale_t, x.shape)[where]
        x = x[where]
    rounded = quantize(x.float() * scale_t, fmt, saturate=False)
    finite = x.isfinite()
    nonzero = finite & (x != 0)
    underflow = nonzero & (rounded == 0)
    overflow = finite & ~rounded.isfinite()
    counts = [amax, scale_t.amin(), underflow.sum(), nonzero.sum(), overflow.sum(), finite.sum()]
    amax_v, scale_v, n_under, n_nonzero, n_over, n_finite = torch.stack([c.double() for c in counts]).tolist()
    return CastStats(amax=amax_v, scale=scale_v,
                     underflow=n_under / n_nonzero if n_nonzero else 0.0,
                     overflow=n_over / n_finite if n_finite else 0.0)


def edges(fmt: FloatFormat, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """Values of dtype whose |x * scale| lies at, one ulp below and one ulp above every threshold
    (flush, overflow bound, and max_value, min_subnormal, min_normal), both signs, plus zeros,
    infinities and NaN."""
    flush, overflow, _ = cast_limits(fmt)
    points = torch.tensor([flush, overflow, fmt.max_value, fmt.min_subnormal, fmt.min_normal, 1.0],
                          dtype=torch.float64) / scale
    points = points.clamp(max=torch.finfo(dtype).max).to(dtype)
    near = torch.cat([points, torch.nextafter(points, points.new_tensor(math.inf)),
                      torch.nextafter(points, points.new_tensor(0.0))])
    special = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan], dtype=dtype)
    return torch.cat([near, -near, special])


def wide(dtype: torch.dtype, n: int = 2048, seed: int = 0) -> torch.Tensor:
    """Random bit patterns of dtype: every exponent, subnormals, infinities and NaN."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.float32:
        return torch.randint(-(2**31), 2**31, (n,), generator=g, dtype=torch.int64).to(torch.int32).view(dtype)
    return torch.randint(-(2**15), 2**15, (n,), generator=g, dtype=torch.int32).to(torch.int16).view(dtype)


def assert_same(x: torch.Tensor, fmt: FloatFormat, scale=1.0, **kw) -> None:
    got, want = cast_stats(x, fmt, scale, **kw), reference_cast_stats(x, fmt, scale, **kw)
    same = [a == b or (math.isnan(a) and math.isnan(b)) for a, b in zip(astuple(got), astuple(want))]
    assert all(same), f"{fmt.name} {x.dtype} scale={scale}: {got} != quantize's {want}"


def test_limits_are_where_quantize_leaves_the_range():
    """The thresholds hold for quantize itself; e4m3fn's tie 464 rounds down to 448, e5m2's 61440 up."""
    for fmt in FORMATS:
        flush, overflow, tie_overflows = cast_limits(fmt)
        y = torch.tensor([flush, overflow])
        above = torch.nextafter(y, y.new_tensor(math.inf))
        below = torch.nextafter(y, y.new_tensor(0.0))
        q = quantize(torch.cat([y, above, below]), fmt, saturate=False)
        assert q[0] == 0 and q[2] > 0 and q[4] == 0, fmt.name
        assert (not q[1].isfinite()) == tie_overflows and not q[3].isfinite() and q[5] <= fmt.max_value, fmt.name
    assert cast_limits(parse_format("e4m3fn")) == (2.0**-10, 464.0, False)
    assert cast_limits(parse_format("e5m2")) == (2.0**-17, 61440.0, True)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_counts_equal_quantize_at_every_threshold(fmt):
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        base = dtype if dtype != torch.float64 else torch.float32
        x = torch.cat([edges(fmt, base), wide(base)]).to(dtype)
        assert_same(x, fmt)  # unscaled: compared in x's own dtype
        if dtype == torch.float64:  # float64 beyond float32: rounded to float32 first, as quantize
            assert_same(torch.tensor([1e-300, -1e300, 1e39, 3.0, 0.0], dtype=dtype), fmt)
    for scale in (2.0**-20, 0.25, 3.0, 2.0**40):  # scaled: |x| * scale in float32
        x = torch.cat([edges(fmt, torch.float32, scale), wide(torch.float32, seed=1)])
        assert_same(x, fmt, scale)
        assert_same(x.bfloat16(), fmt, torch.tensor(scale))


@pytest.mark.parametrize("fmt", FORMATS[:len(NAMED)], ids=lambda f: f.name)  # thresholds: as above
def test_one_value_past_a_threshold_is_counted(fmt):
    """cast_stats skips counting where the extremes of |x * scale| are clear of both thresholds:
    one value at or past either, or one inf or NaN, among clear ones must still be counted."""
    flush, overflow, _ = cast_limits(fmt)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.cat([edges(fmt, dtype), wide(dtype, seed=3)]).float()
        clear = x[(x.abs() > flush) & (x.abs() < overflow)]
        ends = torch.tensor([flush, overflow])
        past = torch.cat([ends, torch.nextafter(ends, ends.new_tensor(math.inf)),
                          torch.nextafter(ends, ends.new_tensor(0.0)),
                          torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan])])
        assert_same(clear.to(dtype), fmt)
        for v in past:
            # the last one: a scale of its own (its row's), 2**-3 or 2**3 where the others have 1
            own = [torch.cat([torch.ones(clear.numel()), torch.tensor([s])]) for s in (2.0**-3, 2.0**3)]
            for scale in (1.0, 2.0**-3, torch.tensor(2.0**-3), *own):
                s = scale if not torch.is_tensor(scale) else scale.reshape(-1)[-1].item()
                y = torch.cat([clear, v.reshape(1) / s]).to(dtype) if dtype == torch.float32 else \
                    torch.cat([clear, v.reshape(1)]).to(dtype)
                assert_same(y, fmt, scale)


@pytest.mark.parametrize("fmt", [parse_format(n) for n in ("e4m3fn", "e5m2", "bf16", "e5m0", "e2m1fn")],
                         ids=lambda f: f.name)
def test_counts_equal_quantize_rowwise_and_subsampled(fmt):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(7, 300, generator=g) * torch.logspace(-30, 30, 300)
    x[:, :40] = edges(fmt, torch.float32)[:40]
    x[0, :3] = 0.0
    # a zero times an infinite or NaN scale is NaN (an overflow, not an underflow)
    rowwise = torch.tensor([[1.0], [0.25], [3.0], [1e30], [0.0], [math.inf], [math.nan]])
    assert_same(x, fmt, rowwise)
    assert_same(x, fmt, rowwise, max_elements=500)
    assert_same(x.t(), fmt, max_elements=500)  # not contiguous: sampled in logical order
    assert_same(x.bfloat16(), fmt, max_elements=999)
    assert_same(x[:0], fmt)
    assert_same(x, fmt, -2.0)


def test_probe_pools_fp16_gradient_underflow_as_quantize_flushes():
    """The probe's fp16 gradient counts (flushed at the loss scale, and had it been 1) are the
    values quantize turns into zero, counted from cast_limits' flush threshold."""
    fp16 = parse_format("fp16")
    layer = torch.nn.Linear(4, 512)
    probe = NumericsProbe([("layer", layer, CastSpec(fp16, fp16, fp16, scaling="loss"))])
    loss_scale = 1024.0
    g = torch.randn(3, 512, generator=torch.Generator().manual_seed(4)) * torch.logspace(-12, 0, 512)
    g[0, :8] = torch.tensor([0.0, -0.0, 2.0**-25, -(2.0**-25), 2.0**-15, 2.0**-14.9, math.inf, math.nan])
    probe.arm(loss_scale=loss_scale)
    layer(torch.ones(3, 4)).backward(g)
    metrics = probe.collect()
    nonzero = g != 0
    n = nonzero.sum().item()
    flushed = (nonzero & (quantize(g, fp16) == 0)).sum().item() / n
    flushed_unscaled = (nonzero & (quantize(g / loss_scale, fp16) == 0)).sum().item() / n
    assert 0 < flushed < flushed_unscaled < 1
    assert metrics[names.NUM_GRAD_UNDERFLOW] == flushed
    assert metrics[names.NUM_GRAD_UNDERFLOW_UNSCALED] == flushed_unscaled
