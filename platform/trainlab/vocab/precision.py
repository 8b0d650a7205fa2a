"""One specification per precision mode: everything any layer needs to know about it.

Config checks, placement, preflight, parallelize (FSDP2's dtypes), the engine (its recipe
and MFU peak), compare (ordering) and the rollback policy all read `SPECS`; none of them
keeps its own list of modes. A new mode is a recipe class plus one entry here (and its
conf/precision/<name>.yaml).

This module imports nothing of trainlab, so the config schema can take its names from it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # torch is imported where a dtype is asked for: the config (and a refused
    import torch  # command line) never needs it, and it is most of a refusal's start-up time

BF16_UPDATES = ("plain", "stochastic", "kahan")
"""How bf16_pure's bf16 parameters take an update (precision.bf16_update)."""
EMULATION_TARGETS = ("activations", "weights", "gradients", "optimizer_states", "comm_grads")
"""The tensors precision=emulated may round through a format (precision.formats.<target>)."""
KEEP_HP_SELECTORS = ("first_block", "last_block", "output", "unaligned", "small")
"""precision.keep_hp entries besides module-name globs."""


class EmulatedFormatNames(Protocol):
    """precision.formats: the eXmY format of each emulation target ('' = kept as it is)."""

    activations: str
    weights: str
    gradients: str
    optimizer_states: str
    comm_grads: str


class PrecisionSettings(Protocol):
    """What the recipes, the capability checks and `emulates` read of a trial's precision
    settings (config.schema.PrecisionConfig has them): the precision layer takes this protocol,
    not the config schema."""

    name: str
    hp_dtype: str
    tf32: bool
    fp16_impl: str
    fp8_impl: str
    loss_scale: str
    init_scale: float
    growth_factor: float
    backoff_factor: float
    growth_interval: int
    keep_hp: list[str] | None
    amax_history_len: int
    fp8_margin: int
    scaling: str
    formats: EmulatedFormatNames


FP8_TENSOR_CORES = (8, 9)
"""Ada (SM 8.9) and Hopper (9.0) are the first GPUs with FP8 tensor cores."""
HOPPER = (9, 0)
AMPERE = (8, 0)
"""bf16 (and TF32) tensor cores: Ampere and newer."""


def torch_dtype(name: str) -> torch.dtype:
    """fp32, bf16 or fp16 as a torch dtype."""
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


