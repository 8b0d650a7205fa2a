"""One vocabulary for results: every metric, tag and artifact name, defined once.

compare, the MLflow UI, the tests and the trackers all read these constants, so a name
changes here or nowhere. Metrics are stepped by optimizer step; each also has a twin
under ``by_tokens/`` stepped by tokens seen, so runs of different batch sizes line up.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

# -- metrics (MLflow metric keys) ------------------------------------------------------
LOSS = "train/loss"
LR = "train/lr"
GRAD_NORM = "train/grad_norm"
TOKENS_PER_S = "train/tokens_per_s"
STEP_TIME_S = "train/step_time_s"
MFU = "train/mfu"
MODEL_TFLOPS = "train/model_tflops"
LOSS_SCALE = "train/loss_scale"
SKIPPED_STEPS = "train/skipped_steps"
NONFINITE_STEPS = "train/nonfinite_steps"
LOSS_SPIKES = "train/loss_spikes"
TOKENS_SEEN = "train/tokens_seen"
VAL_LOSS = "val/loss"
PEAK_MEM_GB = "sys/peak_mem_gb"
"""Peak memory of rank 0 since the end of the attempt's first step (the steady state; what is
measured: TAG_MEMORY_SOURCE). Logged from the second step on."""
PEAK_MEM_WARMUP_GB = "sys/peak_mem_warmup_gb"
"""The attempt's first step alone (after the build): lazily made optimizer state, compile and
allocator warm-up. Kept apart so that sys/peak_mem_gb compares layouts in their steady state."""
MEM_ALLOCATED_GB = "sys/mem_allocated_gb"
"""CUDA only: rank 0's memory held by live tensors at the log step (torch.cuda.memory_allocated)."""
MEM_RESERVED_GB = "sys/mem_reserved_gb"
"""CUDA only: rank 0's memory the caching allocator holds at the log step (memory_reserved)."""
# checkpoints and faults (engine.checkpoint): logged at each save / (re)start
CKPT_SAVE_S = "ckpt/save_s"
"""Wall time of one checkpoint save, every rank finished (a collective)."""
CKPT_SIZE_MB = "ckpt/size_mb"
"""Bytes of one checkpoint on disk (every rank's shards and state), in MiB."""
CKPT_CHECKSUM_S = "ckpt/checksum_s"
"""The part of ckpt/save_s spent hashing the checkpoint's files (each rank its share)."""
RESTARTS = "fault/restarts"
"""Times the trial started again from a checkpoint (worker loss, preemption, a rerun)."""
WORKERS = "fault/workers"
"""Workers the trial runs on since its last (re)start."""
ROLLBACKS = "fault/rollbacks"
"""Divergence rollbacks so far (train.on_divergence=rollback), logged at the step each retry
went back to."""
GRAD_ACCUM = "fault/grad_accum"
"""Elastic trials (cluster.min_workers): micro-batches each worker runs per optimizer step since
the last (re)start, what keeps the global batch on fewer workers."""
PER_START = (RESTARTS, WORKERS, GRAD_ACCUM, ROLLBACKS)
"""Logged once by every (re)start at the step it starts from: a point at a step the run already
has is another start (one that found no newer checkpoint), never a replay, so a resumed tracker
keeps it."""
# reference lines: constant over a run, logged once at step 0
REF_UNIGRAM_ENTROPY = "ref/unigram_entropy"
REF_TRUE_ENTROPY = "ref/true_entropy"
# stability telemetry beyond the counters (sampled every train.numerics_every steps)
GRAD_NORM_P50 = "train/grad_norm_p50"
GRAD_NORM_P90 = "train/grad_norm_p90"
GRAD_NORM_P99 = "train/grad_norm_p99"
"""Percentiles of the pre-clip gradient norm over the steps since the last sample."""
UPDATE_TO_WEIGHT = "train/update_to_weight"
"""||delta w|| / ||w|| over all parameters for one optimizer step."""
UPDATE_TO_WEIGHT_MAX = "train/update_to_weight_max"
"""The largest per-parameter-tensor update-to-weight ratio of that step."""
MFU_FP8 = "train/mfu_fp8_peak"
"""MFU against the device's FP8 peak (fp8 modes, where the peak is known); train/mfu is
always against the peak of the mode's high-precision compute (bf16 for fp8 modes)."""

