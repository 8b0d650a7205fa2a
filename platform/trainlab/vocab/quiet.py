"""Lines other libraries print that say nothing to a trainlab user, dropped where they are logged.

    import trainlab          # installs the filters (trainlab/__init__.py): every entry point has them

- torchao, on import, tries its CUDA kernels (``_C_mxfp8``, ``_C_cutlass_90a``) and logs a
  ``Failed to load ...`` warning for each one this machine cannot load: trainlab's FP8 recipes
  check what they need themselves (precision.capability), and the estimate never runs a kernel;
  likewise its note that Triton is missing (a CPU machine has none; the FP8 recipes need no Triton);
- torch's pytree warns that registering torchao's enums is no longer needed (torch 2.13).

Only these records are dropped; every other warning of both loggers still shows.
"""

from __future__ import annotations

import logging

DROPPED = {
    "torchao": ("Failed to load ",),
    "torchao.kernel.intmm": ("Warning: Detected no triton",),
    "torch.utils._pytree": ("%s is an Enum subclass and is now natively supported",),
}
"""Logger name -> the message templates (as logged, before % formatting) its filter drops."""


class _Drop(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(self.prefixes))


def install() -> None:
    """Add the filters once (idempotent)."""
    for name, prefixes in DROPPED.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Drop) for f in logger.filters):
            logger.addFilter(_Drop(prefixes))


__all__ = ["DROPPED", "install"]
