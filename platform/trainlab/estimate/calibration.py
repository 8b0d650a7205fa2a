"""The estimate's efficiencies and overheads: defaults, a JSON file, and a fit to recorded runs.

    cal = load_calibration("calibration.json")      # cluster.calibration; '' = Calibration()
    cal = fit([Observation(run=run, trial_layout=plan_layout(run), cluster=cluster, step_time_s=0.21,
                           peak_mem_gb=1.3), ...])
    cal.save("calibration.json")

The time model is linear in its coefficients once the device, the layout and the bytes are
fixed (estimate.timing.StepTerms): a step of the slowest rank, out of the pipeline's bubble, is

    (1 - bubble) x step = compute_ideal / efficiency + fp8_ideal / fp8_efficiency
                          + emulated_ideal x emulation_cost + fp16_emulated_ideal x fp16_emulation_cost
                          + comm_ideal / comm_efficiency + calls x call_s
                          + step_overhead + micro_batches x microbatch_overhead
                          + layer_passes x layer_overhead + tp_layer_passes x tp_layer_overhead

so `fit` solves one least-squares problem per device kind (cpu, gpu) over the observations'
terms, each row divided by its measured step (relative errors: a 10 ms trial counts as much as
a 10 s one), pulled gently toward the defaults so that a coefficient no observation moves stays
where it was, and kept positive. Peak memory fits the same way: measured - counted state =
runtime + activation_factor x (activations + buffers).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trainlab.vocab.files import read_text

if TYPE_CHECKING:
    from trainlab.config.layout_types import TrialLayout
    from trainlab.config.schema import RunConfig
    from trainlab.vocab.nodes import ClusterSpec

KINDS = ("cpu", "gpu")


@dataclass(frozen=True)
class Calibration:
    """Efficiencies (shares of a peak reached) and overheads (seconds), per device kind."""

    source: str = "default"
    """Where the numbers came from: 'default', or the calibration file (Estimate.calibration)."""
    cpu_efficiency: float = 0.75
    """Model FLOP/s over the probed matmul peak a CPU rank reaches in forward + backward."""
    gpu_efficiency: float = 0.45
    """Model FLOP/s over the table's peak (the mode's matmul dtype) a GPU reaches: torchtitan's
    Llama3-8B FSDP runs at 33-39 % MFU on H100 (docs/performance.md), 0.45 of the matmuls' share."""
    cpu_half_efficiency: float = 0.1
    """The same for bf16/fp16 matmuls over the probed bf16 peak: a CPU's AMX/AVX512-BF16 kernels
    pack and convert their operands per call, which a small model's matmuls do not amortize."""
    gpu_half_efficiency: float = 0.45
    """The same for bf16/fp16 matmuls: gpu_efficiency's torchtitan runs are bf16."""
    gpu_fp8_efficiency: float = 0.3
    """The same for the FP8 linears' FLOPs over the FP8 peak (their casts and amax reductions count)."""
    cpu_emulation_cost: float = 3.0
    """Extra seconds per ideal matmul second of an emulated or CPU-native low-precision linear
    (casts, rounding, _scaled_mm's CPU kernel)."""
    gpu_emulation_cost: float = 0.3
    cpu_fp16_emulation_cost: float = 0.2
    """The same for fp16 emulation (precision.emulate: operands rounded through fp16 and back,
    fp32 matmuls): two elementwise casts per operand, no scaling or amax, so far cheaper per
    matmul second than an FP8 recipe's casts."""
    gpu_fp16_emulation_cost: float = 0.3
    cpu_comm_efficiency: float = 0.25
    """Share of the link model's bandwidth a collective reaches (gloo over loopback)."""
    gpu_comm_efficiency: float = 0.7
    cpu_contended_comm_cost: float = 10.0
    """CPU ranks that outnumber the cores: extra seconds per ideal second of the communication that
    runs while other ranks compute, per core's worth of oversubscription (estimate.timing
    .contended_seconds). A ring's every message waits for a peer the OS has descheduled."""
    """NCCL's bus bandwidth over the link's (NCCL tests reach ~0.7-0.8 of NVLink's)."""
    overlap: float = 0.8
    """Share of overlappable communication (DDP's buckets, FSDP's prefetched all-gathers)
    hidden behind compute, where there is compute to hide it."""
    cpu_step_overhead_s: float = 0.009
    """Per optimizer step: the optimizer's Python, clipping's norm, the loop, the logging."""
    gpu_step_overhead_s: float = 0.01
    cpu_microbatch_overhead_s: float = 0.0005
    """Per micro-batch: data, loss, autograd set-up."""
    gpu_microbatch_overhead_s: float = 0.002
    cpu_layer_overhead_s: float = 0.0005
    """Per block per micro-batch forward + backward: the Python and kernel launches of a block
    (dominant for tiny models on CPU; torch.compile cuts it on GPU)."""
    gpu_layer_overhead_s: float = 0.0003
    cpu_redistribute_s: float = 0.0025
    """Per tensor-parallel collective, besides the call: DTensor's redistribute (placement
    planning, the functional collective, its wait, the async tensor's unwrapping)."""
    gpu_redistribute_s: float = 0.00005
    cpu_unit_overhead_s: float = 0.0025
    """Per FSDP2 unit gather or reduce-scatter: its pre/post hooks and the copies of its
    parameters into and out of the flat communication buffer (Python on CPU)."""
    gpu_unit_overhead_s: float = 0.0001
    cpu_call_s: float = 0.0003
    """Per collective call, besides its bytes and its links' latency: the process group's
    dispatch, the work's wait, the peers' arrival (gloo: a round trip through its background
    thread, ~0.3-0.8 ms measured between two ranks on this kind of host)."""
    gpu_call_s: float = 0.00001
    """NCCL: a kernel launch and the proxy's hand-off, ~10 us (nccl-tests' small-message time)."""
    cpu_runtime_gb: float = 0.45
    """CPU: what a worker process holds besides the model (interpreter, torch, gloo): peak RSS
    counts it. CUDA counts tensors only (max_memory_allocated): 0 there."""
    activation_factor: float = 1.0
    """Multiplies the modelled activations and buffers (the allocator's rounding, temporaries)."""
    observations: int = 0
    """Observations the fit used (0 = defaults)."""
    step_error_before: float | None = None
    """RMS relative step-time error of the observations under the previous calibration."""
    step_error_after: float | None = None
    """... and under this one."""

    def of(self, kind: str, name: str) -> float:
        """The coefficient `name` of device kind 'cpu' or 'gpu' (e.g. of('gpu', 'efficiency'))."""
        return getattr(self, f"{kind}_{name}")

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")


