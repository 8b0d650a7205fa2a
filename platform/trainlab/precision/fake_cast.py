"""Emulated small floating-point formats: any exponent/mantissa split, on any device.

Hardware and torch offer a handful of low-precision dtypes (fp16, bf16, two float8s), and
only on some devices. A precision sweep wants more: remove one mantissa or exponent bit at a
time and watch where training breaks, on a CPU as well as a GPU. `quantize` rounds float32
values to the nearest value of any `FloatFormat` (round half to even, gradual underflow,
overflow as below) with a handful of exact float32 operations, so it runs on any device, and
it is bit-exact with torch's own casts where torch has the dtype (float8_e4m3fn, float8_e5m2,
float16, bfloat16): an emulated e4m3 run is the real FP8 cast, not an approximation of it.
For float8_e4m3fn that is the saturating cast (clamp to +-448, then cast) that FP8 recipes
make and torch 2.13's cast makes by itself; torch 2.11's own cast turns whatever rounds above
448 into NaN. The emulation never defers to torch's cast: it clamps itself, so it saturates
the same on every torch.

Conventions, shared by every format:
- has_inf=True (IEEE 754, like e5m2, fp16, bf16): the top exponent code holds inf and NaN.
- has_inf=False (suffix "fn", torch's float8_e4m3fn): the top exponent code holds numbers;
  only the all-ones exponent and all-ones mantissa pattern is NaN (e4m3fn: max 448). With
  man_bits=0 that pattern is the whole top code, so it holds no numbers: e5m0fn has the
  values of e5m0 and differs only in overflowing to the largest value instead of inf.
  The same rule is applied to every "fn" format, e2m1fn included (max 4, values 0, 0.5, 1,
  1.5, 2, 3, 4); note that OCP's FP4/FP6 (MX e2m1, e3m2, e2m3) have no NaN code at all and
  so one more value at the top (e2m1: 6), which this rule does not model.
- Ties go to the even encoding (the last mantissa bit 0). With man_bits=0 that is the even
  exponent code: in e5m0 (bias 15) the tie 3 rounds to 2 (code 16), the tie 6 to 8 (code 18).
- Signed zeros are kept; NaN stays NaN (payload and sign not preserved).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from trainlab.vocab.format_names import F32_MAN_BITS, FloatFormat

# ---------------------------------------------------------------------------------------------
# rounding


def quantize(x: torch.Tensor, fmt: FloatFormat, *, saturate: bool | None = None) -> torch.Tensor:
    """x rounded to the nearest value of `fmt` (ties to even), returned in x's dtype.

    Computed in float32 (x may be float32, bfloat16 or float16; a format finer than x's dtype
    is rounded again on the way back). Subnormals of fmt are kept; below half the smallest
    one a value becomes a zero of its sign. Overflow (a value that rounds above max_value):
    - saturate=None: "fn" formats clamp to +-max_value (inf too, as torch 2.13 casts inf to
      448 in e4m3fn; 2.11 gives NaN, see the module doc); IEEE formats go to +-inf.
    - saturate=True: clamp to +-max_value for any format, inf included.
    - saturate=False: IEEE formats go to +-inf; "fn" formats, which have no inf, go to NaN
      (the OCP FP8 spec's non-saturating mode), inf included.
    """
    if saturate is None:
        saturate = not fmt.has_inf
    out = x.to(torch.float32, copy=True).abs_()
    return _round_magnitudes_(out, fmt, saturate=saturate).copysign_(x).to(x.dtype)


def _round_magnitudes_(out: torch.Tensor, fmt: FloatFormat, *, saturate: bool) -> torch.Tensor:
    """Round a float32 tensor of magnitudes (>= 0 or NaN) to fmt, in place.

    In-place ops and one temporary: on CPU, first-touching freshly allocated memory costs
    more than the arithmetic itself."""
    # beyond twice max_value every value overflows alike; clamping there keeps the quantum
    # finite (inf -> 2 * max, still an overflow; NaN stays NaN through every step below)
    out.clamp_(max=min(2 * fmt.max_value, torch.finfo(torch.float32).max))
    # the quantum (spacing of fmt's values) at |x|: 2**(exponent of |x| - man_bits), fixed at
    # min_subnormal below min_normal. The exponent comes from the float32 bits, so it is exact,
    # and float32 subnormals (exponent field 0) land on the clamp.
    quantum = (out.view(torch.int32) & 0x7F800000).view(torch.float32)
    quantum.clamp_(min=fmt.min_normal).mul_(2.0**-fmt.man_bits)
    # |x| / quantum is exact (power of two), round() is half to even, * quantum exact again;
    # a round up to 2**(man_bits + 1) carries into the next binade as it should
    out.div_(quantum)
    if fmt.man_bits == 0:
        # no mantissa: a tie between 2**e and 2**(e+1) (out == 1.5) goes to the even code, as
        # with every other format; round() would always pick 2. The code of 2**e has the parity
        # of the float32 exponent field, as the bias (2**(exp_bits-1) - 1) and 127 are both odd.
        even_code = (quantum.view(torch.int32) & (1 << F32_MAN_BITS)) == 0
        out.sub_(((out == 1.5) & even_code).float(), alpha=0.5)  # 1.5 -> 1.0
    out.round_().mul_(quantum)
    if saturate:
        return out.clamp_(max=fmt.max_value)
    return out.masked_fill_(out > fmt.max_value, math.inf if fmt.has_inf else math.nan)


def _exp2_int(k: torch.Tensor) -> torch.Tensor:
    """2.0**k for integer k in [-149, 127], built from bits so it is exact (subnormals included)."""
    k = k.to(torch.int32)
    normal = ((k.clamp(min=-126) + 127) << F32_MAN_BITS).view(torch.float32)
    subnormal = (torch.ones_like(k) << (k + 149).clamp(0, 30)).view(torch.float32)
    return torch.where(k >= -126, normal, subnormal)


def tensor_scale(amax: torch.Tensor, fmt: FloatFormat, *, margin: int = 0, power_of_2: bool = False) -> torch.Tensor:
    """fmt.max_value / amax / 2**margin as float32 (any shape, e.g. one amax per row), so that
    amax lands on max_value; 1.0 where amax is 0 or not finite (nothing to scale by), capped at
    float32's range. power_of_2 rounds each scale down to a power of two, which makes
    scaling and unscaling exact."""
    amax = amax.float()
    usable = amax.isfinite() & (amax > 0)
    scale = fmt.max_value / torch.where(usable, amax, 1.0) / 2.0**margin
    scale = torch.where(usable, scale, 1.0).clamp(2.0**-149, torch.finfo(torch.float32).max)
    if power_of_2:
        _, exponent = torch.frexp(scale)  # scale = m * 2**exponent, m in [0.5, 1)
        scale = _exp2_int(exponent - 1)
    return scale


def fake_quantize(x: torch.Tensor, fmt: FloatFormat, *, scaled: bool = True) -> torch.Tensor:
    """The value x takes after a cast to fmt and back, in x's dtype.

    scaled=True: per-tensor scaled cast, as FP8 training recipes do: multiply by
    tensor_scale(amax(x)), quantize with saturation, divide back. So only relative precision
    is lost, not range (a NaN or inf in x leaves it unscaled: amax is not finite).
    scaled=False: the raw cast `quantize(x, fmt)` (torch's overflow rule).
    """
    if not scaled:
        return quantize(x, fmt)
    if x.numel() == 0:
        return x.clone()
    out = x.to(torch.float32, copy=True).abs_()
    scale = tensor_scale(out.amax(), fmt)
    _round_magnitudes_(out.mul_(scale), fmt, saturate=True)
    return out.div_(scale).copysign_(x).to(x.dtype)


# ---------------------------------------------------------------------------------------------
# what a cast loses


@dataclass
class CastStats:
    """What the cast quantize(x * scale, fmt) does to a tensor."""

    amax: float
    """max |x| over finite values of the whole tensor (0 if none)."""
    scale: float
    """The scale used; for a tensor of scales (rowwise), the smallest one (the widest row's)."""
    underflow: float
    """Fraction of non-zero finite x that the cast turns into 0."""
    overflow: float
    """Fraction of finite x whose x * scale rounds beyond max_value: the cast clamps it to
    +-max_value (saturating casts, torchao's included) or turns it to inf/NaN. A value up to
    half a quantum above max_value rounds to max_value, clamp or not, so it is not counted:
    current scaling's fp32 x * (max_value / amax) lands there for the largest element."""


@functools.lru_cache(maxsize=None)
def cast_limits(fmt: FloatFormat) -> tuple[float, float, bool]:
    """Where quantize(y, fmt, saturate=False) leaves fmt's range, for a float32 magnitude y:
    (flush, overflow, tie_overflows). y <= flush rounds to zero; y > overflow rounds beyond
    max_value, and so does y == overflow where tie_overflows. Both bounds are float32 values.

    Read off _round_magnitudes_: below min_normal the quantum is min_subnormal, so the tie
    min_subnormal / 2 (quotient 0.5) rounds to the even 0. At the top the quantum is the one at
    max_value (a power of two times 2**-man_bits, at least min_subnormal), and the tie half a
    quantum above max_value rounds to even: away from max_value where its mantissa is odd (IEEE
    formats: all ones), to it where it is even ("fn": all ones but the last bit, e4m3fn 448,
    whose tie is 464). With man_bits=0 the tie (quotient 1.5) goes to the even exponent code,
    the parity of 2**E's float32 exponent field, as quantize decides it.
    """
    top_exp = math.frexp(fmt.max_value)[1] - 1  # max_value = m * 2**top_exp, 1 <= m < 2
    quantum = max(2.0**top_exp, fmt.min_normal) * 2.0**-fmt.man_bits
    if fmt.man_bits == 0:
        tie_overflows = (top_exp + 127) % 2 == 1  # float32 exponent field of 2**top_exp odd
    else:
        tie_overflows = round(fmt.max_value / quantum) % 2 == 1
    return fmt.min_subnormal / 2, fmt.max_value + quantum / 2, tie_overflows


_EXACT_IN_F32 = (torch.float32, torch.bfloat16, torch.float16)
"""dtypes whose values float32 holds exactly: compared in their own dtype, no conversion."""


@functools.lru_cache(maxsize=None)
def _limits_in(fmt: FloatFormat, dtype: torch.dtype) -> tuple[float, float]:
    """cast_limits as "y <= a" tests on magnitudes y held in dtype (one of _EXACT_IN_F32):
    (a of flushed to zero, a of in range), each the largest dtype value passing the test."""
    flush, overflow, tie_overflows = cast_limits(fmt)

    def largest_at_most(t: float, *, strict: bool) -> float:
        v = torch.tensor(t, dtype=torch.float64).to(dtype)  # nearest (beyond dtype's max: inf)
        if v.item() > t or (strict and v.item() == t):
            v = torch.nextafter(v, torch.tensor(-math.inf, dtype=dtype))
        return v.item()

    return largest_at_most(flush, strict=False), largest_at_most(overflow, strict=tie_overflows)


def cast_stats(
    x: torch.Tensor, fmt: FloatFormat, scale: float | torch.Tensor = 1.0, *, max_elements: int = 1 << 20
) -> CastStats:
    """Measure a cast's underflow and overflow. `scale` is a number or a tensor broadcastable to x.

    Above max_elements elements the fractions are measured on an evenly strided subsample of
    max_elements of them (bounded cost for huge tensors); amax is always over the whole tensor.
    One device sync; two where some value may underflow, overflow or is not finite.

    Counted from cast_limits, without rounding: exactly the values that
    quantize(x.float() * scale, fmt, saturate=False) turns into 0 or beyond max_value
    (tests/unit/test_cast_stats_thresholds.py checks every format against quantize).
    """
    ax = x.detach().abs()
    scale_t = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    if x.numel() == 0:
        return CastStats(amax=0.0, scale=scale_t.amin().item(), underflow=0.0, overflow=0.0)
    # first the extremes: y = fl32(|x| * |scale|) grows with |x| and |scale|, so where the smallest
    # y is above flush and the largest within the range (NaN fails both), nothing is flushed, none
    # overflows and every x is finite and non-zero: nothing to count, the common case
    flush, in_range = _limits_in(fmt, torch.float32)
    lo, hi = ax.aminmax()
    abs_scale = scale_t.abs()
    clear = torch.stack([lo.float() * abs_scale.amin() > flush, hi.float() * abs_scale.amax() <= in_range])
    amax_v, scale_v, none_flushed, none_over = torch.cat([hi.double().reshape(1), scale_t.amin().double()
                                                          .reshape(1), clear.double()]).tolist()
    # (a subsample of rowwise scales reports the smallest sampled scale: that one is counted)
    if none_flushed and none_over and (scale_t.numel() == 1 or x.numel() <= max_elements):
        return CastStats(amax=amax_v, scale=scale_v, underflow=0.0, overflow=0.0)
    return _counted_cast_stats(x, ax, fmt, scale, scale_t, max_elements=max_elements,
                               amax=amax_v if none_over else None, none_flushed=bool(none_flushed))


def _counted_cast_stats(x: torch.Tensor, ax: torch.Tensor, fmt: FloatFormat, scale: float | torch.Tensor,
                        scale_t: torch.Tensor, *, max_elements: int, amax: float | None,
                        none_flushed: bool) -> CastStats:
    """cast_stats by counting (ax = |x|): a comparison per count, each counted without a sum's
    int64 pass, and none where the extremes already gave it (amax: every value finite and in
    range; none_flushed: no zero, none flushed)."""
    amax_t = ax.nan_to_num(nan=0.0, posinf=0.0).amax() if amax is None else None
    if x.numel() > max_elements:
        flat = torch.arange(max_elements, device=x.device) * x.numel() // max_elements
        if scale_t.ndim == 0:  # the same elements as below, from the flat tensor
            ax = ax.reshape(-1)[flat]
        else:  # unravel the flat indices so a broadcast scale is indexed, never materialized
            where = torch.unravel_index(flat, x.shape)
            scale_t = torch.broadcast_to(scale_t, x.shape)[where]
            ax = ax[where]
    count = torch.count_nonzero
    n = ax.numel()
    # a non-finite |x| (inf, NaN) fails every "<=" below, and so does its product with any scale
    n_finite = n if amax is not None else count(ax <= torch.finfo(ax.dtype).max)
    n_zero = 0 if none_flushed else count(ax == 0)
    n_under, y = 0, ax
    if not torch.is_tensor(scale) and scale == 1 and ax.dtype in _EXACT_IN_F32:
        # y = |x| exactly: compared in x's own dtype, the zeros (y = 0 <= flush) taken out
        flush, in_range = _limits_in(fmt, ax.dtype)
        if not none_flushed and flush > 0:  # flush 0: dtype holds nothing fmt flushes, bf16's in bf16
            n_under = count(ax <= flush) - n_zero
    elif not (none_flushed and amax is not None):
        # y = |x| * |scale| rounded to float32, as quantize gets x.float() * scale; a zero x
        # times an infinite scale is NaN there (an overflow, no underflow), so zeros are masked
        flush, in_range = _limits_in(fmt, torch.float32)
        y = ax.to(torch.float32, copy=True).mul_(scale_t.abs())
        if not none_flushed:
            n_under = count((y <= flush) & (ax != 0))
    n_over = 0 if amax is not None else n_finite - count(y <= in_range)  # finite x, y out of range (or NaN)
    counts = [amax_t if amax is None else amax, scale_t.amin(), n_under, n_finite - n_zero, n_over, n_finite]
    amax_v, scale_v, n_under, n_nonzero, n_over, n_finite = torch.stack(
        [torch.as_tensor(c, device=x.device).double() for c in counts]).tolist()
    return CastStats(
        amax=amax_v,
        scale=scale_v,
        underflow=n_under / n_nonzero if n_nonzero else 0.0,
        overflow=n_over / n_finite if n_finite else 0.0,
    )


# ---------------------------------------------------------------------------------------------
# autograd


class FakeCast(torch.autograd.Function):
    """Round in the forward pass to one format and the incoming gradient to another: how an
    emulated low-precision linear casts its activation, weight and output gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, fwd: FloatFormat | None, bwd: FloatFormat | None, scaled: bool):
        ctx.bwd, ctx.scaled = bwd, scaled
        # a copy, not x itself: an input returned as-is is a view autograd forbids editing in place
        return x.clone() if fwd is None else fake_quantize(x, fwd, scaled=scaled)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if ctx.bwd is not None:
            grad = fake_quantize(grad, ctx.bwd, scaled=ctx.scaled)
        return grad, None, None, None


def fake_cast(
    x: torch.Tensor, fwd: FloatFormat | None, bwd: FloatFormat | None, *, scaled: bool = True
) -> torch.Tensor:
    """fake_quantize(x, fwd) forward, fake_quantize(grad, bwd) backward; None leaves that pass exact."""
    if fwd is None and bwd is None:
        return x
    return FakeCast.apply(x, fwd, bwd, scaled)