# numerics: every low-precision cast, per layer and aggregated (prefix num/)
NUM_PREFIX = "num/"
CAST_AMAX = "amax"
CAST_SCALE = "scale"
CAST_UNDERFLOW = "underflow"
"""Fraction of the non-zero values that the cast turns into zero."""
CAST_OVERFLOW = "overflow"
"""Fraction of the finite values beyond the format's largest value (saturated or inf)."""
CAST_STATS = (CAST_AMAX, CAST_SCALE, CAST_UNDERFLOW, CAST_OVERFLOW)
CAST_TENSORS = ("input", "weight", "grad_output")
"""The tensors a linear layer casts: its input activation, its weight, the incoming gradient."""


def cast_metric(layer: str, tensor: str, stat: str) -> str:
    """e.g. num/layers.0.attention.wq/input/underflow"""
    return f"{NUM_PREFIX}{layer}/{tensor}/{stat}"


def cast_max_metric(tensor: str, stat: str) -> str:
    """The largest value of `stat` over all layers for one tensor kind, e.g.
    num/max/grad_output/underflow: the one curve to watch per kind."""
    return f"{NUM_PREFIX}max/{tensor}/{stat}"


NUM_GRAD_UNDERFLOW = "num/grad_underflow"
"""fp16: of the non-zero gradients arriving at the linear layers (all layers pooled), the
fraction that fp16 flushes to zero at the loss scale used."""
NUM_GRAD_UNDERFLOW_UNSCALED = "num/grad_underflow_unscaled"
"""fp16: the same fraction had the gradients not been scaled (loss scale 1)."""
NUM_SWIGLU_AMAX = "num/swiglu/amax_max"
"""Largest |SwiGLU output| (the input of the down projection) over all blocks."""
NUM_SWIGLU_OUTLIER = "num/swiglu/outlier_ratio_max"
"""Largest amax / rms of the SwiGLU output over all blocks: outliers show as a jump."""
NUM_SWIGLU_ALIGNMENT = "num/swiglu/w13_alignment_max"
"""Largest |cosine| between a channel's gate (w1) and up (w3) weight rows over all blocks:
the weight alignment that drives SwiGLU outliers late in FP8 training."""


def swiglu_metric(layer: int, stat: str) -> str:
    """Per block: num/swiglu/layers.3/amax, .../outlier_ratio, .../w13_alignment."""
    return f"{NUM_PREFIX}swiglu/layers.{layer}/{stat}"


def cast_min_metric(tensor: str, stat: str) -> str:
    """The smallest value of `stat` over all layers, e.g. num/min/input/scale: the scale of the
    layer whose amax is largest (scaled FP8 recipes only; unscaled casts have scale 1)."""
    return f"{NUM_PREFIX}min/{tensor}/{stat}"


DETAIL_LAYER = "layer"
DETAIL_RANK = "rank"


def detail_of(key: str) -> tuple[str, str, str] | None:
    """(kind, name, stat) of a per-layer or per-rank metric, None for any other: the inverse of
    cast_metric ('layer', 'layers.0.attention.wq', 'input/underflow'), swiglu_metric ('layer',
    'layers.3', 'swiglu/amax') and rank_metric ('rank', '1', 'busy_fraction'). These are what
    tracking.detail=summary keeps out of the run's metrics (in ARTIFACT_DETAIL instead)."""
    if key.startswith(RANK_PREFIX):
        rank, _, stat = key[len(RANK_PREFIX):].partition("/")
        return (DETAIL_RANK, rank, stat) if rank.isdigit() and stat else None
    if not key.startswith(NUM_PREFIX):
        return None
    parts = key[len(NUM_PREFIX):].split("/")
    if len(parts) == 3 and parts[0] == "swiglu" and parts[1].startswith("layers."):
        return DETAIL_LAYER, parts[1], f"swiglu/{parts[2]}"
    if len(parts) == 3 and parts[0] not in ("max", "min", "swiglu") and parts[1] in CAST_TENSORS:
        return DETAIL_LAYER, parts[0], f"{parts[1]}/{parts[2]}"
    return None


