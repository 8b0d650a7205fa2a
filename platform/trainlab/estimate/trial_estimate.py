"""One trial on one cluster, before it runs: memory (estimate.memory_model) and time (estimate.timing).

    est = estimate_trial(run, ClusterSpec.of_nodes(["8xH100"]), trial_layout=plan_layout(run),
                         calibration=load_calibration(path))
"""

from __future__ import annotations

import dataclasses

from trainlab.config.layout_types import TrialLayout
from trainlab.config.schema import RunConfig
from trainlab.estimate.calibration import Calibration
from trainlab.estimate.memory_model import rank_memories
from trainlab.estimate.rank_layout import Layout
from trainlab.estimate.result import GB, DeviceSpec, Estimate, RankEstimate, RankMemory
from trainlab.estimate.shape import model_shape
from trainlab.estimate.timing import rank_times, step_terms
from trainlab.vocab.gpus import NOTES
from trainlab.vocab.nodes import CPU, ClusterSpec
from trainlab.vocab.precision import spec_of


def estimate_trial(run: RunConfig, cluster: ClusterSpec, *, trial_layout: TrialLayout,
                   calibration: Calibration | None = None) -> Estimate:
    """Memory and time of `run` (validated) on `cluster`; ValueError naming the field, value and
    fix for a cluster that cannot hold the gang (too few devices, an unknown GPU type).
    `trial_layout`: the layout the plan decided (plan.derive_layout.plan_layout); never re-derived here."""
    cal = calibration or Calibration()
    layout = Layout.of(run, cluster, trial_layout)
    device_type = "cpu" if layout.hardware[0].type == CPU else "cuda"
    memories = [_calibrated(m, cal, device_type=device_type) for m in memories_on(layout, device_type=device_type)]
    times = rank_times(step_terms(run, layout=layout, state_bytes=[m.state for m in memories]), calibration=cal)
    dtype = spec_of(run.precision.name).peak_dtype(run.precision, device_type=device_type)
    ranks = tuple(
        RankEstimate(rank=r, device=DeviceSpec(name=hw.type, memory_gb=_memory_gb(hw.memory_gb, layout, r),
                                               peak_tflops=layout.peak_tflops(r, dtype), node=layout.nodes[r]),
                     memory=memories[r], time=times[r])
        for r, hw in enumerate(layout.hardware))
    tokens = run.train.global_batch_size * run.train.seq_len
    notes = tuple(sorted({NOTES[hw.type] for hw in layout.hardware if hw.type in NOTES}))
    return Estimate(ranks=ranks, tokens_per_step=tokens,
                    flops_per_step=model_shape(run).model_flops_per_token(run.train.seq_len) * tokens,
                    calibration=cal.source, notes=notes)


def memories_on(layout: Layout, *, device_type: str) -> list[RankMemory]:
    """Each rank's memory (estimate.memory_model, uncalibrated) with its share of the batch."""
    return rank_memories(layout.run, trial_layout=layout.trial_layout, device_type=device_type,
                         micro_batches=_largest_micro_batches(layout))


def _largest_micro_batches(layout: Layout) -> list[int] | None:
    """Per data-parallel rank, its largest micro-batch where the split is not equal (the engine's
    shares, estimate.rank_layout): a faster rank of a weighted split holds a larger one."""
    if layout.run.parallel.dp_balance == "equal" or len(layout.shares) <= 1:
        return None
    return [-(-sequences // micro) for sequences, micro in layout.shares]


def _calibrated(m: RankMemory, cal: Calibration, *, device_type: str) -> RankMemory:
    """The modelled parts scaled by the calibration; a CPU worker's runtime (its RSS besides tensors)."""
    return dataclasses.replace(
        m, activations=round(m.activations * cal.activation_factor), buffers=round(m.buffers * cal.activation_factor),
        runtime=round(cal.cpu_runtime_gb * GB) if device_type == "cpu" else 0)


def _memory_gb(total_gb: float, layout: Layout, rank: int) -> float:
    """A GPU's memory is its own; a host's is shared by the ranks on it."""
    if layout.hardware[rank].type != CPU:
        return total_gb
    return total_gb / layout.nodes.count(layout.nodes[rank])