@dataclass(frozen=True)
class PrecisionSpec:
    name: str
    summary: str
    recipe: str
    """The recipe class, as 'module:Class' (imported when a trial builds it)."""
    rank: int
    """Position among modes by how much range and precision they keep (0 = most). compare's
    default baseline is the lowest rank present; a rollback's retry must have a lower rank."""
    min_capability: tuple[int, int]
    """Minimum CUDA compute capability (major, minor) to run natively."""
    emulation: str = ""
    """How the mode runs where its kernels do not ('' = it runs natively everywhere it runs)."""
    compute_dtype: str = "fp32"
    """The dtype of its matmuls (MFU's peak); 'hp' = the precision.hp_dtype of the trial."""
    param_dtype: str = ""
    """FSDP2's all-gather / compute dtype of parameters ('' = the parameters' own dtype,
    'hp' = precision.hp_dtype). Masters stay in the parameters' own dtype."""
    fp8: bool = False
    """FP8 linears: MFU is also reported against the device's FP8 peak."""
    torchao_recipe: str = ""
    """torchao Float8LinearConfig.from_recipe_name name; '' = not a torchao recipe."""
    low_precision_layers: bool = False
    """The keep_hp / hp_dtype policy applies (some linears run in a low-precision format)."""
    loss_scaling: bool = False
    """Gradients carry a loss scale (the precision.init_scale ... fields apply)."""
    low_precision_params: bool = False
    """Parameters are stored in bf16 with no fp32 master: how an update is rounded into them
    matters (precision.bf16_update applies; its value is tagged)."""
    rollback_target: bool = False
    """A diverged trial may retry in this mode: its config is the name alone."""
    tensor_parallel: bool = True
    """Its linears work under DTensor tensor parallel (FP8 linears need their own TP plan)."""
    fp32_hp_min_capability: tuple[int, int] | None = None
    """With precision.hp_dtype=fp32, natively: the capability its FP8 matmuls need instead
    (rowwise-scaled _scaled_mm with an fp32 output exists in cuBLAS for SM 9.0 only)."""
    tf32: bool = False
    """precision.tf32 applies: with it, the mode's fp32 matmuls run on TF32 tensor cores (GPUs
    only); the other modes ignore precision.tf32."""
    keep_hp: tuple[str, ...] = ("output", "unaligned")
    """precision.keep_hp when the config leaves it unset: the linears kept in high precision."""
    size_filter: str = ""
    """The torchao recipe whose size thresholds (torchao.float8._auto_filter_for_recipe, from
    H100 benchmarks) decide keep_hp=small: linears too small for FP8 matmuls to pay for their
    casts. '' = the selector does not apply (no FP8 kernels to pay for)."""

    def needs_capability(self, *, hp_dtype: str, emulated: bool) -> tuple[int, int]:
        """The CUDA compute capability this mode needs with these settings."""
        if emulated or self.name == "emulated":  # casts emulated: the matmuls run in hp_dtype
            return AMPERE if hp_dtype == "bf16" else (0, 0)
        if hp_dtype == "fp32" and self.fp32_hp_min_capability:
            return max(self.min_capability, self.fp32_hp_min_capability)
        return self.min_capability

    def recipe_class(self) -> type:
        module, cls = self.recipe.split(":")
        return getattr(importlib.import_module(module), cls)

    def matmul_dtype(self, hp_dtype: str) -> str:
        """The compute dtype whose peak FLOP/s MFU is measured against."""
        return hp_dtype if self.compute_dtype == "hp" else self.compute_dtype

    def peak_dtype(self, cfg, *, device_type: str) -> str:
        """The dtype whose peak FLOP/s the matmuls of the precision config `cfg` (a
        PrecisionConfig) run at on `device_type` ("cpu" or "cuda"): MFU's denominator and the
        estimate's compute peak. The matmul dtype, or tf32 for fp32 with precision.tf32 on a GPU
        (a CPU has no TF32 cores: it stays fp32)."""
        dtype = self.matmul_dtype(cfg.hp_dtype)
        if self.tf32 and cfg.tf32 and dtype == "fp32" and device_type == "cuda":
            return "tf32"
        return dtype

    def cast_cost(self, *, emulated: bool, device_type: str) -> str:
        """What the mode's low-precision casts cost a step on `device_type` ("cpu" or "cuda"),
        `emulated` as `emulates` says:
        - "fp16_emulated": every autocast matmul rounds its operands through fp16 (precision.emulate);
        - "emulated": the low-precision linears' casts are emulated, or run as real float8 casts
          on a CPU (no FP8 units): their matmuls run at the hp peak, plus the casts' cost;
        - "fp8": the low-precision linears' matmuls run on FP8 tensor cores (the FP8 peak);
        - "": no casts to pay for (every matmul at the mode's peak)."""
        if self.name == "fp16" and emulated:
            return "fp16_emulated"
        if (self.fp8 or self.name == "emulated") and (emulated or device_type == "cpu"):
            return "emulated"
        return "fp8" if self.fp8 else ""

    def fsdp_param_dtype(self, hp_dtype: str, *, emulated: bool) -> torch.dtype | None:
        """FSDP2's MixedPrecisionPolicy.param_dtype: what parameters are all-gathered and
        computed in. Emulated casts round operands themselves and need full-precision inputs."""
        dtype = hp_dtype if self.param_dtype == "hp" else self.param_dtype
        if not dtype or (emulated and self.param_dtype != "hp"):
            return None
        return None if dtype == "fp32" else torch_dtype(dtype)


_RECIPES = "trainlab.precision.recipes"
FP8_KEEP_HP = ("output", "unaligned", "small")
"""FP8 modes keep the linears too small to gain from FP8 in high precision by default: an FP8
trial should be the faster one where FP8 can be (README: which presets have FP8 layers)."""

