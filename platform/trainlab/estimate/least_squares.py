"""calibration.fit's least squares (its docstring gives the model): one problem per device kind.

Each observation contributes its slowest rank's terms as one row, divided by its measured step
(relative errors). A ridge row per coefficient pulls it toward the prior by RIDGE of its own
size, so a coefficient the observations cannot tell apart from another (a fixed overhead and a
per-micro-batch one, on trials that all run one micro-batch) stays near its prior instead of
taking any value the collinearity allows. Coefficients stay positive (active set: one that
comes out below a floor is pinned there and the rest solved again).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from trainlab.estimate.calibration import Calibration, Observation
from trainlab.estimate.rank_layout import Layout
from trainlab.estimate.result import GB
from trainlab.estimate.timing import (
    StepTerms,
    exposed_comm,
    pipeline_factor,
    rank_times,
    step_terms,
)
from trainlab.estimate.trial_estimate import memories_on

RIDGE = 0.003
"""Weight of the pull toward the prior, relative to one observation's relative error."""

# coefficient, how the calibration field holds it (inverted: an efficiency), the term it multiplies
_COLUMNS = (("efficiency", True), ("half_efficiency", True), ("fp8_efficiency", True), ("emulation_cost", False),
            ("fp16_emulation_cost", False), ("comm_efficiency", True), ("call_s", False),
            ("step_overhead_s", False), ("microbatch_overhead_s", False), ("layer_overhead_s", False),
            ("redistribute_s", False), ("unit_overhead_s", False), ("contended_comm_cost", False))


def _field(kind: str, name: str) -> str:
    if name in _ONE_KIND:
        return _ONE_KIND[name]
    return f"{kind}_{name}"


_ONE_KIND = {"fp8_efficiency": "gpu_fp8_efficiency", "contended_comm_cost": "cpu_contended_comm_cost"}
"""Coefficients only one device kind has."""


def fit(observations: Sequence[Observation], *, prior: Calibration | None = None) -> Calibration:
    """The calibration that best explains `observations` (module docstring); `prior` (defaults
    if None) keeps the coefficients no observation informs."""
    return fit_calibration(list(observations), prior=prior or Calibration())


def fit_calibration(observations: list[Observation], *, prior: Calibration) -> Calibration:
    if not observations:
        raise ValueError("no observations to fit: calibrate from a store with finished runs (trainlab calibrate "
                         "--tracking-uri URI --experiment NAME)")
    cases = [_case(o) for o in observations]
    fitted = prior
    # the slowest rank and the exposed communication depend on the coefficients: solve again at
    # the new ones until they settle (Gauss-Newton on the piecewise-linear model)
    for _ in range(ITERATIONS):
        updates: dict[str, float] = {}
        for kind in ("cpu", "gpu"):
            mine = [_slowest(c, fitted) for c in cases if c[0][0].kind == kind]
            if mine:
                updates |= _fit_time(kind, mine, at=fitted, prior=prior)
        fitted = dataclasses.replace(fitted, **updates)
    fitted = dataclasses.replace(fitted, **_fit_memory(cases, prior), source="fit", observations=len(observations))
    return dataclasses.replace(fitted, step_error_before=step_error(cases, prior),
                               step_error_after=step_error(cases, fitted))


ITERATIONS = 4


def _case(o: Observation) -> tuple[list[StepTerms], Observation, list, Layout]:
    """The observation's terms of every rank, with its memories."""
    layout = Layout.of(o.run, o.cluster, o.trial_layout)
    device_type = "cpu" if layout.hardware[0].type == "cpu" else "cuda"
    memories = memories_on(layout, device_type=device_type)
    return step_terms(o.run, layout=layout, state_bytes=[m.state for m in memories]), o, memories, layout


def _slowest(case: tuple, cal: Calibration) -> tuple[StepTerms, Observation]:
    terms, o, _, _ = case
    times = rank_times(terms, calibration=cal)
    return terms[max(range(len(times)), key=lambda r: (times[r].step_s, -times[r].wait_s))], o


