"""Precision modes: one specification each (spec), one recipe each (recipes), fp16 and
low-bit emulation, and which device runs which (capability).

Imported lazily: the config schema takes the modes' names from precision.spec, and the
recipes import the schema, so this package must not import its recipes when it loads.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "PrecisionRecipe": "trainlab.precision.recipes",
    "build_recipe": "trainlab.precision.recipes",
    "check_precision_supported": "trainlab.precision.capability",
    "PrecisionSpec": "trainlab.precision.spec",
    "SPECS": "trainlab.precision.spec",
    "spec_of": "trainlab.precision.spec",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
