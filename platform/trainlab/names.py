"""One vocabulary for results: every metric, tag and artifact name, defined once.

compare, the MLflow UI, the tests and the trackers all read these constants, so a name
changes here or nowhere. Metrics are stepped by optimizer step; each also has a twin
under ``by_tokens/`` stepped by tokens seen, so runs of different batch sizes line up.
"""

from __future__ import annotations

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
# reference lines: constant over a run, logged once at step 0
REF_UNIGRAM_ENTROPY = "ref/unigram_entropy"
REF_TRUE_ENTROPY = "ref/true_entropy"
# prefix for numerics (amax, scales, under/overflow fractions)
NUM_PREFIX = "num/"

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
TAG_WORLD_SIZE = "world_size"
TAG_SEED = "seed"
TAG_CONFIG_HASH = "config_hash"
TAG_CORPUS = "corpus"
TAG_CORPUS_FINGERPRINT = "corpus_fingerprint"
TAG_SWEEP = "sweep"
TAG_STATUS = "status"
TAG_DIVERGED_STEP = "diverged_step"
TAG_FIRST_NONFINITE = "first_nonfinite"
TAG_ERROR = "error"
TAG_MFU_PEAK_SOURCE = "mfu_peak_source"

TAG_PARENT_RUN_ID = "mlflow.parentRunId"  # MLflow's own nesting tag: the UI groups children
TAG_ROLE = "trainlab.role"
ROLE_SWEEP = "sweep"  # the parent run of a multirun
ROLE_TRIAL = "trial"
TAG_SWEEP_ID = "sweep_id"
"""On a parent: hash of the sweep's definition (name + every job's overrides); a rerun of
the same sweep finds its parent by it instead of creating another."""
TAG_CONFIG_LABEL = "config_label"
"""On a child: the swept overrides except the seed, e.g. 'precision=fp16'; the unit compare
aggregates seeds over."""
TAG_OVERRIDES = "overrides"
"""On a child: all of its swept overrides, e.g. 'precision=fp16 seed=1'."""

STATUS_RUNNING = "running"
STATUS_FINISHED = "finished"
STATUS_DIVERGED = "diverged"
STATUS_FAILED = "failed"

# -- artifacts ---------------------------------------------------------------------------
ARTIFACT_CONFIG = "config.yaml"
ARTIFACT_SWEEP_DIR = "sweep"      # on a parent: the sweep definition and the trial summary
ARTIFACT_COMPARE_DIR = "compare"  # on a parent: `trainlab compare` tables, plots, report.html

# precision modes from most to least precise: compare's default baseline is the first present
PRECISION_RANK = ("fp32", "fp16", "bf16", "bf16_pure")