BY_TOKENS_PREFIX = "by_tokens/"


def by_tokens(metric: str) -> str:
    """The twin of `metric` whose MLflow step is the number of tokens seen."""
    return BY_TOKENS_PREFIX + metric


# -- tags --------------------------------------------------------------------------------
TAG_PRECISION = "precision"
TAG_PRECISION_EMULATED = "precision_emulated"
TAG_PARALLEL = "parallel"
TAG_MODEL = "model"
TAG_DEVICE_NAME = "device_name"
TAG_DEVICE_COUNT = "device_count"
TAG_DEVICE_TYPES = "device_types"
"""What the workers actually ran on, as type:count, e.g. 'H100:2,V100:2' (Ray's accelerator type
under Ray, the device name under torchrun); compare groups and normalises by it."""
TAG_NODE_COUNT = "node_count"
"""How many nodes the trial's workers spanned."""
TAG_WORLD_SIZE = "world_size"
TAG_DIST_BACKEND = "dist_backend"
"""The torch.distributed backend of the trial's process group (nccl, gloo), or none: one
process without a group."""
TAG_SEED = "seed"
TAG_CONFIG_HASH = "config_hash"
TAG_CORPUS = "corpus"
TAG_CORPUS_FINGERPRINT = "corpus_fingerprint"
TAG_SWEEP = "sweep"
TAG_STATUS = "status"
TAG_DIVERGED_STEP = "diverged_step"
TAG_FIRST_NONFINITE = "first_nonfinite"
TAG_ERROR = "error"
TAG_PRUNED_REASON = "pruned_reason"
"""Status pruned: why the sweep's pruner stopped the trial (hydra.launcher.prune), e.g. 'val loss
4.91 at 65.5k tokens is 12.3% above the best trial's 4.37 (#2 lr=0.003; margin 10%)'."""
TAG_PRUNED_STEP = "pruned_step"
"""Status pruned: the last step the trial trained (its ranks agreed to stop after it)."""
TAG_MFU_PEAK_SOURCE = "mfu_peak_source"
TAG_MEMORY_SOURCE = "memory_source"
"""What sys/peak_mem_gb measures on this device (telemetry.peak_memory.MEMORY_SOURCES)."""
TAG_CHECKPOINT_DIR = "checkpoint_dir"
"""Where the trial's checkpoints are: a rerun of its sweep resumes it from there."""
TAG_RESUMED_FROM = "resumed_from"
"""The checkpoint the trial last resumed from (absent if it never resumed)."""
TAG_CONTINUES = "continues"
"""On a run that a resume with another train.max_steps opened: the run it continues, whose history
up to the checkpoint it holds (tracking.changed_resume)."""
TAG_CONTINUED_IN = "continued_in"
"""On the run such a resume left: the run that continues it from its checkpoint."""
TAG_NOTE = "note"
"""What happened to a run that a person reading it should know (e.g. why it stopped where it did)."""
TAG_ROLLBACKS = "rollbacks"
"""train.on_divergence=rollback: each rollback, 'step 6 -> 4 (lr x0.5, fp32)', '; '-joined."""
TAG_ELASTIC = "elastic"
"""Elastic trials: the worker counts the trial may run on, min-max (e.g. '1-2'); absent on a
fixed gang."""

