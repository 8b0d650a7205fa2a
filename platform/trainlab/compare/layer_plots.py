"""The per-layer plot of the report: for each configuration, a layer x step heatmap of the cast
statistic that is worst over the sweep (the largest underflow or overflow fraction any layer
reached; the gradients' amax where nothing flushed or saturated).

The numbers come from each trial's detail table (compare.read_detail, names.ARTIFACT_DETAIL); one
trial per configuration, its first finished seed (else its first with a table).
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm, Normalize
from matplotlib.figure import Figure

from trainlab import names
from trainlab.compare.read_detail import read_detail
from trainlab.compare.records import Summary, SweepData, Trial

LAYERS_PNG = "per_layer_numerics.png"
DPI = 110
MAX_WIDTH_IN = 14.0
"""At DPI, ~1540 px: the report's page is read in a 1600 px window."""
FRACTIONS = tuple(f"{t}/{s}" for t in names.CAST_TENSORS for s in (names.CAST_UNDERFLOW, names.CAST_OVERFLOW))
FALLBACK = f"grad_output/{names.CAST_AMAX}"


def _natural(name: str) -> list:
    """layers.2 before layers.10; the output head after the blocks."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _one_per_label(summary: Summary, trials: Sequence[Trial]) -> list[Trial]:
    out = []
    for row in summary.rows:
        mine = [t for t in trials if t.label == row.label]
        finished = [t for t in mine if t.status == names.STATUS_FINISHED]
        out += (finished or mine)[:1]
    return out


def worst_stat(tables: dict[str, object]) -> str:
    """The underflow or overflow fraction with the largest value in any table, else FALLBACK."""
    best, top = FALLBACK, 0.0
    for df in tables.values():
        for stat in FRACTIONS:
            values = df.loc[df["stat"] == stat, "value"]
            v = float(values.max()) if len(values) else 0.0
            if math.isfinite(v) and v > top:
                best, top = stat, v
    return best


def write_layer_heatmaps(data: SweepData, summary: Summary, *, out_dir: Path) -> Path | None:
    """per_layer_numerics.png into out_dir; None (no file) when no trial has per-layer rows."""
    path = out_dir / LAYERS_PNG
    tables = {}
    for t in _one_per_label(summary, data.trials):
        try:
            df = read_detail(tracking_uri=data.tracking_uri, run_id=t.run_id)
        except Exception as e:  # noqa: BLE001 - one unreadable table must not cost the whole report
            warnings.warn(f"per-layer detail of run {t.run_id} ({t.label}) not read: {e}", stacklevel=2)
            continue
        if df is not None and (df["kind"] == names.DETAIL_LAYER).any():
            tables[t.label] = df[df["kind"] == names.DETAIL_LAYER]
    stat, grids = layer_grids(tables)
    if not grids:  # no trial has per-layer rows of a cast (e.g. fp32: only SwiGLU blocks are probed)
        path.unlink(missing_ok=True)  # a stale plot from an earlier compare would mislead
        return None
    return _draw(grids, stat=stat, title=f"{data.name}: per-layer {stat.replace('/', ' ')}", path=path)


def layer_grids(tables: dict[str, object]) -> tuple[str, dict]:
    """The statistic to plot (worst_stat) and, per configuration that has rows of it, its
    layer x step grid; no grids when no table holds that statistic."""
    stat = worst_stat(tables)
    grids = {}
    for label, df in tables.items():
        rows = df[df["stat"] == stat]
        if len(rows):
            grids[label] = rows.pivot_table(index="name", columns="step", values="value", aggfunc="last")
    return stat, grids


def _draw(grids: dict, *, stat: str, title: str, path: Path) -> Path:
    ncols = min(len(grids), 3)
    nrows = math.ceil(len(grids) / ncols)
    n_layers = max(len(g.index) for g in grids.values())
    fig = Figure(figsize=(min(MAX_WIDTH_IN, 2.5 + 4.2 * ncols), 1.2 + nrows * (0.8 + 0.2 * n_layers)),
                 dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    finite = [v for g in grids.values() for v in g.to_numpy().ravel() if math.isfinite(v)]
    positive = [v for v in finite if v > 0]
    if stat.endswith(names.CAST_AMAX) and positive:  # magnitudes span decades
        norm = LogNorm(vmin=min(positive), vmax=max(positive))
    else:  # fractions, from 0
        norm = Normalize(vmin=0.0, vmax=max(finite, default=0.0) or 1.0)
    image = None
    for i, (label, grid) in enumerate(grids.items()):
        ax = axes[i // ncols][i % ncols]
        grid = grid.reindex(sorted(grid.index, key=_natural))
        image = ax.imshow(grid.to_numpy(), aspect="auto", interpolation="nearest", cmap="viridis", norm=norm)
        steps = list(grid.columns)
        ticks = sorted({0, len(steps) - 1, *range(0, len(steps), max(1, len(steps) // 6))})
        ax.set_xticks(ticks, [str(steps[j]) for j in ticks])
        ax.set_yticks(range(len(grid.index)), list(grid.index) if i % ncols == 0 else [""] * len(grid.index),
                      fontsize="x-small")
        ax.set(title=label, xlabel="optimizer step")
    for j in range(len(grids), nrows * ncols):
        axes[j // ncols][j % ncols].set_visible(False)
    fig.colorbar(image, ax=axes, label=stat, shrink=0.9)
    fig.suptitle(title)
    fig.savefig(path)
    return path


__all__ = ["LAYERS_PNG", "worst_stat", "write_layer_heatmaps"]
