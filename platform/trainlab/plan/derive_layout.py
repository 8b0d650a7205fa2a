"""A trial's layout, derived once: parallel degrees, accumulation, pipeline micro-batches and
stages, what it compiles, and every check that needs them (ValueError naming the fields and the
fix; plan_layout raises ConfigError with the same message).

    layout = plan_layout(run)          # TrialLayout(dims, grad_accum_steps, pp_microbatches, ...)

The only place parallel_dims runs: the driver (launch.paths.run_config_from_hydra, then
plan_trial), torchrun's plan_here, the estimate command and the benches plan through it; the
estimate and the engine read the TrialLayout they are handed.
"""

from __future__ import annotations

import math

from trainlab.config.convert import ConfigError
from trainlab.config.hf_model import change_model_field
from trainlab.config.layout_types import ParallelDims, TrialLayout
from trainlab.config.schema import RunConfig
from trainlab.config.validate import check_pp_layout
from trainlab.vocab.precision import spec_of


def plan_layout(run: RunConfig) -> TrialLayout:
    """`run`'s layout on its full gang, checked: ConfigError (field, value, fix) for a layout that
    cannot run, in the order validation always checked them."""
    try:
        dims = parallel_dims(run)
        check_elastic(run)  # before the batch check for the full gang: it names every count that fails
        accum = grad_accum_steps(run)
        check_parallel(run)
        check_balance(run)
        return TrialLayout(dims=dims, grad_accum_steps=accum,
                           pp_microbatches=pp_microbatches(run) if dims.pp > 1 else 1,
                           pp_virtual_stages=pp_virtual_stages(run), elastic=elastic_range(run))
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(str(e)) from None