TAG_FP8_LAYERS = "fp8_layers"
"""How many linear layers run in low precision, e.g. '12/13' (the rest kept in high precision)."""
TAG_HP_LAYERS = "hp_layers"
"""The linear layers kept in high precision, by the precision.keep_hp entry that kept them:
'small: layers.0.attention.wq,layers.0.attention.wk; output: output' ('-' = none)."""
TAG_FP8_ALL_GATHER = "fp8_all_gather"
"""fp8 modes: 'true' when FSDP2 all-gathers the FP8 weights in float8, else 'false: <why>'."""
TAG_COMPILE = "compile"
"""What torch.compile compiled (train.compile, auto resolved): 'model', 'block' or 'off'."""
TAG_BF16_UPDATE = "bf16_update"
"""precision=bf16_pure: how the bf16 parameters take an update (plain, stochastic, kahan:
precision.bf16_update); absent in other modes. The precision tag stays 'bf16_pure'."""

# -- the experiment (MLflow's own tag, read by its UI) ---------------------------------------
TAG_EXPERIMENT_KIND = "mlflow.experimentKind"
"""What an experiment is for; MLflow's UI offers its model-training pages for this kind."""
EXPERIMENT_KIND_TRAINING = "custom_model_development"
"""MLflow's name for model training ("Machine learning" in its UI), as against genai_development."""

# -- per-run config keys: tags, not params --------------------------------------------------
PER_RUN_KEYS = ("output_dir", "train.checkpoint_dir", "train.resume", "data.path", "data.tokenizer", "data.cache_dir",
                "tracking.uri",
                "tracking.run_name")
"""Flattened config keys whose value is a path, an address or a name of this run, not a knob:
logged as tags (config_tag), so the params MLflow's compare page plots are the knobs that differ.
trainlab's readers (compare) put them back among the params."""
CONFIG_TAG_PREFIX = "config."


def config_tag(key: str) -> str:
    """The tag of a per-run config key, e.g. config.output_dir."""
    return CONFIG_TAG_PREFIX + key


TAG_PARENT_RUN_ID = "mlflow.parentRunId"  # MLflow's own nesting tag: the UI groups children
TAG_ROLE = "trainlab.role"
ROLE_SWEEP = "sweep"  # the parent run of a multirun
ROLE_TRIAL = "trial"
TAG_SWEEP_ID = "sweep_id"
"""On a parent: hash of the sweep's definition (name + every job's overrides); a rerun of
the same sweep finds its parent by it instead of creating another."""
# the sweep's result on its parent run (compare.answer, logged at the sweep's end and by every
# rerun), so the parent's row in MLflow's runs table answers "what won"
TAG_BEST_CONFIG = "best_config"
"""On a parent: the fastest configuration whose compare verdict is ok ('none' when none is)."""
TAG_SWEEP_RESULT = "sweep_result"
"""On a parent: compare's one-line answer (the winner, its speedup and val-loss gap, or why none)."""
BEST_VAL_LOSS = "sweep/best_val_loss"
"""On a parent: the winner's mean final val loss."""
BEST_SPEEDUP = "sweep/best_speedup"
"""On a parent: the winner's tokens/s over the baseline's."""
BEST_DELTA_VAL_LOSS = "sweep/best_delta_val_loss"
"""On a parent: the winner's val loss minus the baseline's at equal tokens (negative = better)."""


OBJECTIVE_PREFIX = "objective/"
"""On a trial run: what it returned to its sweeper (vocab.objectives), one metric per objective."""


def objective_metric(name: str) -> str:
    return f"{OBJECTIVE_PREFIX}{name}"


TAG_OBJECTIVE = "objective"
"""On a sweep's parent run: the objectives its trials returned, comma-separated, in order."""
TAG_SWEEPER = "sweeper"
"""On a parent: the Hydra sweeper that proposed the trials (basic, optuna, nevergrad, ax, ...)."""
TAG_SAMPLER = "sampler"
"""On a parent: the sweeper's sampler or optimizer (TPESampler, RandomSampler, ...; `grid` for basic)."""
TAG_SWEEPER_SEED = "sweeper_seed"
"""On a parent: the sampler's seed (`none` when unseeded: a rerun cannot replay the study)."""
TAG_DIRECTION = "direction"
"""On a parent: the sweeper's directions, comma-separated, one per objective."""
TAG_PARETO = "pareto"
"""On a trial run: `true` when its configuration is on the study's Pareto front (several objectives)."""
TAG_PARETO_FRONT = "pareto_front"
"""On a parent: the configuration labels on the Pareto front, `; `-separated."""
PARETO_SIZE = "sweep/pareto_size"
"""On a parent: how many configurations are on the Pareto front."""
TRIALS_TOTAL = "sweep/trials"
"""On a parent: trials the study ran, across all of its sweeper's batches."""


