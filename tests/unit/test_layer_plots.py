"""The per-layer heatmap's data: a sweep whose trials probed no cast (fp32 layouts log only
their SwiGLU blocks) gets no plot rather than a crashed `trainlab compare`."""

from __future__ import annotations

import pandas as pd

from trainlab import names
from trainlab.compare.layer_plots import layer_grids


def _table(stat: str, layers=("layers.0", "layers.1"), steps=(1, 5)) -> pd.DataFrame:
    return pd.DataFrame([{"step": s, "tokens": s * 64, "kind": names.DETAIL_LAYER, "name": n, "stat": stat,
                          "value": 0.1 * s, "metric": ""} for n in layers for s in steps])


def test_only_swiglu_rows_give_no_grid():
    stat, grids = layer_grids({"parallel=tp": _table("swiglu/amax")})
    assert grids == {}


def test_the_worst_fraction_is_gridded_layer_by_step():
    stat, grids = layer_grids({"precision=fp16": _table("input/underflow", layers=("layers.0.attention.wq",)),
                               "precision=fp32": _table("swiglu/amax")})
    assert stat == "input/underflow" and list(grids) == ["precision=fp16"]
    grid = grids["precision=fp16"]
    assert list(grid.index) == ["layers.0.attention.wq"] and list(grid.columns) == [1, 5]