def parallel_dims(run: RunConfig) -> ParallelDims:
    """Resolve dp=0 and check dp * tp * pp == cluster.num_workers."""
    world = run.cluster.num_workers
    p = run.parallel
    inner = p.tp * p.pp
    if p.dp == 0:
        if world % inner:
            raise ValueError(
                f"cluster.num_workers={world} is not divisible by parallel.tp * parallel.pp "
                f"= {inner}; set cluster.num_workers to a multiple of {inner}"
            )
        return ParallelDims(dp=world // inner, tp=p.tp, pp=p.pp)
    dims = ParallelDims(dp=p.dp, tp=p.tp, pp=p.pp)
    if dims.world_size != world:
        raise ValueError(
            f"parallel.dp * parallel.tp * parallel.pp = {p.dp} * {p.tp} * {p.pp} = "
            f"{dims.world_size} does not equal the world size cluster.num_workers={world}; "
            f"set cluster.num_workers={dims.world_size} or parallel.dp=0 to derive it"
        )
    return dims


def grad_accum_steps(run: RunConfig) -> int:
    """Micro-batches per rank per optimizer step."""
    dims = parallel_dims(run)
    t = run.train
    per_step = t.micro_batch_size * dims.dp
    if t.global_batch_size % per_step:
        raise ValueError(
            f"train.global_batch_size={t.global_batch_size} is not divisible by "
            f"train.micro_batch_size * dp = {t.micro_batch_size} * {dims.dp} = {per_step}; "
            f"use a multiple of {per_step}, e.g. train.global_batch_size="
            f"{max(per_step, t.global_batch_size // per_step * per_step)}"
        )
    return t.global_batch_size // per_step


def pp_microbatches(run: RunConfig) -> int:
    """Pipeline micro-batches per step: parallel.pp_microbatches, or the micro-batches that
    gradient accumulation would run (global batch / (dp x micro batch)), pipelined."""
    p, t = run.parallel, run.train
    dims = parallel_dims(run)
    per_rank = t.global_batch_size // dims.dp
    m = p.pp_microbatches or max(1, per_rank // t.micro_batch_size)
    if per_rank % m:
        raise ValueError(
            f"train.global_batch_size / dp = {t.global_batch_size} / {dims.dp} = {per_rank} "
            f"sequences per pipeline does not split into parallel.pp_microbatches={m}; use a "
            f"divisor of {per_rank}"
        )
    val = max(1, t.eval_batches // dims.dp) * t.micro_batch_size
    if val % m:
        raise ValueError(
            f"the held-out set per pipeline, max(1, train.eval_batches // dp) x "
            f"train.micro_batch_size = {val} sequences, does not split into "
            f"parallel.pp_microbatches={m}; raise train.eval_batches to a multiple of {m}"
        )
    if p.pp_schedule != "gpipe" and m < p.pp:
        raise ValueError(
            f"parallel.pp_schedule={p.pp_schedule} needs at least parallel.pp={p.pp} micro-batches, "
            f"got {m}; raise parallel.pp_microbatches (the bubble shrinks as they grow) or use gpipe"
        )
    return m


def pp_virtual_stages(run: RunConfig) -> int:
    """Stages per pipeline rank: parallel.pp_virtual_stages with interleaved 1F1B, else 1."""
    return run.parallel.pp_virtual_stages if run.parallel.pp_schedule == "interleaved_1f1b" else 1


def check_parallel(run: RunConfig) -> None:
    """Layouts that cannot work, refused before launch with the fields and the fix."""
    p, m = run.parallel, run.model
    dims = parallel_dims(run)
    if p.data_parallel == "hsdp" and dims.dp % p.dp_replicate:
        raise ValueError(
            f"parallel.dp={dims.dp} is not divisible by parallel.dp_replicate={p.dp_replicate}; "
            "HSDP shards within dp / dp_replicate ranks: pick a dp_replicate that divides dp"
        )
    if m._target_ and p.pp > 1:
        raise ValueError(
            f"parallel.pp={p.pp} with model._target_={m._target_!r}: trainlab has no pipeline split for your own "
            "module; use data parallelism (parallel=ddp, zero1, zero2, fsdp or hsdp), or parallel.tp with model.tp_plan")
    if m._target_ and p.tp > 1 and not m.tp_plan:
        raise ValueError(
            f"parallel.tp={p.tp} with model._target_={m._target_!r}: trainlab has no tensor-parallel plan for your "
            "own module's names; give one in model.tp_plan (e.g. model.tp_plan={layers.*.fc:colwise,"
            "layers.*.proj:rowwise}) or use data parallelism (parallel=ddp, zero1, zero2, fsdp or hsdp)")
    other_family = m.runs_transformers_forward()
    if other_family and p.pp > 1:
        kind = m.hf_model_type()
        raise ValueError(
            f"parallel.pp={p.pp} with a {kind} model: trainlab cuts only the Llama family (llama, mistral, qwen2, "
            f"qwen3) into pipeline stages; a {kind} model runs transformers' own forward in one piece: use "
            "parallel.pp=1 with parallel.data_parallel=fsdp (it shards per decoder layer)")
    if other_family and p.tp > 1 and not m.tp_plan:
        raise ValueError(
            f"parallel.tp={p.tp} with a {m.hf_model_type()} model: trainlab's built-in tensor-parallel plan knows "
            "the Llama family's names only; give this model's plan in model.tp_plan (its config's "
            "base_model_tp_plan names the linears; a fused q/k/v is colwise only where its heads are interleaved) "
            "or use parallel.tp=1 with parallel.data_parallel=fsdp")
    if m.tp_plan and p.tp > 1:
        check_plan_layout(run)
    if p.pp > 1:
        if p.data_parallel != "ddp":
            raise ValueError(
                f"parallel.pp={p.pp} with parallel.data_parallel={p.data_parallel} is not supported; "
                "pipeline stages are replicated with ddp (set parallel.data_parallel=ddp)"
            )
        if p.tp > 1:
            raise ValueError(f"parallel.tp={p.tp} with parallel.pp={p.pp} (3-D) is not supported; "
                             "combine tp with dp, or pp with dp")
        if run.precision.name == "fp16" and run.precision.loss_scale == "dynamic":
            raise ValueError(
                f"precision=fp16 with dynamic loss scaling and parallel.pp={p.pp} is not supported "
                "(the scale would have to reach every stage's loss); use bf16 with pipelines")
        if m.tie_embeddings:
            raise ValueError(
                f"parallel.pp={p.pp} with a Hugging Face model whose head is tied to its embedding "
                "(tie_word_embeddings=true) is not supported: the first and last stages would each train "
                "their own copy; use parallel.pp=1 with parallel.data_parallel=fsdp")
        check_pp_layout(n_layers=m.n_layers, pp=p.pp, virtual_stages=pp_virtual_stages(run),
                        n_microbatches=pp_microbatches(run), schedule=p.pp_schedule, hf=m.name == "hf")
    wraps = _wrapping_layouts(run)
    if run.train.compile == "true" and run.train.compile_unit == "model" and wraps:
        raise ValueError(
            f"train.compile_unit=model compiles one graph of the whole model, which {' and '.join(wraps)} "
            "then shards or splits; set train.compile_unit=block (each block compiled, as torchtitan does)")
    if run.train.deterministic and p.powersgd_rank:
        raise ValueError(
            f"train.deterministic=true with parallel.powersgd_rank={p.powersgd_rank}: both are DDP "
            "communication hooks and DDP takes one; set parallel.powersgd_rank=0 (PowerSGD's "
            "all-reduces of its factors would not be in a fixed order anyway)")
    check_dp_communication(run)
    if p.tp > 1:
        if p.data_parallel not in ("ddp", "fsdp"):
            raise ValueError(
                f"parallel.tp={p.tp} combines with parallel.data_parallel=ddp or fsdp, not "
                f"{p.data_parallel}"
            )
        if not spec_of(run.precision.name).tensor_parallel:
            raise ValueError(
                f"precision={run.precision.name} with parallel.tp={p.tp} is not supported (FP8 "
                "linears need their own tensor-parallel plan); use tp=1 or a bf16/fp16 precision"
            )


def check_plan_layout(run: RunConfig) -> None:
    """What model.tp_plan needs of the config (the module paths are checked on the model itself,
    launch.preflight.check_layout): whole heads per rank, and replicated activations."""
    p, m = run.parallel, run.model
    if p.sequence_parallel:
        from trainlab.parallel.tp import SEQUENCE_PARALLEL_WITH_PLAN

        raise ValueError(SEQUENCE_PARALLEL_WITH_PLAN)
    if m.n_heads % p.tp:
        divisors = [d for d in range(1, m.n_heads + 1) if m.n_heads % d == 0]
        raise ValueError(
            f"model.n_heads={m.n_heads} is not divisible by parallel.tp={p.tp}: with model.tp_plan every rank "
            f"holds whole heads; set parallel.tp to a divisor of {m.n_heads} ({divisors}) or "
            f"{change_model_field('n_heads', hf=m.name == 'hf')}")


def _non_ddp_reducer(run: RunConfig) -> str | None:
    """How the layout averages gradients over dp when it is not DDP (None: DDP, or dp = 1)."""
    p, dims = run.parallel, parallel_dims(run)
    if dims.dp == 1:
        return None
    if p.pp > 1:
        return f"pipeline stages (parallel.pp={p.pp}) average their gradients with one fp32 all-reduce"
    if p.data_parallel in ("fsdp", "zero2", "hsdp"):
        return f"parallel.data_parallel={p.data_parallel} reduces gradients with FSDP2"
    if p.tp > 1:
        return (f"with parallel.tp={p.tp} the dp replicas are FSDP2's replicate (DDP cannot hold "
                "tensor-parallel DTensor parameters)")
    return None


def check_dp_communication(run: RunConfig) -> None:
    """What the layout's data-parallel gradient reduction can send. DDP (ddp, zero1 without tp
    or pp) takes communication hooks; FSDP2 (fsdp, zero2, hsdp) and replicate (ddp with tp,
    parallel.replicate) reduce in parallel.comm_dtype and take no hook; pipeline stages are
    averaged by one flat fp32 all-reduce (parallel.ddp.allreduce_grads)."""
    p = run.parallel
    reducer = _non_ddp_reducer(run)
    if reducer is None:
        return
    if p.powersgd_rank:
        raise ValueError(
            f"parallel.powersgd_rank={p.powersgd_rank} is a DDP communication hook, and {reducer}, "
            "which takes none; set parallel.powersgd_rank=0 (parallel.comm_dtype=fp16 or bf16 halves "
            "the bytes instead where the layout reduces in it) or use parallel=ddp without tp or pp")
    if run.precision.name == "emulated" and run.precision.formats.comm_grads:
        raise ValueError(
            f"precision.formats.comm_grads={run.precision.formats.comm_grads!r} is a DDP communication "
            f"hook, and {reducer}, which takes none; set precision.formats.comm_grads='' or use "
            "parallel=ddp or parallel=zero1 (without tp or pp)")
    if p.pp > 1 and p.comm_dtype != "fp32":
        raise ValueError(f"parallel.comm_dtype={p.comm_dtype} with parallel.pp={p.pp}: {reducer}; "
                         "set parallel.comm_dtype=fp32")


def _wrapping_layouts(run: RunConfig) -> list[str]:
    """The parallel settings that shard or split the model (a whole-model graph cannot follow)."""
    p, dims = run.parallel, parallel_dims(run)
    return [f"parallel.{k}={v}" for k, v, on in (
        ("tp", p.tp, p.tp > 1), ("pp", p.pp, p.pp > 1),
        ("data_parallel", p.data_parallel, p.data_parallel in ("fsdp", "zero2", "hsdp") and dims.dp > 1))
        if on]


def compile_unit(run: RunConfig, *, device_type: str, emulated: bool) -> str:
    """What the trial compiles: '' (nothing), 'model' or 'block' (train.compile and
    train.compile_unit, with auto resolved). Decided once, by the plan (TrialPlan.compile_unit);
    the engine records it in the `compile` tag. auto compiles on CUDA unless the recipe emulates its casts (emulation
    studies numerics; torchao's emulated FP8 does not compile), per block where the layout
    shards or splits the model; on CPU it stays eager (inductor's start-up costs more than a
    CPU run gains)."""
    t = run.train
    if t.compile == "false" or (t.compile == "auto" and (device_type != "cuda" or emulated)):
        return ""
    if t.compile == "auto" and _wrapping_layouts(run):
        return "block"
    return t.compile_unit


def check_balance(run: RunConfig) -> None:
    """parallel.dp_balance other than equal: pure data parallel, one weight per dp rank, and
    (accumulate) a layout whose ranks may run different numbers of micro-batches."""
    p = run.parallel
    if p.dp_balance == "equal":
        return
    if p.tp > 1 or p.pp > 1:
        raise ValueError(
            f"parallel.dp_balance={p.dp_balance} with parallel.tp={p.tp} and parallel.pp={p.pp} is not "
            "supported: uneven shares need pure data parallelism (tensor and pipeline peers must "
            "read the same batch); set parallel.tp=1 parallel.pp=1 or parallel.dp_balance=equal")
    dims = parallel_dims(run)
    if p.dp_weights and len(p.dp_weights) != dims.dp:
        raise ValueError(
            f"parallel.dp_weights={list(p.dp_weights)} has {len(p.dp_weights)} weights for dp={dims.dp} "
            f"data-parallel ranks; give one per rank (e.g. [{', '.join(['1'] * dims.dp)}]) or [] to measure")
    if p.dp_balance == "accumulate" and p.data_parallel not in ("ddp", "zero1"):
        raise ValueError(
            f"parallel.dp_balance=accumulate with parallel.data_parallel={p.data_parallel} is not "
            "supported: FSDP2 gathers and reduces on every micro-batch, so every rank must run as many "
            "micro-batches; use parallel.dp_balance=weighted (same count, uneven sizes) or ddp/zero1")


def elastic_range(run: RunConfig) -> tuple[int, int] | None:
    """(fewest, most) workers of an elastic trial (cluster.min_workers below num_workers);
    None for a fixed gang."""
    c = run.cluster
    return (c.min_workers, c.num_workers) if 1 <= c.min_workers < c.num_workers else None


def check_elastic(run: RunConfig) -> None:
    """An elastic trial must be able to run, and keep its global batch, on every worker count
    it may be given: a layout with nothing sharded or split, dp derived from the gang, equal
    shares, and a global batch that every count x micro batch divides."""
    span = elastic_range(run)
    if span is None:
        return
    lo, hi = span
    p, c, t = run.parallel, run.cluster, run.train
    elastic = f"cluster.min_workers={lo} (elastic between {lo} and cluster.num_workers={hi})"
    if p.data_parallel != "ddp" or p.tp > 1 or p.pp > 1:
        raise ValueError(
            f"{elastic} needs pure data parallel, got parallel.data_parallel={p.data_parallel} "
            f"parallel.tp={p.tp} parallel.pp={p.pp}: sharded and split layouts cannot change size; "
            "use parallel=ddp, or cluster.min_workers=0 for a fixed gang")
    if p.dp:
        raise ValueError(
            f"{elastic} resizes the data-parallel degree with the gang, but parallel.dp={p.dp} fixes it; "
            "set parallel.dp=0 (derived), or cluster.min_workers=0 for a fixed gang")
    if p.dp_balance != "equal":
        raise ValueError(
            f"parallel.dp_balance={p.dp_balance} with {elastic} is not supported: its shares are per rank "
            "of a fixed gang; set parallel.dp_balance=equal, or cluster.min_workers=0")
    if c.max_failures < 1:
        raise ValueError(
            f"{elastic} with cluster.max_failures={c.max_failures}: a lost node is a worker failure, and "
            "with none allowed the trial ends instead of going on with fewer workers; set "
            "cluster.max_failures=1 or more (each loss uses one, growing back does not)")
    bad = [w for w in range(lo, hi + 1) if t.global_batch_size % (t.micro_batch_size * w)]
    if bad:
        step = math.lcm(*(t.micro_batch_size * w for w in range(lo, hi + 1)))
        fits = -(-t.global_batch_size // step) * step  # the nearest multiple at or above it
        counts = " and ".join(f"{w} worker{'s' * (w > 1)} ({t.micro_batch_size} x {w} = "
                              f"{t.micro_batch_size * w})" for w in bad)
        raise ValueError(
            f"train.global_batch_size={t.global_batch_size} is not a multiple of train.micro_batch_size x "
            f"workers for {counts}, which {elastic} allows (an elastic gang keeps the global batch on any "
            f"count by gradient accumulation); use a multiple of {step} (the lcm over the counts), e.g. "
            f"train.global_batch_size={fits}, or narrow the range")


def unordered_reductions(run: RunConfig) -> list[str]:
    """With train.deterministic: the collectives whose summation order stays the backend's.

    Only DDP's gradient buckets get the fixed rank-order sum (parallel.ordered_reduce); FSDP's
    reduce-scatter, tensor parallel's activation all-reduces and the pipeline's stage exchange
    are left to the backend (the kernels are still deterministic)."""
    if not run.train.deterministic:
        return []
    p, dims = run.parallel, parallel_dims(run)
    left = [f"parallel.{k}={v}" for k, v, on in (
        ("data_parallel", p.data_parallel, p.data_parallel in ("fsdp", "zero2", "hsdp") and dims.dp > 1),
        # dp over tp replicates with FSDP2's replicate, not DDP (parallel.replicate)
        ("dp", dims.dp, p.data_parallel == "ddp" and p.tp > 1 and dims.dp > 1),
        ("tp", p.tp, p.tp > 1), ("pp", p.pp, p.pp > 1)) if on]
    if not left:
        return []
    return [f"train.deterministic=true fixes the reduction order of DDP gradients only; the "
            f"collectives of {' and '.join(left)} keep the backend's order (kernels are still "
            "deterministic), so runs on other device sets may differ in the last bits"]
