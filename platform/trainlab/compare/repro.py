"""Reproducibility: the runs of a sweep that should match, whether they do, and by how much.

Runs should match when they compute the same math: their flattened configs (MLflow params)
are equal once the keys in SAME_MATH_KEYS are dropped. Those say where and how the math is
laid out (device set, worker count, parallel layout, compilation, deterministic mode) or
where results go; everything else (seed, model, data, optimizer, precision, batch sizes,
steps, parallel.comm_dtype, parallel.powersgd_rank, ...) changes the math and stays in the key.

For each group of two or more finished runs: whether the loss-curve and parameter checksums
(names.TAG_LOSS_CURVE_SHA / TAG_PARAMS_SHA) are identical, and if not, by how much:

- max |Δ train loss|: over the steps every run of the group logged, the largest spread
  (max - min over the runs) of names.LOSS; `rel` divides it by the mean |loss| at that step;
- Δ final val loss: spread of the last names.VAL_LOSS;
- rel Δ param norm: spread of the final names.PARAM_NORM over its largest value.

Runs without the checksums (logged before them) or without params are left out.
"""

from __future__ import annotations

import hashlib
import html
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from trainlab import names
from trainlab.compare import curves
from trainlab.compare.records import Trial
from trainlab.config.moved import upgraded

SAME_MATH_KEYS = (
    "cluster.",  # the device set: device type, worker count, placement, accelerator type
    "tracking.", "output_dir", "sweep_name",  # where results go
    "parallel.name", "parallel.data_parallel", "parallel.dp", "parallel.dp_replicate",
    "parallel.tp", "parallel.sequence_parallel", "parallel.pp", "parallel.pp_schedule",
    "parallel.pp_microbatches", "parallel.pp_virtual_stages", "parallel.bucket_cap_mb",
    "parallel.activation_checkpoint",  # the layout: the same sums, cut differently
    "train.deterministic", "train.compile", "train.compile_unit",  # the kernels, not the math
    "train.log_every", "train.eval_every", "train.numerics_every", "train.spike_factor",
    "train.stop_on_nonfinite",  # what is observed, not what is trained
    "train.checkpoint_every", "train.checkpoint_keep", "train.checkpoint_dir", "train.resume",
               "train.export",
    "debug.inject_fault",  # resumes are exact
    "debug.slowdown", "debug.logical_gpus",  # emulated devices: the same sums, slower or placed elsewhere
)
"""Config keys that do not change a run's math. An entry ending in '.' is a prefix; any other
is an exact key. Not here, on purpose: parallel.comm_dtype and parallel.powersgd_rank (they
round or compress the gradients), train.micro_batch_size (it also sizes the held-out set)."""


def same_math(key: str) -> bool:
    """Whether config key `key` is one of SAME_MATH_KEYS (may differ between matching runs)."""
    return any(key.startswith(k) if k.endswith(".") else key == k for k in SAME_MATH_KEYS)