def trials_metric(status: str) -> str:
    """On a parent: how many of its trials ended with `status`, e.g. sweep/trials_finished."""
    return f"sweep/trials_{status}"


TAG_RAY_JOB = "ray_job"
"""On a trial and a sweep's parent started by a Ray job (`trainlab submit`, `ray job submit`):
the job's submission id (raysubmit_...); the run's name ends in '(job <id>)' too."""
TAG_CONFIG_LABEL = "config_label"
"""On a child: the swept overrides except the seed, e.g. 'precision=fp16'; the unit compare
aggregates seeds over."""
TAG_OVERRIDES = "overrides"
"""On a child: all of its swept overrides, e.g. 'precision=fp16 seed=1'."""
TAG_DRIVER = "trainlab.driver"
"""The process that holds the run open: 'HOST PID START' (vocab.processes.process_id). A run
left RUNNING by one that is gone (SIGKILL, a crash) is ended by the next start of its config or
its sweep (tracking.continued_run.end_orphaned_runs, tracking.sweep_runs.end_orphaned_sweep_runs)."""
TAG_HEARTBEAT = "trainlab.heartbeat"
"""On a sweep's parent run: when its driver last said it runs the study (Unix seconds), renewed
while it does; how a driver on another host is told alive (tracking.study_owner)."""
TAG_GANG = "gang"
"""On a child: the gang that ran it: 'warm #3 on gang 1' (the 3rd trial of warm gang 1), or
'fresh: <why> (gang 2)' when it started a gang (launch.gang_pool; hydra.launcher.reuse_gangs)."""

STATUS_RUNNING = "running"
STATUS_FINISHED = "finished"
STATUS_DIVERGED = "diverged"
STATUS_FAILED = "failed"
STATUS_PREEMPTED = "preempted"
"""Stopped by SIGTERM after a last checkpoint: the trial resumes when run again."""
STATUS_PRUNED = "pruned"
"""Stopped early by the sweep's pruner (hydra.launcher.prune) as hopeless: a result, never a
failure; no checkpoint is saved for it and a rerun of the sweep skips it, as a finished one."""
DONE_STATUSES = (STATUS_FINISHED, STATUS_DIVERGED, STATUS_PRUNED)
"""Trial statuses a rerun of the sweep skips (hydra.launcher.rerun=true runs them again)."""

# -- artifacts ---------------------------------------------------------------------------
ARTIFACT_CONFIG = "config.yaml"
ARTIFACT_SWEEP_DIR = "sweep"      # on a parent: the sweep definition and the trial summary
ARTIFACT_COMPARE_DIR = "compare"  # on a parent: `trainlab compare` tables, plots, report.html
SPILL_FILE = "mlflow_spill.jsonl"
"""In a trial's output dir: MLflow records kept while the tracking server was unreachable
(`trainlab import-spill` delivers them)."""
ARTIFACT_DETAIL = "detail.parquet"
ARTIFACT_HF_MODEL = "hf_model"
"""train.export=hf: the trained model as transformers' save_pretrained folder (in the output dir and
the run's artifacts)."""
"""On a trial (and in its output dir): the per-layer and per-rank numbers in long format, one
row per (step, metric): trainlab.tracking.detail_table.COLUMNS. Kept out of the run's metrics
(tracking.detail=summary) so that a model of any depth logs the same few dozen metrics."""
DETAIL_ROWS_FILE = "detail_rows.csv"
"""In a trial's output dir: the rows of ARTIFACT_DETAIL as rank 0 logs them (appended, so a
crash keeps them; the next start of the trial, or its close, turns them into the Parquet)."""

