"""Float format names: the eXmY grammar (`parse_format`) and what a format is (`FloatFormat`).

Vocabulary: the config checks `precision.formats.*` with it, and the emulation
(trainlab.precision.fake_cast: rounding, scaling, fake casts) computes with it. The conventions
(has_inf, "fn", ties to even) are described in trainlab.precision.fake_cast.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

FLOAT32_MAX = 3.4028234663852886e38
"""torch.finfo(torch.float32).max, without loading torch."""
F32_MAN_BITS = 23
_MAX_TOTAL_BITS = 15  # exponent + mantissa; with the sign at most 16 bits, every value exact in float32


@dataclass(frozen=True)
class FloatFormat:
    """A sign bit, `exp_bits` exponent bits (bias 2**(exp_bits-1) - 1) and `man_bits` mantissa bits."""

    exp_bits: int
    """>= 1; at most 8 (float32's, the format emulation computes in)."""
    man_bits: int
    """>= 0; exp_bits + man_bits <= 15."""
    has_inf: bool = True
    """True: IEEE style, top exponent code is inf/NaN. False: "fn", only all-ones is NaN (see module doc)."""

    def __post_init__(self):
        e, m = self.exp_bits, self.man_bits
        if not (1 <= e <= 8 and 0 <= m <= F32_MAN_BITS and e + m <= _MAX_TOTAL_BITS):
            raise ValueError(
                f"format {self.name!r} has {e} exponent and {m} mantissa bits; emulation computes in "
                f"float32, so it needs 1 <= exp_bits <= 8, 0 <= man_bits and exp_bits + man_bits <= "
                f"{_MAX_TOTAL_BITS} (at most 16 bits with the sign, like fp16 and bf16)"
            )
        if self.max_value == 0.0:
            raise ValueError(f"format {self.name!r} holds no non-zero finite value; give it a mantissa bit")
        if self.max_value > FLOAT32_MAX:
            raise ValueError(
                f"format {self.name!r} holds values above float32's range (its top exponent code is a "
                f"number); use {self.exp_bits}-bit exponents with has_inf=True (e.g. e8m7 = bf16) instead"
            )

    @property
    def name(self) -> str:
        """e.g. "e4m3fn", "e5m2"; what `parse_format` reads back."""
        return f"e{self.exp_bits}m{self.man_bits}" + ("" if self.has_inf else "fn")

    @property
    def bias(self) -> int:
        return 2 ** (self.exp_bits - 1) - 1

    @property
    def max_value(self) -> float:
        """Largest finite value."""
        e, m = self.exp_bits, self.man_bits
        top_code = 2**e - 1
        if not self.has_inf and m > 0:
            # the top code holds numbers; its all-ones mantissa is NaN
            return (2.0 - 2.0 ** (1 - m)) * 2.0 ** (top_code - self.bias)
        if top_code - 1 >= 1:
            return (2.0 - 2.0**-m) * 2.0 ** (top_code - 1 - self.bias)
        # exp_bits=1 with a reserved top code: only subnormals are numbers
        return (2**m - 1) * self.min_subnormal

    @property
    def min_normal(self) -> float:
        """Smallest positive normal value, 2**(1 - bias) (above max_value for the odd e1mY)."""
        return 2.0 ** (1 - self.bias)

    @property
    def min_subnormal(self) -> float:
        """Smallest positive value, 2**(1 - bias - man_bits); the subnormal quantum."""
        return 2.0 ** (1 - self.bias - self.man_bits)

    @property
    def torch_dtype(self) -> torch.dtype | None:
        """The torch dtype holding exactly this format, if there is one."""
        import torch  # only here: the config parses formats without loading torch

        name = _TORCH_DTYPES.get((self.exp_bits, self.man_bits, self.has_inf))
        return None if name is None else getattr(torch, name)


_TORCH_DTYPES = {
    (4, 3, False): "float8_e4m3fn",
    (5, 2, True): "float8_e5m2",
    (5, 10, True): "float16",
    (8, 7, True): "bfloat16",
}

_ALIASES = {
    "e4m3": "e4m3fn",  # what everyone means by FP8 E4M3 (the IEEE-style e4m3 would max at 240)
    "fp8_e4m3": "e4m3fn",
    "fp8_e4m3fn": "e4m3fn",
    "fp8_e5m2": "e5m2",
    "fp16": "e5m10",
    "float16": "e5m10",
    "half": "e5m10",
    "bf16": "e8m7",
    "bfloat16": "e8m7",
}
_SPEC = re.compile(r"e(\d+)m(\d+)(fn)?")


def parse_format(spec: str) -> FloatFormat:
    """"e5m2" (IEEE, with inf), "e4m3fn" (no inf, e4m3fn NaN rule), or an alias: e4m3, fp8_e4m3,
    fp8_e5m2, fp16, bf16. Raises ValueError naming the bad value and the accepted spelling."""
    key = str(spec).strip().lower()
    match = _SPEC.fullmatch(_ALIASES.get(key, key))
    if match is None:
        raise ValueError(
            f"format {spec!r} is not a float format; write eXmY (exponent and mantissa bits, e.g. e4m3, "
            f"e5m2, e2m1fn; suffix fn = no infinities) or one of {', '.join(sorted(_ALIASES))}"
        )
    return FloatFormat(int(match[1]), int(match[2]), has_inf=match[3] is None)
