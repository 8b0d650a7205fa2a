"""Precision recipes (one per mode), fp16 emulation and the device capability table."""

from trainlab.precision.capability import check_precision_supported
from trainlab.precision.recipes import PrecisionRecipe, build_recipe

__all__ = ["PrecisionRecipe", "build_recipe", "check_precision_supported"]
