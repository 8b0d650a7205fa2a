"""Emulated float formats: bit-exact with torch's casts, right conventions, right measurements."""

from __future__ import annotations

import math

import pytest
import torch

from trainlab.precision.fake_cast import cast_stats, fake_cast, fake_quantize, quantize, tensor_scale
from trainlab.vocab.format_names import FloatFormat, parse_format

E4M3 = parse_format("e4m3fn")
E5M2 = parse_format("e5m2")
FP16 = parse_format("fp16")
BF16 = parse_format("bf16")
F32 = torch.float32


def assert_same_bits(got: torch.Tensor, want: torch.Tensor, inputs: torch.Tensor) -> None:
    """Equal bit for bit (sign of zero included) except NaN payloads: NaN positions must match."""
    assert got.dtype == want.dtype == F32
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan), f"NaN differs at inputs {inputs[got.isnan() != nan][:8].tolist()}"
    bad = got.view(torch.int32) != want.view(torch.int32)
    bad &= ~nan
    assert not bad.any(), (
        f"{int(bad.sum())} values differ, e.g. inputs {inputs[bad][:4].tolist()} -> "
        f"{got[bad][:4].tolist()}, torch gives {want[bad][:4].tolist()}"
    )


def torch_cast(x: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """torch's cast to fmt and back; for an "fn" format (no inf) clamped to +-max_value first,
    the saturating cast FP8 recipes make (torchao: clamp, then cast). torch 2.13's e4m3fn cast
    saturates by itself; 2.11's turns everything that rounds above 448 into NaN."""
    if not fmt.has_inf:
        x = x.clamp(-fmt.max_value, fmt.max_value)  # inf -> max; NaN stays NaN
    return x.to(fmt.torch_dtype).to(x.dtype)


def raw_torch_cast(x: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    return x.to(fmt.torch_dtype).to(x.dtype)


def all_16bit(dtype: torch.dtype) -> torch.Tensor:
    """Every bfloat16 or float16 bit pattern, as float32."""
    return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype).float()


def random_bits(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-(2**31), 2**31, (n,), generator=g, dtype=torch.int64).to(torch.int32).view(F32)


def neighbours(x: torch.Tensor) -> torch.Tensor:
    """x and the float32 values one ulp either side."""
    return torch.cat([x, torch.nextafter(x, x.new_tensor(math.inf)), torch.nextafter(x, x.new_tensor(-math.inf))])


def fp8_edge_cases(fmt: FloatFormat) -> torch.Tensor:
    """Every representable value, every midpoint (+-1 ulp), the overflow and underflow edges."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fmt.torch_dtype).float()
    pos = codes[codes.isfinite() & (codes > 0)].unique()  # sorted
    mids = (torch.cat([pos.new_zeros(1), pos[:-1]]) + pos) / 2  # exact in float32; ties
    top_ulp = float(pos[-1] - pos[-2])
    beyond = torch.tensor([fmt.max_value + top_ulp / 2, fmt.max_value + top_ulp, 2 * fmt.max_value, 1e30,
                           torch.finfo(F32).max, math.inf])
    tiny = torch.cat([torch.linspace(0, 2 * fmt.min_subnormal, 1001), torch.tensor([1e-45, 1e-40, 1e-30])])
    x = torch.cat([pos, neighbours(mids), neighbours(beyond), neighbours(tiny), torch.tensor([0.0, math.nan])])
    return torch.cat([x, -x])


# ---------------------------------------------------------------------------------------------
# bit-exact with torch


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=lambda f: f.name)
def test_fp8_emulation_equals_torch_cast_on_every_edge_case(fmt):
    x = fp8_edge_cases(fmt)
    assert_same_bits(quantize(x, fmt), torch_cast(x, fmt), x)


@pytest.mark.parametrize("fmt", [E4M3, E5M2, FP16, BF16], ids=lambda f: f.name)
@pytest.mark.parametrize("source", ["bf16_patterns", "fp16_patterns", "random_bits"])
def test_emulation_equals_torch_cast_on_bit_patterns(fmt, source):
    x = {
        "bf16_patterns": lambda: all_16bit(torch.bfloat16),
        "fp16_patterns": lambda: all_16bit(torch.float16),
        "random_bits": lambda: random_bits(2**22, seed=len(fmt.name)),
    }[source]()
    assert_same_bits(quantize(x, fmt), torch_cast(x, fmt), x)


@pytest.mark.parametrize("fmt", [FP16, BF16], ids=lambda f: f.name)
def test_16bit_emulation_equals_torch_on_its_rounding_edges(fmt):
    # midpoints of the target format: the other 16-bit grid is too coarse (or too narrow) to hit them
    values = all_16bit(fmt.torch_dtype)
    pos = values[values.isfinite() & (values > 0)].unique()
    mids = (pos[:-1] + pos[1:]) / 2
    x = neighbours(torch.cat([mids, pos[-1:] + (pos[-1] - pos[-2]) / 2]))
    x = torch.cat([x, -x])
    assert_same_bits(quantize(x, fmt), torch_cast(x, fmt), x)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs_come_back_in_their_dtype_as_torch_casts_them(dtype):
    x = all_16bit(dtype).to(dtype)
    got = quantize(x, E4M3)
    assert got.dtype == dtype
    assert_same_bits(got.float(), torch_cast(x, E4M3).float(), x.float())


def test_e4m3fn_saturates_on_every_torch_and_e5m2_overflows_to_inf():
    x = torch.tensor([464.0, 480.0, 1e6, math.inf, -math.inf])
    # the emulation clamps itself: the same on every torch, whatever torch's own cast does
    assert quantize(x, E4M3).tolist() == [448.0, 448.0, 448.0, 448.0, -448.0]
    assert fake_quantize(x, E4M3, scaled=False).tolist() == [448.0, 448.0, 448.0, 448.0, -448.0]
    # torch's own cast, measured: 2.13 saturates the same way; 2.11 rounds only the tie 464 to
    # 448 and makes NaN of the rest (an emulation that deferred to it would differ by version)
    raw = raw_torch_cast(x, E4M3)
    assert raw.tolist() == [448.0, 448.0, 448.0, 448.0, -448.0] or (
        raw[0] == 448.0 and raw[1:].isnan().all()), raw.tolist()
    y = torch.tensor([61439.0, 61440.0, math.inf, -1e9])  # 61440 = max + half ulp: the tie rounds up, to inf
    assert quantize(y, E5M2).tolist() == [57344.0, math.inf, math.inf, -math.inf]


def test_saturate_overrides_the_format_default():
    x = torch.tensor([1e6, -math.inf, math.inf, math.nan, 3.0])
    assert quantize(x, E5M2, saturate=True)[:3].tolist() == [57344.0, -57344.0, 57344.0]
    out = quantize(x, E4M3, saturate=False)  # no inf in e4m3fn: overflow is NaN, as OCP's non-saturating mode
    assert out[:4].isnan().all() and out[4] == 3.0
    assert quantize(x, E5M2, saturate=True)[3].isnan()


# ---------------------------------------------------------------------------------------------
# every other format, against a reference decoder written from the definition


def decode_all(fmt: FloatFormat) -> list[tuple[int, float]]:
    """(code, value) of every non-negative finite encoding, decoded one by one in Python."""
    out = []
    for code in range(2 ** (fmt.exp_bits + fmt.man_bits)):
        e, m = divmod(code, 2**fmt.man_bits)
        top = e == 2**fmt.exp_bits - 1
        if top and (fmt.has_inf or m == 2**fmt.man_bits - 1):
            continue  # inf/NaN codes
        if e == 0:
            value = m * 2.0 ** (1 - fmt.bias - fmt.man_bits)
        else:
            value = (1 + m / 2**fmt.man_bits) * 2.0 ** (e - fmt.bias)
        out.append((code, value))
    return out


SMALL = ["e2m1fn", "e2m3fn", "e3m2", "e3m2fn", "e4m2", "e5m0", "e5m0fn", "e1m2", "e1m1fn", "e6m1", "e3m0fn"]


@pytest.mark.parametrize("spec", SMALL)
def test_small_formats_hold_exactly_their_values_and_round_ties_to_even(spec):
    fmt = parse_format(spec)
    table = decode_all(fmt)
    values = torch.tensor([v for _, v in table])
    assert fmt.max_value == values.max().item()
    assert fmt.min_subnormal == values[values > 0].min().item()
    assert torch.equal(quantize(values, fmt), values)
    assert torch.equal(quantize(-values, fmt), -values)
    # each midpoint goes to the neighbour with the even code; one float32 ulp decides it otherwise
    codes, vals = zip(*table)
    mids = torch.tensor([(a + b) / 2 for a, b in zip(vals, vals[1:])])
    even = torch.tensor([a if c % 2 == 0 else b for c, a, b in zip(codes, vals, vals[1:])])
    assert torch.equal(quantize(mids, fmt), even)
    assert torch.equal(quantize(torch.nextafter(mids, values[1:]), fmt), values[1:])
    assert torch.equal(quantize(torch.nextafter(mids, values[:-1]), fmt), values[:-1])
    # whatever goes in, what comes out is one of the values
    dense = torch.cat([torch.linspace(-1.5 * fmt.max_value, 1.5 * fmt.max_value, 100_001), random_bits(100_000)])
    image = quantize(dense, fmt, saturate=True).unique()
    assert set(image[~image.isnan()].tolist()) <= set(values.tolist()) | set((-values).tolist())


def test_known_format_numbers():
    assert (E4M3.max_value, E4M3.min_normal, E4M3.min_subnormal) == (448.0, 2.0**-6, 2.0**-9)
    assert (E5M2.max_value, E5M2.min_normal, E5M2.min_subnormal) == (57344.0, 2.0**-14, 2.0**-16)
    assert (FP16.max_value, FP16.min_subnormal) == (65504.0, 2.0**-24)
    for fmt in (E4M3, E5M2, FP16, BF16):
        info = torch.finfo(fmt.torch_dtype)
        assert (fmt.max_value, fmt.min_normal) == (info.max, info.smallest_normal)
    e2m1 = parse_format("e2m1fn")  # e4m3fn's rule: the all-ones code is NaN, so max 4 (OCP FP4 has 6)
    assert (e2m1.max_value, e2m1.min_subnormal, e2m1.bias) == (4.0, 0.5, 1)
    assert parse_format("e3m2").max_value == 14.0 and parse_format("e3m2fn").max_value == 24.0
    # man_bits=0: the top exponent holds only NaN, so fn and IEEE share their values
    assert parse_format("e5m0fn").max_value == parse_format("e5m0").max_value == 2.0**15
    assert parse_format("e4m3").torch_dtype is torch.float8_e4m3fn and parse_format("e3m2").torch_dtype is None


def test_man_bits_zero_fn_saturates_where_ieee_overflows_and_ties_go_to_the_even_code():
    x = torch.tensor([2.0**16, math.inf])
    assert quantize(x, parse_format("e5m0fn")).tolist() == [2.0**15, 2.0**15]
    assert quantize(x, parse_format("e5m0")).tolist() == [math.inf, math.inf]
    # bias 15: 2 is code 16, 4 code 17, 8 code 18
    assert quantize(torch.tensor([3.0, 6.0]), parse_format("e5m0")).tolist() == [2.0, 8.0]


def test_signed_zero_and_nan_survive():
    x = torch.tensor([-1e-30, 1e-30, -0.0, math.nan])
    out = quantize(x, E4M3)
    assert out[:3].tolist() == [0.0, 0.0, 0.0]
    assert torch.signbit(out[:3]).tolist() == [True, False, True]
    assert out[3].isnan()


# ---------------------------------------------------------------------------------------------
# parsing


def test_parse_format_aliases_and_names():
    assert parse_format("e4m3") == parse_format("fp8_e4m3") == FloatFormat(4, 3, has_inf=False)
    assert parse_format("fp8_e5m2") == FloatFormat(5, 2)
    assert parse_format("fp16").name == "e5m10" and parse_format("BF16").name == "e8m7"
    for spec in ("e4m3fn", "e5m2", "e2m1fn", "e3m2", "e5m10", "e8m7"):
        assert parse_format(spec).name == spec


@pytest.mark.parametrize("spec", ["e9m", "fp7", "e4", "m3e4", ""])
def test_bad_spec_error_names_the_value_and_the_spelling(spec):
    with pytest.raises(ValueError, match=f"format '{spec}' is not a float format; write eXmY"):
        parse_format(spec)


@pytest.mark.parametrize("spec", ["e9m2", "e0m3", "e8m8", "e3m13"])
def test_out_of_range_formats_say_the_limits(spec):
    with pytest.raises(ValueError, match=f"'{spec}'.*float32.*exp_bits \\+ man_bits <= 15"):
        parse_format(spec)


def test_formats_without_numbers_or_beyond_float32_are_refused():
    with pytest.raises(ValueError, match="no non-zero finite value"):
        parse_format("e1m0")
    with pytest.raises(ValueError, match="above float32's range"):
        parse_format("e8m7fn")


# ---------------------------------------------------------------------------------------------
# scaling


def test_tensor_scale():
    amax = torch.tensor([2.0, 0.0, math.inf, math.nan, 1e-3])
    assert tensor_scale(amax, E4M3).tolist()[:4] == [224.0, 1.0, 1.0, 1.0]
    assert tensor_scale(amax, E4M3, margin=1)[0].item() == 112.0
    pow2 = tensor_scale(amax, E4M3, power_of_2=True)
    assert pow2.tolist()[:4] == [128.0, 1.0, 1.0, 1.0]
    assert pow2[4].item() == 2.0 ** math.floor(math.log2(448 / 1e-3))
    rowwise = tensor_scale(torch.tensor([[1.0], [4.0]]), E5M2)
    assert rowwise.shape == (2, 1) and rowwise.flatten().tolist() == [57344.0, 14336.0]


def test_fake_quantize_keeps_relative_precision_with_scaling_and_loses_range_without():
    # far below e4m3fn's smallest subnormal; drawn in float32: torch 2.11's bfloat16 randn
    # gives exact zeros (0.6 %), whose relative error is 0/0
    x = (torch.randn(1000) * 1e-7).to(torch.bfloat16)
    assert not quantize(x, E4M3).any()
    assert not fake_quantize(x, E4M3, scaled=False).any()
    y = fake_quantize(x, E4M3)
    assert y.dtype == torch.bfloat16
    rel = ((y.float() - x.float()).abs() / x.float().abs()).max()
    assert rel <= 2.0**-4 + 2.0**-8  # half an e4m3 ulp, plus bf16's own rounding of the result


def test_fake_quantize_saturates_instead_of_overflowing():
    x = torch.tensor([1.0, 100.0, 1e6])
    assert fake_quantize(x, E5M2).isfinite().all()
    assert fake_quantize(x, E5M2)[2].item() == pytest.approx(1e6, rel=2.0**-3)


# ---------------------------------------------------------------------------------------------
# cast statistics


def test_cast_stats_counts_exactly():
    half_sub = E5M2.min_subnormal / 2
    x = torch.tensor(
        [0.0] * 5  # zeros: never underflow
        + [half_sub / 2] * 7  # underflow
        + [-half_sub] * 3  # the tie goes to zero: underflow
        + [half_sub * 1.01] * 2  # rounds up to the smallest subnormal
        + [1.0] * 11
        + [1e6] * 2  # overflow
        + [math.inf, math.nan]  # not finite: in no count
    )
    stats = cast_stats(x, E5M2)
    assert stats.amax == 1e6 and stats.scale == 1.0
    assert stats.underflow == pytest.approx(10 / 25)  # of the 25 non-zero finite
    assert stats.overflow == pytest.approx(2 / 30)  # of the 30 finite
    scaled = cast_stats(x, E5M2, scale=16.0)  # tiny ones move up into range, 1e6 still overflows
    assert scaled.underflow == pytest.approx(0.0)
    assert scaled.overflow == pytest.approx(2 / 30)
    assert scaled.scale == 16.0


# values beside each format's max_value: rounded to it (in range, torch's cast gives max_value
# too) / rounded beyond it (the cast saturates, e4m3fn, or turns them to inf, e5m2 and fp16)
OVERFLOW_EDGE = {
    E4M3: ([448.0, math.nextafter(448.0, math.inf), 463.99, 464.0], [464.01, 1e6]),  # quantum 32
    E5M2: ([57344.0, 61439.0], [61440.0, 1e6]),  # quantum 8192; the tie 61440 goes to inf (even)
    FP16: ([65504.0, 65519.0], [65520.0, 1e6]),  # quantum 32
}


@pytest.mark.parametrize("fmt", OVERFLOW_EDGE, ids=lambda f: f.name)
def test_cast_stats_overflow_is_what_the_cast_saturates_or_turns_to_inf(fmt):
    in_range, beyond = (torch.tensor(v) for v in OVERFLOW_EDGE[fmt])
    real = in_range.to(fmt.torch_dtype).float()  # torch's own cast: the value rounded, nothing clipped
    assert torch.equal(real, quantize(in_range, fmt, saturate=False)) and real.max() <= fmt.max_value
    assert cast_stats(in_range, fmt).overflow == 0.0
    assert cast_stats(beyond, fmt).overflow == 1.0
    assert cast_stats(-beyond, fmt).overflow == 1.0


@pytest.mark.parametrize("rowwise", [False, True], ids=["tensorwise", "rowwise"])
def test_current_scaling_overflows_nothing_where_fp32_lands_above_max(rowwise):
    """x * (448 / amax) in fp32 lands one rounding step above 448 for the largest element of
    many tensors; the recipe's cast (torchao: clamp, then cast) rounds it to 448 all the same."""
    g = torch.Generator().manual_seed(0)
    above = 0
    for _ in range(50):
        x = torch.randn(16, 64, generator=g)
        amax = x.abs().amax(dim=-1, keepdim=True) if rowwise else x.abs().amax()
        scale = tensor_scale(amax, E4M3)
        xs = x * scale
        above += int((xs.abs() > E4M3.max_value).any())
        cast = xs.clamp(-E4M3.max_value, E4M3.max_value).to(torch.float8_e4m3fn).float()
        assert torch.equal(cast, xs.to(torch.float8_e4m3fn).float())  # the clamp changed nothing
        assert cast_stats(x, E4M3, scale).overflow == 0.0
    assert above >= 5  # the edge was really there (measured: 11 tensors of 50; rowwise 48 of 50)


def test_a_stale_delayed_scale_overflows():
    """Delayed scaling: the scale of an amax of 10 meets a tensor whose amax is 80."""
    scale = tensor_scale(torch.tensor(10.0), E4M3)
    x = torch.tensor([1.0, -2.0, 10.0, -10.0, 10.3, 11.0, -50.0, 80.0])  # 10.3 * 44.8 rounds to 448
    cast = (x * scale).clamp(-E4M3.max_value, E4M3.max_value).to(torch.float8_e4m3fn).float() / scale
    assert cast[-3:].tolist() == [10.0, -10.0, 10.0]  # what the recipe's saturating cast makes of them
    assert cast_stats(x, E4M3, scale).overflow == pytest.approx(3 / 8)


def test_cast_stats_rowwise_scale():
    x = torch.full((2, 4), 1e-6)  # below half of e5m2's smallest subnormal (7.6e-6)
    x[1, 0] = 100.0
    stats = cast_stats(x, E5M2, scale=torch.tensor([[1.0], [1024.0]]))
    assert stats.underflow == pytest.approx(4 / 8)  # row 0 underflows, row 1 is lifted into range
    assert stats.overflow == pytest.approx(1 / 8)  # 100 * 1024 > 57344
    assert stats.scale == 1.0


def test_cast_stats_subsamples_but_keeps_amax_exact():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 50_000, generator=g)
    x[7, 13] = 1e9  # one spike; the subsample almost surely misses it
    scale = torch.rand(64, 1, generator=g) * 4e4 + 1e4  # rowwise, ~1-2% of values overflow e5m2
    full = cast_stats(x, E5M2, scale, max_elements=x.numel())
    sampled = cast_stats(x, E5M2, scale, max_elements=10_000)
    assert sampled.amax == full.amax == 1e9
    assert full.overflow > 0.005
    assert sampled.overflow == pytest.approx(full.overflow, abs=0.005)
    assert sampled.scale == full.scale


# ---------------------------------------------------------------------------------------------
# autograd


def test_fake_cast_rounds_forward_and_backward():
    x = torch.tensor([1.0, 1.1, 300.0, 1000.0], requires_grad=True)
    y = fake_cast(x, E4M3, E5M2, scaled=False)
    assert torch.equal(y.detach(), quantize(x.detach(), E4M3))
    tiny = torch.full((4,), 1e-7)  # below half e5m2's smallest subnormal
    y.backward(tiny)
    assert not x.grad.any()  # an unscaled e5m2 gradient underflows

    x.grad = None
    fake_cast(x, E4M3, E5M2, scaled=True).backward(tiny)
    assert torch.allclose(x.grad, tiny, rtol=2.0**-3)  # scaled: the gradient survives


def test_fake_cast_with_no_forward_format_is_an_editable_copy():
    x = torch.randn(4, requires_grad=True)
    h = x * 1.0
    y = fake_cast(h, None, E5M2)
    assert torch.equal(y.detach(), h.detach())
    y += 1.0  # a view returned from a custom Function could not be edited in place
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones(4))
    assert fake_cast(h, None, None) is h
