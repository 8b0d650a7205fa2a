"""Which linear layers run in low precision, and how each one casts its tensors.

One policy for every low-precision mode (torchao FP8, delayed-scaling FP8, emulated formats):
`precision.keep_hp` names the layers that stay in high precision, by keyword or glob. The
result is explicit (a list of converted names and a reason for each kept one), so a run
records exactly what was converted: a filter that silently converts every layer, or none,
shows in the `fp8_layers` tag and fails the policy test.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from trainlab.vocab.format_names import FloatFormat
from trainlab.vocab.precision import KEEP_HP_SELECTORS

ALIGNMENT = 16
"""FP8 matmuls (torch._scaled_mm) need both dimensions of the weight to be multiples of 16."""

_BLOCK = re.compile(r"^layers\.(\d+)\.")


@dataclass(frozen=True)
class CastSpec:
    """How one low-precision linear casts its input, weight and incoming gradient."""

    input: FloatFormat | None
    weight: FloatFormat | None
    grad_output: FloatFormat | None
    scaling: str
    """tensor (one scale per tensor), row (one per row), delayed (the layer's amax-history
    scale), none (raw cast) or loss (fp16: gradients carry the loss scale)."""
    power_of_2: bool = False
    """Scales rounded down to a power of two (torchao's rowwise recipes)."""

    @property
    def scaled(self) -> bool:
        """Whether the cast divides by a scale of its own (tensor, row, delayed), not 1."""
        return self.scaling not in ("none", "loss")


@dataclass
class LayerPlan:
    """The outcome of the policy on one model."""

    lowp: list[str]
    """Linear layers that run in low precision, in model order."""
    hp: dict[str, str]
    """Linear layers kept in high precision -> the keep_hp entry that kept them."""

    @property
    def summary(self) -> str:
        return f"{len(self.lowp)}/{len(self.lowp) + len(self.hp)}"

    @property
    def kept(self) -> str:
        """The kept linears by the entry that kept them: 'small: layers.0.attention.wq,...; output: output'."""
        by_entry: dict[str, list[str]] = {}
        for name, entry in self.hp.items():
            by_entry.setdefault(entry, []).append(name)
        return "; ".join(f"{entry}: {','.join(names)}" for entry, names in by_entry.items())


def linear_layers(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]


def plan_layers(model: nn.Module, keep_hp: list[str], *, size_filter: str = "") -> LayerPlan:
    """Apply keep_hp to every nn.Linear of `model` (names as in model.named_modules()).
    `size_filter`: the torchao recipe whose thresholds define `small` (PrecisionSpec.size_filter).

    Checks the globs first: preflight does too, but torchrun runs no preflight."""
    check_keep_hp(model, keep_hp)
    assert size_filter or "small" not in keep_hp, "PrecisionConfig refuses 'small' without a size filter"
    linears = linear_layers(model)
    blocks = sorted({int(m.group(1)) for n, _ in linears if (m := _BLOCK.match(n))})
    small = too_small_for_fp8(size_filter) if "small" in keep_hp else None
    lowp, hp = [], {}
    for name, module in linears:
        reason = next((entry for entry in keep_hp if _keeps(entry, name, module, blocks, small)), None)
        if reason is None:
            lowp.append(name)
        else:
            hp[name] = reason
    return LayerPlan(lowp=lowp, hp=hp)


def check_keep_hp(model: nn.Module, keep_hp: list[str]) -> None:
    """Refuse keep_hp globs that match no linear layer (a typo would keep nothing in hp)."""
    names = [n for n, _ in linear_layers(model)]
    for entry in keep_hp:
        if entry in KEEP_HP_SELECTORS:
            continue
        if not any(fnmatch.fnmatchcase(n, entry) for n in names):
            raise ValueError(
                f"precision.keep_hp entry {entry!r} matches no linear layer; use one of "
                f"{', '.join(KEEP_HP_SELECTORS)} or a glob over names such as "
                f"{', '.join(names[:3])}, ..., {names[-1]}"
            )


def too_small_for_fp8(recipe: str) -> Callable[[nn.Linear], bool]:
    """Whether an aligned linear is too small for FP8 matmuls to pay for their casts, by torchao's
    auto filter for `recipe` (tensorwise: K <= 4096 and N <= 1024; rowwise: N <= 2048, K <= 1024,
    or N <= 4096 and K <= 2048, for a weight N x K; thresholds from H100 benchmarks that do not
    look at M, the tokens per matmul). Asked of torchao, so the selector follows its version."""
    from torchao.float8 import _auto_filter_for_recipe

    converts = _auto_filter_for_recipe(recipe, filter_fqns=[])
    return lambda module: not converts(module, "")


def _keeps(entry: str, name: str, module: nn.Linear, blocks: list[int],
           small: Callable[[nn.Linear], bool] | None) -> bool:
    block = m.group(1) if (m := _BLOCK.match(name)) else None
    if entry == "first_block":
        return block is not None and blocks and int(block) == blocks[0]
    if entry == "last_block":
        return block is not None and blocks and int(block) == blocks[-1]
    if entry == "output":
        return name == "output"
    unaligned = module.in_features % ALIGNMENT != 0 or module.out_features % ALIGNMENT != 0
    if entry == "unaligned":
        return unaligned
    if entry == "small":  # torchao's filter also refuses unaligned linears: not for their size
        return not unaligned and small(module)
    return fnmatch.fnmatchcase(name, entry)
