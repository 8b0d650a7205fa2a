"""Small numeric helpers over metric histories: last value, median, interpolation, seed bands."""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Sequence

import numpy as np

from trainlab.compare.records import Series


def finite_points(series: Series) -> list[tuple[int, float]]:
    """The points whose value is a finite number (NaN/inf mark divergence, not a measurement)."""
    return [(s, v) for s, v in series if math.isfinite(v)]


def last_value(series: Series) -> float | None:
    """The value at the last step, or None if there is none or it is not finite."""
    if not series or not math.isfinite(series[-1][1]):
        return None
    return series[-1][1]


def last_step(series: Series) -> int | None:
    """The last step a metric was logged at (for by-tokens metrics: tokens seen)."""
    return series[-1][0] if series else None


def median_after_first(series: Series) -> float | None:
    """Median of the finite values after the first logged step.

    The first step pays for warm-up, compilation and allocation, so it is dropped; a series
    of one point is used as it is rather than thrown away.
    """
    values = [v for _, v in series[1:] if math.isfinite(v)] if len(series) > 1 else []
    if not values:
        values = [v for _, v in series if math.isfinite(v)]
    return statistics.median(values) if values else None


def max_finite(series: Series) -> float | None:
    values = [v for _, v in series if math.isfinite(v)]
    return max(values) if values else None


def mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (0 for a single value); (None, None) for none."""
    if not values:
        return None, None
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return mean, std


def interpolate(series: Series, x: float) -> float | None:
    """Linear interpolation of the finite points at `x`; None outside their range.

    No extrapolation: a loss curve beyond its last point is unknown, not flat.
    """
    pts = finite_points(series)
    if not pts or x < pts[0][0] or x > pts[-1][0]:
        return None
    xs = [p[0] for p in pts]
    i = bisect.bisect_left(xs, x)
    if xs[i] == x:
        return pts[i][1]
    (x0, y0), (x1, y1) = pts[i - 1], pts[i]
    return y0 + (x - x0) / (x1 - x0) * (y1 - y0)


def mean_curve_at(curves: Sequence[Series], x: float) -> float | None:
    """Mean over `curves` of each one interpolated at `x`; None unless every curve covers x."""
    values = [interpolate(c, x) for c in curves]
    if not values or any(v is None for v in values):
        return None
    return statistics.fmean(values)


def seed_band(curves: Sequence[Series]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x, mean, min, max) over seeds, on the union of their steps where all of them overlap.

    Seeds of one configuration normally share steps; the union grid keeps every measured
    point when they do not, and the overlap keeps the band free of extrapolation.
    """
    pts = [finite_points(c) for c in curves]
    pts = [p for p in pts if p]
    empty = np.array([])
    if not pts:
        return empty, empty, empty, empty
    lo_x = max(p[0][0] for p in pts)
    hi_x = min(p[-1][0] for p in pts)
    grid = np.array(sorted({s for p in pts for s, _ in p if lo_x <= s <= hi_x}), dtype=float)
    if grid.size == 0:
        return empty, empty, empty, empty
    ys = np.stack([np.interp(grid, [s for s, _ in p], [v for _, v in p]) for p in pts])
    return grid, ys.mean(axis=0), ys.min(axis=0), ys.max(axis=0)