def math_key(trial: Trial) -> str:
    """12 hex of the config keys that change the math: equal keys, runs that should match."""
    # runs logged before a key moved or a value went compare under today's names
    kept = sorted((k, v) for k, v in upgraded(trial.params).items() if not same_math(k))
    return hashlib.sha256(repr(kept).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class ReproGroup:
    """Runs that should match (same math key), compared."""

    key: str
    runs: tuple[str, ...]  # 'label seed S (run id)' of each run, oldest first
    differs_in: tuple[str, ...]  # the SAME_MATH_KEYS keys whose values differ between them
    loss_curves_identical: bool
    params_identical: bool
    max_abs_dloss: float  # 0.0 when identical
    max_rel_dloss: float
    dloss_step: int | None  # where the largest spread is; None when there is none
    d_val_loss: float | None
    rel_d_param_norm: float | None


def _spread(values: Sequence[float]) -> float:
    return max(values) - min(values)


def _loss_spread(trials: Sequence[Trial]) -> tuple[float, float, int | None]:
    """(max spread, its relative size, its step) of names.LOSS over the steps every run logged."""
    by_run = [dict(t.series(names.LOSS)) for t in trials]
    steps = sorted(set.intersection(*(set(d) for d in by_run)))
    best = (0.0, 0.0, None)
    for s in steps:
        values = [d[s] for d in by_run]
        spread = _spread(values)
        if spread > best[0]:
            best = (spread, spread / (statistics.fmean(abs(v) for v in values) or 1.0), s)
    return best


def _final_spread(trials: Sequence[Trial], key: str) -> list[float]:
    values = [curves.last_value(t.series(key)) for t in trials]
    return [v for v in values if v is not None] if all(v is not None for v in values) else []


def compare_group(key: str, trials: Sequence[Trial]) -> ReproGroup:
    dloss, rel, step = _loss_spread(trials)
    val = _final_spread(trials, names.VAL_LOSS)
    norms = _final_spread(trials, names.PARAM_NORM)
    differs = sorted({k for t in trials for k in t.params if same_math(k)
                      and len({u.params.get(k) for u in trials}) > 1})
    return ReproGroup(
        key=key, runs=tuple(f"{t.label} seed {t.seed or '?'} ({t.run_id})" for t in trials),
        differs_in=tuple(differs),
        loss_curves_identical=len({t.loss_curve_sha for t in trials}) == 1,
        params_identical=len({t.params_sha for t in trials}) == 1,
        max_abs_dloss=dloss, max_rel_dloss=rel, dloss_step=step,
        d_val_loss=_spread(val) if val else None,
        rel_d_param_norm=_spread(norms) / max(norms) if norms and max(norms) else None)


def reproducibility(trials: Sequence[Trial]) -> tuple[ReproGroup, ...]:
    """One ReproGroup per set of >= 2 finished runs with the same math key, in first-run order."""
    groups: dict[str, list[Trial]] = {}
    for t in trials:
        if t.status == names.STATUS_FINISHED and t.params and t.params_sha and t.loss_curve_sha:
            groups.setdefault(math_key(t), []).append(t)
    return tuple(compare_group(k, ts) for k, ts in groups.items() if len(ts) >= 2)


# -- rendering ---------------------------------------------------------------------------------
def _yes(ok: bool) -> str:
    return "identical" if ok else "differ"


def _g(x: float | None, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec)


HEADERS = ("runs", "differ in", "loss curve", "params", "max |Δ train loss|", "at step",
           "rel", "Δ final val loss", "rel Δ param norm")
DEFINITION = ("Reproducibility: runs with the same config except where and how it is laid out "
              "(compare.repro.SAME_MATH_KEYS: cluster.*, the parallel layout, compile, "
              "train.deterministic, tracking and logging); loss curve / params: their SHA-256 "
              "checksums; max |Δ train loss|: the largest spread over runs at one logged step "
              "(rel: over the mean |loss| there); Δ final val loss: spread of the last val loss; "
              "rel Δ param norm: spread of the final parameter L2 norm over its largest value.")


def cells(g: ReproGroup) -> list[str]:
    return ["; ".join(g.runs), ", ".join(g.differs_in) or "-", _yes(g.loss_curves_identical),
            _yes(g.params_identical), _g(g.max_abs_dloss), _g(g.dloss_step, "d"),
            _g(g.max_rel_dloss), _g(g.d_val_loss), _g(g.rel_d_param_norm)]


def rich_table(groups: Sequence[ReproGroup], *, title: str):
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"{title}: reproducibility")
    for h in HEADERS:
        table.add_column(h, overflow="fold")
    for g in groups:
        ok = g.loss_curves_identical and g.params_identical
        table.add_row(*(Text(c) for c in cells(g)), style=None if ok else "yellow")
    return table


def markdown(groups: Sequence[ReproGroup]) -> str:
    def line(items: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in items) + " |"

    rows = [line(HEADERS), line(["---"] * len(HEADERS)), *(line(cells(g)) for g in groups)]
    return "\n".join(["## Reproducibility", "", *rows, "", f"- {DEFINITION}", ""])


def html_section(groups: Sequence[ReproGroup]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in HEADERS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells(g)) + "</tr>"
                   for g in groups)
    return (f"<h2>Reproducibility</h2>\n<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody>"
            f"</table>\n<p class=\"defs\">{html.escape(DEFINITION)}</p>")


__all__ = ["SAME_MATH_KEYS", "ReproGroup", "compare_group", "markdown", "math_key", "reproducibility",
           "same_math"]