# -- per rank: each rank's time and memory, and their spread over ranks ------------------
# trainlab.telemetry.ranks: each rank's numbers under rank/<r>/<key>, plus aggregates over
# ranks under sys/; gathered to rank 0 at log steps
RANK_PREFIX = "rank/"


def rank_metric(rank: int, key: str) -> str:
    """e.g. rank/1/busy_fraction"""
    return f"{RANK_PREFIX}{rank}/{key}"


RANK_STEP_TIME = "step_time_s"
"""Wall time of this rank's optimizer step."""
RANK_COMPUTE = "compute_s"
"""Time in forward, backward and optimizer compute, less the communication wait inside them."""
RANK_BUSY_FRACTION = "busy_fraction"
"""compute_s / step_time_s: the rest is waiting (slower ranks, pipeline bubbles, collectives)."""
RANK_COMM_WAIT = "comm_wait_s"
"""Time inside compute phases spent waiting on communication (DDP's all-reduce after the last
gradient; blocking collectives when timed)."""
RANK_COMM = "comm_s"
"""Time with at least one Python-level collective in flight (timed collectives only)."""
RANK_PARAM_GB = "param_gb"
"""This rank's parameters (local shards), GB."""
RANK_GRAD_GB = "grad_gb"
RANK_OPTIM_STATE_GB = "optim_state_gb"
RANK_PEAK_MEM_GB = "peak_mem_gb"
RANK_DP_SHARE = "dp_share"
"""parallel.dp_balance weighted / accumulate: sequences of each global batch this rank takes,
logged once, at the step the shares are fixed (the shares sum to train.global_batch_size)."""
RANK_DP_MICRO_BATCHES = "dp_micro_batches"
"""parallel.dp_balance weighted / accumulate: micro-batches this rank runs per step."""
RANK_DP_WEIGHT = "dp_weight"
"""parallel.dp_balance weighted / accumulate: the weight the shares are proportional to, i.e.
parallel.dp_weights, or the measured sequences per compute-second of the warm-up steps."""
STEP_TIME_MAX = "sys/step_time_max_s"
STEP_TIME_MIN = "sys/step_time_min_s"
STRAGGLER_RATIO = "sys/straggler_ratio"
"""Largest compute_s over the median compute_s of all ranks: 1 = balanced. Compute, not step
time: synchronous ranks end their steps together, the fast ones waiting for the slow one."""
BUSY_FRACTION_MIN = "sys/busy_fraction_min"
"""The idlest rank's busy fraction."""
PARAM_GB = "sys/param_gb"
"""Largest per-rank parameter GB over ranks (ZeRO-3 / FSDP: ~1/dp of the model)."""
GRAD_GB = "sys/grad_gb"
"""Largest per-rank gradient GB over ranks."""
OPTIM_STATE_GB = "sys/optim_state_gb"
"""Largest per-rank optimizer-state GB over ranks (ZeRO-1 and up: ~1/dp)."""
PEAK_MEM_GB_MAX = "sys/peak_mem_gb_max"
"""Largest peak memory over ranks (sys/peak_mem_gb is rank 0's)."""

PP_BUBBLE_THEORY = "sys/pp_bubble_theory"
"""Pipelines: the schedule's idle share in theory, (pp-1)/(v*m+pp-1)."""
PP_BUBBLE = "sys/pp_bubble"
"""Pipelines: the measured idle share of this step on rank 0 (1 - its busy fraction)."""