def load_calibration(path: str | Path | None) -> Calibration:
    """The calibration in the JSON file `path` (its source: the path); '' or None = defaults.
    ValueError naming cluster.calibration for a missing, unreadable or foreign file."""
    if not path:
        return Calibration()
    text = read_text(path, field="cluster.calibration", fix="write one with `trainlab calibrate -o "
                     "calibration.json`, or set cluster.calibration='' for the defaults")
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ValueError(f"cluster.calibration={str(path)!r} is not a calibration JSON ({e}); write one "
                         "with `trainlab calibrate -o calibration.json`") from None
    known = {f.name for f in dataclasses.fields(Calibration)}
    unknown = sorted(set(data) - known) if isinstance(data, dict) else ["<not an object>"]
    if unknown:
        raise ValueError(f"cluster.calibration={str(path)!r} has unknown keys {unknown}; it is not a "
                         "calibration written by `trainlab calibrate` (or by another version of it)")
    bad = [k for k, v in data.items() if k != "source" and v is not None
           and not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0)]
    if bad:
        raise ValueError(f"cluster.calibration={str(path)!r}: {', '.join(f'{k}={data[k]!r}' for k in bad)} "
                         "must be finite numbers >= 0; recalibrate with `trainlab calibrate`")
    return dataclasses.replace(Calibration(**data), source=str(path))


@dataclass(frozen=True)
class Observation:
    """One finished trial: what it was, where it ran, and what it measured."""

    run: RunConfig
    trial_layout: TrialLayout
    """Its layout as planned (plan.derive_layout.plan_layout(run))."""
    cluster: ClusterSpec
    step_time_s: float
    """Steady step time (train/step_time_s, its median over the run)."""
    peak_mem_gb: float | None = None
    """The largest rank's peak (sys/peak_mem_gb); None = not measured."""
