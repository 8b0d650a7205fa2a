"""What an estimate says about one trial: per-rank memory and time, and the step they make.

    est = estimate_trial(run, cluster)          # trainlab.estimate
    est.fits, est.step_time_s, est.tokens_per_s, est.mfu, est.bound
    est.ranks[r].memory.total_gb, est.ranks[r].device.memory_gb

Bytes are counted where they can be (parameters, gradients, optimizer and FP8 state: the same
shards the layout gives each rank) and modelled where they cannot (activations, buffers).
Times are modelled: FLOPs over the device's peak times a calibrated efficiency, bytes over a
link's bandwidth, the pipeline's bubble by schedule.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GB = 1e9
"""Memory in GB (1e9 bytes), as sys/peak_mem_gb."""

BOUNDS = ("compute", "memory", "communication", "bubble", "overhead")
"""What limits a step: the largest share of the slowest rank's step time ("memory": its
state does not fit, whatever the time)."""


@dataclass(frozen=True)
class RankMemory:
    """Bytes one rank holds at its peak, by kind."""

    params: int
    """Parameters this rank stores (local shards; masters in their own dtype)."""
    grads: int
    """Gradients of those parameters (local shards), at their peak (after backward)."""
    optim_state: int
    """AdamW moments (by optim.exp_avg_dtype / exp_avg_sq_dtype), steps, scales, Kahan buffers."""
    fp8_state: int = 0
    """FP8 scale state: amax histories and scales (fp8_delayed), per-tensor scales."""
    activations: int = 0
    """Activations saved for backward of the micro-batches in flight (by checkpointing mode,
    sequence parallel, the pipeline schedule's in-flight count)."""
    buffers: int = 0
    """Communication buffers and transient copies at the peak: FSDP2's unsharded block(s)
    (param_dtype), DDP's gradient buckets, the logits and their gradient."""
    runtime: int = 0
    """What the process holds besides the model (CPU: interpreter and libraries, counted by
    peak RSS; CUDA: 0, max_memory_allocated counts tensors only). Calibrated."""

    @property
    def state(self) -> int:
        """Parameters, gradients, optimizer and FP8 state: counted, not modelled."""
        return self.params + self.grads + self.optim_state + self.fp8_state

    @property
    def total(self) -> int:
        return self.state + self.activations + self.buffers + self.runtime

    @property
    def total_gb(self) -> float:
        return self.total / GB


@dataclass(frozen=True)
class RankTime:
    """Seconds of one rank's optimizer step, by kind (the exposed part of each)."""

    compute_s: float
    """Forward, backward and optimizer compute (FLOPs / (peak x efficiency), memory-bound parts)."""
    comm_s: float = 0.0
    """Communication not hidden behind compute."""
    bubble_s: float = 0.0
    """Pipeline idle time by schedule."""
    overhead_s: float = 0.0
    """Per-step and per-kernel overheads (calibrated; dominant for tiny models on CPU)."""
    wait_s: float = 0.0
    """Waiting for slower ranks of a synchronous step (heterogeneous gangs)."""

    @property
    def step_s(self) -> float:
        return self.compute_s + self.comm_s + self.bubble_s + self.overhead_s + self.wait_s


@dataclass(frozen=True)
class DeviceSpec:
    """One rank's device as the estimate sees it."""

    name: str
    """Ray accelerator type (H100, A100, ...) or 'cpu'."""
    memory_gb: float
    """Memory a rank may use (a GPU's HBM; on CPU the host's memory over its ranks)."""
    peak_tflops: float | None
    """Peak of the trial's matmul dtype (the MFU table's; CPU: probed); None = unknown."""
    node: int = 0
    """Index of the node the rank lands on (ranks packed onto nodes in order)."""


@dataclass(frozen=True)
class RankEstimate:
    rank: int
    device: DeviceSpec
    memory: RankMemory
    time: RankTime

    @property
    def headroom_gb(self) -> float:
        """Memory left on the device at the peak (negative: does not fit)."""
        return self.device.memory_gb - self.memory.total_gb


@dataclass(frozen=True)
class Estimate:
    """One trial on one cluster, before it runs."""

    ranks: tuple[RankEstimate, ...]
    tokens_per_step: int
    flops_per_step: float
    """Model FLOPs of one optimizer step over the whole gang (MFU's numerator, flops_per_token)."""
    calibration: str = "default"
    """Where the efficiencies came from: 'default' or a calibration file's path."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    """Assumptions a reader should know (e.g. 'H100 read as H100 SXM')."""

    @property
    def slowest(self) -> RankEstimate:
        # every rank of a synchronous step ends with the slowest (wait_s): the one that waits least is it
        return max(self.ranks, key=lambda r: (r.time.step_s, -r.time.wait_s))

    @property
    def step_time_s(self) -> float:
        """A synchronous step ends when its slowest rank does."""
        return self.slowest.time.step_s

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_time_s

    @property
    def peak_flops(self) -> float | None:
        """Sum of the ranks' peaks (MFU's denominator on a mixed gang); None if any is unknown."""
        peaks = [r.device.peak_tflops for r in self.ranks]
        return None if any(p is None for p in peaks) else sum(peaks) * 1e12

    @property
    def mfu(self) -> float | None:
        peak = self.peak_flops
        return None if peak is None else self.flops_per_step / self.step_time_s / peak

    @property
    def fits(self) -> bool:
        return all(r.headroom_gb >= 0 for r in self.ranks)

    @property
    def tightest(self) -> RankEstimate:
        """The rank with the least headroom."""
        return min(self.ranks, key=lambda r: r.headroom_gb)

    @property
    def peak_mem_gb(self) -> float:
        """The largest rank's peak (as sys/peak_mem_gb_max)."""
        return max(r.memory.total_gb for r in self.ranks)

    @property
    def bound(self) -> str:
        """What limits the trial (BOUNDS)."""
        if not self.fits:
            return "memory"
        t = self.slowest.time
        shares = {"compute": t.compute_s, "communication": t.comm_s, "bubble": t.bubble_s + t.wait_s,
                  "overhead": t.overhead_s}
        return max(shares, key=shares.get)