SPECS: dict[str, PrecisionSpec] = {s.name: s for s in (
    PrecisionSpec("fp32", "fp32 parameters and compute", f"{_RECIPES}:PrecisionRecipe", rank=0,
                  min_capability=(0, 0), rollback_target=True, tf32=True),
    PrecisionSpec("bf16", "bf16 autocast, fp32 master weights", f"{_RECIPES}:AutocastRecipe", rank=1,
                  min_capability=AMPERE, compute_dtype="bf16", param_dtype="bf16", rollback_target=True),
    PrecisionSpec("fp16", "fp16 autocast with dynamic loss scaling, fp32 master weights",
                  f"{_RECIPES}:Fp16Recipe", rank=2, min_capability=(5, 3),
                  emulation="operands rounded through fp16, fp32 accumulation (default on CPU)",
                  compute_dtype="fp16", param_dtype="fp16", loss_scaling=True, rollback_target=True),
    PrecisionSpec("bf16_pure", "bf16 parameters, gradients, optimizer state and compute",
                  f"{_RECIPES}:PureBf16Recipe", rank=3, min_capability=AMPERE, compute_dtype="bf16",
                  low_precision_params=True),
    PrecisionSpec("fp8_delayed", "FP8 linears scaled from an amax history (Transformer Engine style)",
                  f"{_RECIPES}:Fp8Recipe", rank=4, min_capability=FP8_TENSOR_CORES,
                  emulation="the same casts, matmuls in precision.hp_dtype", compute_dtype="hp",
                  param_dtype="hp", fp8=True, low_precision_layers=True, tensor_parallel=False,
                  keep_hp=FP8_KEEP_HP, size_filter="tensorwise"),  # per-tensor scales, like tensorwise
    PrecisionSpec("fp8_rowwise_gw_hp", "torchao FP8 linears, rowwise scales, weight gradient in hp",
                  f"{_RECIPES}:Fp8Recipe", rank=7, min_capability=FP8_TENSOR_CORES,
                  emulation="the same casts, matmuls in precision.hp_dtype", compute_dtype="hp",
                  param_dtype="hp", fp8=True, torchao_recipe="rowwise_with_gw_hp",
                  low_precision_layers=True, tensor_parallel=False, fp32_hp_min_capability=HOPPER,
                  # torchao has no filter for it; its hp weight gradient pays later than rowwise
                  keep_hp=FP8_KEEP_HP, size_filter="rowwise"),
    PrecisionSpec("fp8_rowwise", "torchao FP8 linears, one scale per row", f"{_RECIPES}:Fp8Recipe", rank=6,
                  min_capability=FP8_TENSOR_CORES, emulation="the same casts, matmuls in precision.hp_dtype",
                  compute_dtype="hp", param_dtype="hp", fp8=True, torchao_recipe="rowwise",
                  low_precision_layers=True, tensor_parallel=False, fp32_hp_min_capability=HOPPER,
                  keep_hp=FP8_KEEP_HP, size_filter="rowwise"),
    PrecisionSpec("fp8_tensorwise", "torchao FP8 linears, one scale per tensor", f"{_RECIPES}:Fp8Recipe",
                  rank=5, min_capability=FP8_TENSOR_CORES,
                  emulation="the same casts, matmuls in precision.hp_dtype", compute_dtype="hp",
                  param_dtype="hp", fp8=True, torchao_recipe="tensorwise", low_precision_layers=True,
                  tensor_parallel=False, keep_hp=FP8_KEEP_HP, size_filter="tensorwise"),
    PrecisionSpec("emulated", "any eXmY format on chosen tensors (precision.formats)",
                  f"{_RECIPES}:EmulatedRecipe", rank=8, min_capability=(0, 0),
                  emulation="fake-quantized casts, matmuls in precision.hp_dtype", compute_dtype="hp",
                  low_precision_layers=True),
)}

PRECISIONS = tuple(SPECS)
FP8_PRECISIONS = tuple(n for n, s in SPECS.items() if s.fp8)
FP8_TORCHAO = tuple(n for n, s in SPECS.items() if s.torchao_recipe)
ROLLBACK_PRECISIONS = tuple(n for n, s in SPECS.items() if s.rollback_target)
BY_RANK = tuple(sorted(SPECS, key=lambda n: SPECS[n].rank))
"""Modes from most to least precise."""


def spec_of(name: str) -> PrecisionSpec:
    try:
        return SPECS[name]
    except KeyError:
        raise ValueError(f"precision={name!r} is not a precision mode; choose one of "
                         f"{', '.join(PRECISIONS)}") from None


def emulates(cfg: PrecisionSettings, *, device_type: str) -> bool:
    """Whether the precision settings `cfg` (a PrecisionConfig) run their low-precision casts
    emulated on `device_type` ("cpu" or "cuda"): fp16 per precision.fp16_impl (auto: emulated on
    CPU, native on CUDA), the FP8 modes per precision.fp8_impl, `emulated` always. The one
    decision that the recipes, the capability check and warm-gang isolation all read."""
    spec = spec_of(cfg.name)
    if spec.name == "emulated":
        return True
    if spec.name == "fp16":
        return cfg.fp16_impl == "emulated" or (cfg.fp16_impl == "auto" and device_type == "cpu")
    return spec.fp8 and cfg.fp8_impl == "emulated"