def _row(t: StepTerms, prior: Calibration) -> tuple[list[float], float]:
    """The terms each coefficient multiplies (exposed communication as the prior exposes it),
    and the part of the step no coefficient scales (the update, the links' latency)."""
    k = t.kind
    compute = rank_times([t], calibration=prior)[0].compute_s
    comm = exposed_comm(t, prior, compute_s=compute) * prior.of(k, "comm_efficiency")
    slow = 1 / t.core_share  # the overheads of a rank on a share of a core
    piped = pipeline_factor(t)  # all but the optimizer step wait out the pipeline's bubble
    full, half = (0.0, t.compute_ideal_s) if t.half_matmuls else (t.compute_ideal_s, 0.0)
    row = [full * piped, half * piped, t.fp8_ideal_s * piped, t.emulated_ideal_s * piped,
           t.fp16_emulated_ideal_s * piped, comm * piped, t.calls * slow * piped, slow,
           t.micro_batches * slow * piped, t.layer_passes * slow * piped, t.redistributes * slow * piped,
           t.unit_gathers * slow * piped,
           t.comm_contended_ideal_s * max(0.0, slow - 1) * piped if k == "cpu" else 0.0]
    return row, t.memory_s + t.latency_s * slow * piped


def _fit_time(kind: str, cases: list, *, at: Calibration, prior: Calibration) -> dict[str, float]:
    """Coefficients of `kind` from its observations, linearized at `at`, pulled toward `prior`."""
    x0 = np.array([_coef(prior, kind, name, inverted) for name, inverted in _COLUMNS])
    rows, ys = [], []
    for t, o in cases:
        row, fixed = _row(t, at)
        rows.append(np.array(row) / o.step_time_s)
        ys.append((o.step_time_s - fixed) / o.step_time_s)
    a = np.vstack([np.array(rows), np.diag(math.sqrt(RIDGE) / x0)])
    b = np.concatenate([np.array(ys), np.full(len(x0), math.sqrt(RIDGE))])
    x = _positive_lstsq(a, b, floor=x0 * 1e-3)
    out = {}
    for (name, inverted), value in zip(_COLUMNS, x):
        if kind == "cpu" and name == "fp8_efficiency":
            continue  # CPUs run no FP8 matmuls: the GPU's coefficient is not theirs to move
        if kind == "gpu" and name == "contended_comm_cost":
            continue  # a GPU rank has its device to itself
        out[_field(kind, name)] = float(1 / value if inverted else value)
    return out


def _coef(cal: Calibration, kind: str, name: str, inverted: bool) -> float:
    value = getattr(cal, _field(kind, name))
    return 1 / value if inverted else value


def _positive_lstsq(a: np.ndarray, b: np.ndarray, *, floor: np.ndarray) -> np.ndarray:
    pinned: dict[int, float] = {}
    while True:
        free = [j for j in range(a.shape[1]) if j not in pinned]
        rest = b - sum((a[:, j] * v for j, v in pinned.items()), np.zeros_like(b))
        x_free, *_ = np.linalg.lstsq(a[:, free], rest, rcond=None)
        low = [j for j, v in zip(free, x_free) if v < floor[j]]
        if not low:
            x = np.zeros(a.shape[1])
            x[free] = x_free
            for j, v in pinned.items():
                x[j] = v
            return x
        pinned.update({j: float(floor[j]) for j in low})


def _fit_memory(cases: list, prior: Calibration) -> dict[str, float]:
    """measured - counted state = runtime (CPU) + activation_factor x modelled; ridge to the prior."""
    rows, ys = [], []
    for _, o, memories, layout in cases:
        if o.peak_mem_gb is None:
            continue
        m = max(memories, key=lambda m: m.total)  # the largest rank: sys/peak_mem_gb is the max
        cpu = layout.hardware[0].type == "cpu"
        modelled = (m.activations + m.buffers) / GB
        measured = o.peak_mem_gb
        rows.append(np.array([1.0 if cpu else 0.0, modelled]) / measured)
        ys.append((measured - m.state / GB) / measured)
    if not rows:
        return {}
    x0 = np.array([max(prior.cpu_runtime_gb, 1e-3), max(prior.activation_factor, 1e-3)])
    a = np.vstack([np.array(rows), np.diag(math.sqrt(RIDGE) / x0)])
    b = np.concatenate([np.array(ys), np.full(2, math.sqrt(RIDGE))])
    runtime, factor = _positive_lstsq(a, b, floor=np.array([0.0, 0.05]))
    return {"cpu_runtime_gb": float(runtime), "activation_factor": float(factor)}


def step_error(cases: list, cal: Calibration) -> float:
    """RMS of (estimated / measured - 1) over the observations' steps under `cal`."""
    errs = []
    for terms, o, _, _ in cases:
        est = max(t.step_s for t in rank_times(terms, calibration=cal))
        errs.append(est / o.step_time_s - 1)
    return math.sqrt(sum(e * e for e in errs) / len(errs))