# -- the estimate: what the driver predicted, beside what the trial measured ---------------
# trainlab.estimate: what the driver estimated for the trial before it started (TrialPlan.estimate),
# logged at its first step beside what it then measured, and at its end the ratios of the two
EST_PREFIX = "est/"
EST_PEAK_MEM_GB = "est/peak_mem_gb"
"""Estimated peak memory of rank 0 (as sys/peak_mem_gb), GB."""
EST_PEAK_MEM_GB_MAX = "est/peak_mem_gb_max"
"""Estimated peak memory of the largest rank (as sys/peak_mem_gb_max), GB."""
EST_STEP_TIME_S = "est/step_time_s"
"""Estimated optimizer step time (the slowest rank's), as train/step_time_s."""
EST_TOKENS_PER_S = "est/tokens_per_s"
EST_MFU = "est/mfu"
EST_PARAM_GB = "est/param_gb"
"""Largest per-rank parameter GB over ranks, as sys/param_gb."""
EST_GRAD_GB = "est/grad_gb"
EST_OPTIM_STATE_GB = "est/optim_state_gb"
"""Largest per-rank optimizer state (moments, steps, Kahan buffers) GB, as sys/optim_state_gb."""
EST_ACTIVATION_GB = "est/activation_gb"
"""Largest per-rank activations (micro-batches in flight) GB."""
EST_COMPUTE_S = "est/compute_s"
"""The slowest rank's compute seconds per step (its step: compute + comm + bubble + overhead + wait)."""
EST_COMM_S = "est/comm_s"
"""The slowest rank's exposed communication seconds per step."""
EST_BUBBLE_S = "est/bubble_s"
"""The slowest rank's pipeline bubble and waiting seconds per step."""
EST_METRICS = (EST_PEAK_MEM_GB, EST_PEAK_MEM_GB_MAX, EST_STEP_TIME_S, EST_TOKENS_PER_S, EST_MFU, EST_PARAM_GB,
               EST_GRAD_GB, EST_OPTIM_STATE_GB, EST_ACTIVATION_GB, EST_COMPUTE_S, EST_COMM_S, EST_BUBBLE_S)
"""Logged once, at the step the trial starts from."""
EST_PEAK_MEM_RATIO = "est/peak_mem_ratio"
"""At the trial's end: measured / estimated peak memory of rank 0 (sys/peak_mem_gb / est/peak_mem_gb)."""
EST_STEP_TIME_RATIO = "est/step_time_ratio"
"""At the trial's end: measured / estimated step time (tokens per step over the trial's median tokens/s)."""
EST_TOKENS_PER_S_RATIO = "est/tokens_per_s_ratio"
"""At the trial's end: measured / estimated tokens/s (the trial's median train/tokens_per_s)."""
TAG_EST_BOUND = "est/bound"
"""What the estimate says limits the trial: compute, memory, communication, bubble or overhead."""
TAG_EST_CALIBRATION = "est/calibration"
"""Where the estimate's efficiencies came from: 'default' or a calibration file (cluster.calibration)."""
TAG_EST_CLUSTER = "est/cluster"
"""The cluster the estimate was made for, e.g. '8xH100 + 8xH100' or '4xcpu'."""

# -- reproducibility: checksums of a trial's final parameters and loss curve -------------
# trainlab.telemetry.checksum: at the end of every trial; compare groups the runs that should
# match (compare/repro.py) and says whether these agree and, if not, by how much
TAG_PARAMS_SHA = "repro/params_sha256"
"""SHA-256 of the full final parameters in canonical form (sorted by the model's parameter
names, float32 bytes of the unsharded tensors): equal across layouts when the bits are."""
TAG_LOSS_CURVE_SHA = "repro/loss_curve_sha256"
"""SHA-256 of the per-step train losses as float64 bytes."""
PARAM_NORM = "repro/param_norm"
"""L2 norm of the full final parameters (a metric, logged at the last step)."""


# -- names other systems carry (issue 28) --------------------------------------------------
def ray_name(name: str) -> str:
    """The form of a run name that Ray Train is handed (its run name, its metric tags: ASCII
    only). An ASCII name as it is; any other its ASCII letters (accents taken off, the rest
    '-') and 8 hex digits of the name's sha1, so two names stay two. MLflow keeps the user's name."""
    if name.isascii() and name.isprintable():
        return name
    base = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip("-.")
    return f"{base or 'run'}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"
