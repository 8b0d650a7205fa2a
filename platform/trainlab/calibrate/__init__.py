"""`trainlab calibrate`: the estimate's efficiencies fitted to the trials a store recorded."""

from trainlab.calibrate.command import main

__all__ = ["main"]
