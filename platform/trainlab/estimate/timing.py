"""Seconds of one optimizer step on each rank: compute, communication, bubble, overheads.

    terms = step_terms(run, layout=Layout.of(run, cluster, trial_layout))   # per rank, free of calibration
    times = rank_times(terms, calibration=cal)                # per rank RankTime, slowest-rank waits

Two stages, so that `calibration.fit` can solve for the coefficients by least squares: the
terms say what the step costs at 100 % of every peak and bandwidth (FLOPs over the device's
peak, bytes over a link), the calibration how much of each peak is reached.

Compute: the rank's share of the model's matmul FLOPs (its pipeline stages' blocks, its 1/tp of
each, its sequences of the global batch), recomputation by activation_checkpoint (block: one more
forward of every block, selective: of every other block), at the peak of the precision's matmul
dtype (vocab.precision.matmul_dtype; the FP8 linears at the FP8 peak, from the same layer policy
the recipe applies: precision.policy.plan_layers), plus the optimizer's memory-bound update
(its state read and written once over HBM). Emulated casts (fp16 on CPU, FP8 emulated or on CPU,
precision=emulated) run their matmuls in high precision and add a calibrated cost per matmul.

Communication per layout (the bytes each collective moves, estimate.links for its time): DDP's
gradient all-reduce in parallel.comm_dtype on the last micro-batch, overlapped with its backward;
ZeRO-1's parameter broadcast after the step; FSDP2's all-gathers in the mode's param_dtype (one
per micro-batch for zero2, two for fsdp/hsdp) and one reduce-scatter on the last micro-batch,
prefetched behind compute (the first block's gather exposed); HSDP's all-reduce across replicas;
TP's two all-reduces per block forward and two backward (reduce-scatter + all-gather pairs of the
same volume with sequence parallel); PP's activations and gradients between stages per
micro-batch, and the stage replicas' all-reduce after the flush. Bytes cost their time over the
link at comm_efficiency; each call costs call_s more and its links' latency (estimate.calls
counts the calls of every layout), a tensor-parallel one a DTensor redistribute (redistribute_s),
an FSDP2 unit's gather or reduce-scatter its hooks and copies (unit_overhead_s). CPU ranks that
outnumber the cores pay their Python at their share of a core, and the communication that runs
while other ranks compute waits for descheduled peers (contended_comm_cost).

The pipeline bubble by schedule (parallel.pp.bubble_fraction) stretches the micro-batches'
work, not the optimizer step after the flush; on ranks that share cores an idle stage's core
goes to the others, so the bubble costs only what the cores leave (pipeline_factor).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from trainlab.config.layout_types import bubble_fraction
from trainlab.config.schema import RunConfig
from trainlab.estimate.calibration import Calibration
from trainlab.estimate.calls import rank_calls
from trainlab.estimate.links import (
    all_gather_s,
    all_reduce_s,
    broadcast_s,
    p2p_s,
    reduce_scatter_s,
)
from trainlab.estimate.rank_layout import Layout
from trainlab.estimate.result import RankTime
from trainlab.estimate.shape import ModelShape, model_shape
from trainlab.vocab.precision import emulates, spec_of

_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class StepTerms:
    """What one rank's step costs at every peak (calibration.fit's columns)."""

    kind: str
    """'cpu' or 'gpu': which coefficients apply."""
    compute_ideal_s: float
    """High-precision matmul FLOPs over the device's peak for the mode's matmul dtype."""
    fp8_ideal_s: float
    """FP8 linears' FLOPs over the device's FP8 peak."""
    emulated_ideal_s: float
    """Matmul seconds (at the hp peak) of linears whose casts are emulated: their extra cost's unit."""
    memory_s: float
    """The optimizer's update over the device memory's bandwidth (not calibrated)."""
    comm_fixed_ideal_s: float
    """Communication nothing hides (ZeRO-1's broadcast, TP, PP p2p, FSDP's first gather)."""
    comm_overlap_ideal_s: float
    """Communication the layout overlaps with compute (DDP buckets, FSDP prefetch)."""
    overlap_share: float
    """Share of the compute that can hide it (DDP: the last micro-batch's backward; FSDP: all)."""
    micro_batches: int
    layer_passes: int
    """Blocks x micro-batches (forward + backward each): the per-layer overhead's count."""
    bubble_fraction: float
    core_share: float = 1.0
    """CPU ranks on fewer cores than ranks: the share of a core each gets. Its Python and kernel
    launches (the overheads) run that much slower too."""
    half_matmuls: bool = False
    """compute_ideal_s is at a 16-bit peak (bf16/fp16 matmuls): half_efficiency applies, not efficiency."""
    calls: float = 0.0
    """Collective calls per step (estimate.calls): each costs call_s besides its bytes."""
    latency_s: float = 0.0
    """Those calls' link latency (hops x the link's), seconds: not calibrated."""
    redistributes: float = 0.0
    """Tensor parallel's collectives per step (estimate.calls): each a DTensor redistribute."""
    unit_gathers: float = 0.0
    """FSDP2 unit gathers and reduce-scatters per step (estimate.calls): their hooks and copies."""
    comm_contended_ideal_s: float = 0.0
    """The communication that runs while other ranks compute (all but ZeRO-1's broadcast and a
    pipeline's replica all-reduce, after the step): on ranks that outnumber the cores, each
    message waits for a peer the OS has descheduled for another rank's compute."""
    fp16_emulated_ideal_s: float = 0.0
    """Matmul seconds (at the hp peak) of linears whose operands emulation rounds through fp16."""


def step_terms(run: RunConfig, *, layout: Layout, state_bytes: list[int] | None = None) -> list[StepTerms]:
    """Each rank's StepTerms; `state_bytes` (per rank, RankMemory.state) sizes the optimizer update."""
    shape = model_shape(run)
    spec = spec_of(run.precision.name)
    decided = layout.trial_layout
    dims = decided.dims
    p, t = run.parallel, run.train
    pp_m = decided.pp_microbatches if dims.pp > 1 else 1
    virtual = decided.pp_virtual_stages if dims.pp > 1 else 1
    bubble = bubble_fraction(pp=dims.pp, n_microbatches=pp_m, virtual_stages=virtual) if dims.pp > 1 else 0.0
    shares = layout.shares
    out = []
    for r in range(layout.world):
        hw = layout.hardware[r]
        kind = "cpu" if hw.type == "cpu" else "gpu"
        device_type = "cpu" if kind == "cpu" else "cuda"
        emulated = emulates(run.precision, device_type=device_type)
        dtype = spec.peak_dtype(run.precision, device_type=device_type)
        casts = spec.cast_cost(emulated=emulated, device_type=device_type)
        peak = layout.peak_tflops(r, dtype) or layout.peak_tflops(r, "fp32")
        c = layout.coords[r]
        sequences, micro = shares[c.dp_rank] if dims.pp == 1 else (t.global_batch_size // dims.dp, pp_m)
        tokens = sequences * t.seq_len
        blocks = layout.blocks_of(r, shape=shape, virtual=virtual)
        hp, lowp, attention = shape.flops_per_token(blocks=blocks, head=layout.holds_head(r, virtual=virtual),
                                                    seq_len=t.seq_len, checkpoint=p.activation_checkpoint)
        hp, lowp, attention = (x * tokens / dims.tp for x in (hp, lowp, attention))
        fp8_s = emul_s = fp16_s = 0.0
        if casts == "fp16_emulated":  # every autocast matmul rounds its operands (a cast each)
            hp, fp16_s = hp + lowp, (hp + lowp) / (peak * 1e12)
        elif casts == "emulated":
            hp, emul_s = hp + lowp, lowp / (peak * 1e12)
        elif casts == "fp8":
            fp8_s = lowp / ((layout.peak_tflops(r, "fp8") or 2 * peak) * 1e12)
        else:
            hp += lowp
        compute = (hp + attention) / (peak * 1e12)
        memory_s = 2 * (state_bytes[r] if state_bytes else 16 * shape.local_params(blocks, dims.tp)) \
            / (hw.hbm_gb_s * 1e9)
        fixed, overlapped, share, contended = _comm(run, layout=layout, rank=r, shape=shape, blocks=blocks,
                                         sequences=sequences, micro=micro, virtual=virtual)
        calls = rank_calls(run, layout=layout, rank=r, shape=shape, blocks=blocks, micro=micro, virtual=virtual)
        out.append(StepTerms(kind=kind, compute_ideal_s=compute, fp8_ideal_s=fp8_s, emulated_ideal_s=emul_s,
                             memory_s=memory_s, comm_fixed_ideal_s=fixed, comm_overlap_ideal_s=overlapped,
                             overlap_share=share, micro_batches=micro, layer_passes=len(blocks) * micro,
                             bubble_fraction=bubble, core_share=min(1.0, layout.threads[r]),
                             calls=calls.count, latency_s=calls.latency_s,
                             redistributes=calls.redistributes,
                             unit_gathers=calls.unit_gathers, fp16_emulated_ideal_s=fp16_s,
                             comm_contended_ideal_s=contended,
                             half_matmuls=dtype == "bf16" or (dtype == "fp16" and not emulated)))
    return out


def _comm(run: RunConfig, *, layout: Layout, rank: int, shape: ModelShape, blocks: list[int],
          sequences: int, micro: int, virtual: int) -> tuple[float, float, float, float]:
    """(fixed, overlappable, share of compute that hides it, contended) seconds of `rank`'s
    collectives at the links' full bandwidth; contended: those that run while other ranks compute,
    each weighted by its ring's steps (n - 1: every step waits for one more peer)."""
    p, prec = run.parallel, run.precision
    spec = spec_of(prec.name)
    dims = layout.trial_layout.dims
    pure = spec.low_precision_params  # bf16_pure: parameters and gradients are bf16
    grad_b = 2 if pure else _BYTES[p.comm_dtype]
    # FSDP2 gathers in the dtype parallelize() gives it (the spec decides; emulated casts gather
    # full precision), else in the parameters' own: bf16 for bf16_pure, fp32 masters otherwise
    emulated = emulates(prec, device_type="cpu" if layout.hardware[rank].type == "cpu" else "cuda")
    gathered = spec.fsdp_param_dtype(prec.hp_dtype, emulated=emulated)
    gather_b = gathered.itemsize if gathered is not None else (2 if pure else 4)
    act_b = _BYTES.get(spec.matmul_dtype(prec.hp_dtype), 4)
    n_local = shape.local_params(blocks, dims.tp)
    fixed = overlapped = contended = 0.0
    share = 0.0
    link_of = _bandwidth_link(layout)

    def add(seconds: float, *, n: int, overlappable: bool, during_compute: bool = True) -> None:
        nonlocal fixed, overlapped, contended
        if overlappable:
            overlapped += seconds
        else:
            fixed += seconds
        if during_compute:  # each of a ring's n - 1 steps waits for one more peer
            contended += seconds * (n - 1)

    dp_group = layout.dp_group(rank)
    dp = len(dp_group)
    dp_link = link_of(dp_group)
    dpk = p.data_parallel
    if dp > 1 and dims.pp > 1:  # the stage replicas' flat all-reduce, after the pipeline's flush
        add(all_reduce_s(n_local * grad_b, n=dp, link=dp_link), n=dp, overlappable=False, during_compute=False)
    elif dp > 1 and dpk in ("ddp", "zero1"):
        add(all_reduce_s(n_local * grad_b, n=dp, link=dp_link), n=dp, overlappable=True)
        share = 2 / 3 / micro  # the last micro-batch's backward: DDP reduces buckets as they fill
        if dpk == "zero1":  # each rank broadcasts its updated shard: every parameter once, after the step
            add(broadcast_s(n_local * (2 if pure else 4), n=dp, link=dp_link), n=dp, overlappable=False,
                during_compute=False)
    elif dpk in ("zero2", "fsdp", "hsdp") and dp > 1:
        shard = layout.shard_group(rank) if dpk == "hsdp" else dp_group
        n, link = len(shard), link_of(shard)
        gathers = 1 if dpk == "zero2" else 2
        add(micro * gathers * all_gather_s(n_local * gather_b, n=n, link=link), n=n, overlappable=True)
        add(reduce_scatter_s(n_local * grad_b, n=n, link=link), n=n, overlappable=True)
        add(all_gather_s(n_local / max(1, len(blocks)) * gather_b, n=n, link=link), n=n, overlappable=False)
        if dpk == "hsdp":
            replicas = layout.replica_group(rank)
            add(all_reduce_s(n_local / n * grad_b, n=len(replicas), link=link_of(replicas)), n=len(replicas),
                overlappable=True)
        share = 1.0  # FSDP2 prefetches the next block's gather while this one computes
    activation = sequences / micro * run.train.seq_len * shape.dim * act_b  # one micro-batch's stream
    if dims.tp > 1:
        tp_group = layout.tp_group(rank)
        passes = 4 + {"none": 0, "block": 2, "selective": 1}[p.activation_checkpoint]
        add(micro * len(blocks) * passes * all_reduce_s(activation, n=dims.tp, link=link_of(tp_group)),
            n=dims.tp, overlappable=False)
    if dims.pp > 1:
        pp_group = layout.pp_group(rank)
        add(micro * virtual * 2 * p2p_s(activation / dims.tp if p.sequence_parallel else activation,
                                        link=link_of(pp_group)), n=2, overlappable=False)
    return fixed, overlapped, share, contended


def _bandwidth_link(layout: Layout):
    """A group's link without its latency: estimate.calls counts that per call."""
    return lambda ranks: dataclasses.replace(layout.link(ranks), latency_s=0.0)


def rank_times(terms: list[StepTerms], *, calibration: Calibration) -> list[RankTime]:
    """Each rank's RankTime; a rank faster than the slowest waits for it (wait_s)."""
    times = [_rank_time(t, calibration) for t in terms]
    slowest = max(t.step_s for t in times)
    return [RankTime(compute_s=t.compute_s, comm_s=t.comm_s, bubble_s=t.bubble_s, overhead_s=t.overhead_s,
                     wait_s=max(0.0, slowest - t.step_s)) for t in times]


def _rank_time(t: StepTerms, cal: Calibration) -> RankTime:
    k = t.kind
    slow = 1 / t.core_share  # a rank on a share of a core runs its Python that much slower
    compute = (t.compute_ideal_s / cal.of(k, "half_efficiency" if t.half_matmuls else "efficiency") + t.memory_s
               + (t.fp8_ideal_s / cal.gpu_fp8_efficiency if t.fp8_ideal_s else 0.0)
               + t.emulated_ideal_s * cal.of(k, "emulation_cost")
               + t.fp16_emulated_ideal_s * cal.of(k, "fp16_emulation_cost"))
    comm = exposed_comm(t, cal, compute_s=compute) + call_seconds(t, cal) + contended_seconds(t, cal)
    step_overhead = cal.of(k, "step_overhead_s") * slow
    overhead = step_overhead + (t.micro_batches * cal.of(k, "microbatch_overhead_s")
                                + t.layer_passes * cal.of(k, "layer_overhead_s")
                                + t.redistributes * cal.of(k, "redistribute_s")
                                + t.unit_gathers * cal.of(k, "unit_overhead_s")) * slow
    # the pipeline idles around its micro-batches' work; the optimizer step after the flush
    # (its update, the step's fixed overhead) runs once, outside the bubble
    piped = compute - t.memory_s + comm + overhead - step_overhead
    bubble = piped * (pipeline_factor(t) - 1)
    return RankTime(compute_s=compute, comm_s=comm, bubble_s=bubble, overhead_s=overhead)


def pipeline_factor(t: StepTerms) -> float:
    """The pipelined work's wall time over its busy time. A stage idles for the bubble: busy /
    (1 - bubble). On ranks that outnumber their cores a stage's bubble hands its core to the
    other ranks, which then compute faster than their share: the work takes the larger of the
    bubble's bound (at a full core) and the cores' (at the share, what the busy time assumes)."""
    return max(1.0, t.core_share / (1 - t.bubble_fraction))


def call_seconds(t: StepTerms, cal: Calibration) -> float:
    """The collective calls' own cost: call_s each, plus their links' latency. A rank on a share
    of a core pays both that many times over: each call waits for peers the OS has descheduled."""
    return (t.calls * cal.of(t.kind, "call_s") + t.latency_s) / t.core_share


def contended_seconds(t: StepTerms, cal: Calibration) -> float:
    """Ranks that outnumber their cores (CPU): the communication that runs while other ranks
    compute costs contended_comm_cost per ideal second more for each core's worth of oversubscription
    (1/core_share - 1: 1 at 4 ranks on 2 cores), and nothing hides it."""
    if t.kind != "cpu" or t.core_share >= 1:
        return 0.0
    return t.comm_contended_ideal_s * (1 / t.core_share - 1) * cal.cpu_contended_comm_cost


def exposed_comm(t: StepTerms, cal: Calibration, *, compute_s: float) -> float:
    """Communication seconds (bytes over bandwidth) not hidden behind compute."""
    eff = cal.of(t.kind, "comm_efficiency")
    hidden = cal.overlap * t.overlap_share * compute_s
    return t.comm_fixed_ideal_s / eff + max(0.0, t.comm_overlap_ideal_s / eff - hidden)
