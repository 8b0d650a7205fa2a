"""Typed config: one dataclass per Hydra group, registered in Hydra's ConfigStore.

Each group option under ``conf/<group>/`` names its schema first in its defaults list
(``- /<group>_schema@_here_``), so a typo in a key fails at composition. The schemas are
stored outside the groups (Hydra 1.3's "schema from a different config group" pattern: an
absolute path, merged into the option's own package): stored in a group they would be options
of it, listed by ``--help`` and completion and accepted as ``model=model_schema``.

Field checks that need one section live in ``__post_init__`` (Hydra runs it only after
``OmegaConf.to_object``), which first holds every field to the type and range declared next to
it (``bounded(...)``, ``text(...)``: :mod:`trainlab.config.bounds`); checks across sections
live in :mod:`trainlab.config.validate`.

Sentinels: ``0`` for a size means "derive it" where the comment says so; ``""`` for a
string means "unset / default".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from trainlab.config.bounds import bounded, check_fields, text
from trainlab.config.debug import DebugConfig
from trainlab.config.moved import removed_value_message
from trainlab.vocab.format_names import parse_format
from trainlab.vocab.nodes import parse_node

# the precision modes and their families come from their specifications (vocab.precision)
from trainlab.vocab.precision import (
    BF16_UPDATES,
    EMULATION_TARGETS,
    PRECISIONS,
    ROLLBACK_PRECISIONS,
    spec_of,
)

ON_DIVERGENCE = ("stop", "rollback")
HP_DTYPES = ("bf16", "fp32")
STATE_DTYPES = ("fp32", "bf16", "e4m3", "e5m2")
DEVICES = ("auto", "cpu", "cuda")
DATASETS = ("text", "markov", "tokens", "hf")
HF_FORMATS = ("text", "chat")
LOSS_ON = ("all", "answer")
HF_ONLY_FIELDS = ("tokenizer", "format", "text_field", "messages_field", "loss_on", "split", "cache_dir")
"""The data.* fields only data=hf reads."""
TOKEN_DTYPES = ("uint8", "uint16", "int32", "uint32")
PARALLEL_LAYOUTS = ("ddp", "zero1", "zero2", "fsdp", "hsdp", "tp", "pp", "dp_tp", "dp_pp", "fsdp_tp")
DATA_PARALLEL = ("ddp", "zero1", "zero2", "fsdp", "hsdp")
PP_SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")
DP_BALANCE = ("equal", "weighted", "accumulate")
COMM_DTYPES = ("fp32", "fp16", "bf16")
CHECKPOINTING = ("none", "block", "selective")
COMPILE = ("auto", "true", "false")
COMPILE_UNITS = ("model", "block")
EXPORTS = ("hf",)
HF_MODEL_FIELDS = ("config", "pretrained", "qkv_bias", "tie_embeddings", "sliding_window", "_target_", "tp_plan")
"""model.* fields that a preset leaves unset: a Hugging Face model's files and what its config.json says
(model=hf), your own builder (model=custom) and your own tensor-parallel plan (any model)."""
TP_STYLES = ("colwise", "rowwise")
"""model.tp_plan's styles: torch's ColwiseParallel and RowwiseParallel of an nn.Linear."""
PLACEMENTS = ("same_type", "pack", "spread")
FP16_IMPLS = ("auto", "emulated", "native")
FP8_IMPLS = ("native", "emulated")
DETAIL_LEVELS = ("summary", "full")
"""tracking.detail: per-layer/per-rank numbers in detail.parquet only, or also as metrics."""
# Ranges every field keeps are declared next to it (config.bounds); a few shared ones:
SEED_MAX, SEED_WHY = 2**32 - 1, "Python's and numpy's global seeds are 32-bit"
WAIT_MAX_S, WAIT_WHY = 86_400.0, "seconds, a day at most: the OS cannot time a longer wait"


def _positive(section: str, **values: Any) -> None:
    for name, value in values.items():
        if value is None or value <= 0:
            raise ValueError(
                f"{section}.{name}={value!r} must be a positive number; "
                f"set {section}.{name} to a value above 0"
            )


def _one_of(section: str, name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(
            f"{section}.{name}={value!r} is not known; choose one of {', '.join(choices)}"
        )


# ---------------------------------------------------------------------------------------
@dataclass
class ModelConfig:
    """A Llama-style decoder: RMSNorm, rotary positions, SwiGLU MLP, SDPA attention. Either one of
    trainlab's presets, or (name=hf) a Hugging Face model whose config.json sets every dimension."""

    name: str = MISSING
    """Preset name (tiny, small, 125m, 350m, 1b, 7b), or hf; recorded as the `model` tag."""
    config: str = ""
    """hf only: a transformers config.json, or the folder holding one: a model of that shape
    trained from a random init (llama, mistral, qwen2 or qwen3). Its dimensions replace dim,
    n_layers, n_heads, ... below."""
    pretrained: str = ""
    """hf only: a local folder saved by transformers' save_pretrained (config.json and
    *.safetensors): fine-tune from its weights. Never a hub name: nothing downloads."""
    _target_: str = ""
    """Your own model (Hydra's convention, model=custom): 'package.module.function', called with the
    model.* fields its signature names (vocab_size: the corpus's when model.vocab_size=0). It returns
    an nn.Module mapping tokens [B, T] to logits [B, T, V] with its blocks in `.layers` (an
    nn.ModuleList): what FSDP shards, checkpointing recomputes and compile compiles one by one."""
    dim: int = bounded(64, gt=0)
    """Width of the residual stream."""
    n_layers: int = bounded(2, gt=0)
    """Number of transformer blocks."""
    n_heads: int = bounded(4, gt=0)
    """Attention heads; dim must divide by it."""
    n_kv_heads: int = bounded(0, ge=0, note="0 = n_heads")
    """Key/value heads for grouped-query attention; 0 = n_heads (plain multi-head)."""
    ffn_dim: int = bounded(0, ge=0, note="0 = derived from dim")
    """Hidden width of the SwiGLU MLP; 0 = 8/3 * dim rounded up to `multiple_of`."""
    multiple_of: int = bounded(32, gt=0)
    """Round the derived ffn_dim up to a multiple of this (tensor-core friendly)."""
    vocab_size: int = bounded(0, ge=0, note="0 = the corpus's vocabulary")
    """Vocabulary size; 0 = the corpus's vocabulary (byte-level corpora: 256)."""
    max_seq_len: int = bounded(256, gt=0)
    """Longest context the rotary table is built for; train.seq_len may not exceed it."""
    rope_theta: float = bounded(10000.0, gt=1,
                                why="the rotary frequencies theta**(-2i/d) must fall along a head")
    """Rotary base frequency."""
    norm_eps: float = bounded(1e-5, gt=0)
    """RMSNorm epsilon."""
    init_std: float = bounded(0.02, gt=0)
    """Std of the normal init of linear and embedding weights."""
    smooth_swiglu: bool = False
    """Smooth-SwiGLU (Fishman et al., ICLR 2025): scale each SwiGLU output channel by a
    power of 2 near 1/amax before the down projection (w2) and divide w2's matching input
    column by the same factor. Same function; the activation FP8 casts has no outlier
    channels. Costs one extra pass over the MLP hidden activation; for fp8 modes."""
    head_dim: int = bounded(0, ge=0, note="0 = dim / n_heads")
    """Width of one attention head; 0 = dim / n_heads. hf: from config.json (Qwen3 sets its own)."""
    qkv_bias: bool = False
    """hf only, from config.json: the query/key/value projections have biases (Qwen2)."""
    tie_embeddings: bool = False
    """hf only, from config.json: the output head shares the token embedding's weight."""
    sliding_window: int = bounded(0, ge=0, note="0 = none")
    """hf only, from config.json: tokens a sliding-window attention layer sees (Mistral)."""
    tp_plan: dict[str, str] = field(default_factory=dict)
    """Your own tensor-parallel plan, used instead of trainlab's built-in one when parallel.tp > 1
    (for any model: custom, hf or a preset), as transformers' base_model_tp_plan writes it: a module
    path pattern (dot-separated, `*` matches one whole name, e.g. layers.*.mlp.fc) -> colwise (an
    nn.Linear sharded on its output features, each rank keeps its part of the output) or rowwise
    (sharded on its input features, its output summed over the ranks). Every matched module must be
    an nn.Linear; every other parameter is replicated. Shards hold whole heads: model.n_heads, and
    each colwise out_features / rowwise in_features, must divide by parallel.tp. {} = the built-in
    plan (trainlab's and Hugging Face Llama-family blocks only)."""

    def __post_init__(self) -> None:
        check_fields(self, section="model")
        for pattern, style in self.tp_plan.items():
            _one_of("model", f"tp_plan.{pattern}", style, TP_STYLES)
        if self._target_ and self.name == "hf":
            raise ValueError(f"model._target_={self._target_!r} with model=hf: a Hugging Face model is built from "
                             "its config.json; use model=custom for your own builder")
        if self.name == "hf":
            if self.smooth_swiglu:
                raise ValueError("model.smooth_swiglu=true is trainlab's own MLP (its presets); a Hugging "
                                 "Face model (model=hf) keeps its own: set model.smooth_swiglu=false")
            self._fill_from_hf()
        elif self.config or self.pretrained:
            which = "model.config" if self.config else "model.pretrained"
            raise ValueError(f"{which} is set but model={self.name}; a Hugging Face model needs model=hf "
                             f"({which}=... model=hf)")
        elif self.qkv_bias or self.tie_embeddings or self.sliding_window:
            raise ValueError(f"model={self.name}: qkv_bias, tie_embeddings and sliding_window come from a "
                             "Hugging Face config.json (model=hf model.config=DIR); leave them unset")
        if self.dim % self.n_heads:
            raise ValueError(
                f"model.dim={self.dim} is not divisible by model.n_heads={self.n_heads}; "
                "pick a head count that divides the width"
            )
        kv = self.n_kv_heads or self.n_heads
        if self.n_heads % kv:
            raise ValueError(
                f"model.n_heads={self.n_heads} is not divisible by model.n_kv_heads={kv}; "
                "grouped-query attention needs whole groups"
            )
        if (self.head_dim or self.dim // self.n_heads) % 2:
            raise ValueError(
                f"model head size {self.head_dim or self.dim // self.n_heads} is odd; rotary "
                "positions need an even head size"
            )

    def _fill_from_hf(self) -> None:
        """Every dimension from the Hugging Face config.json model.config or model.pretrained names
        (config.hf_model): what the pipeline, tensor-parallel and memory checks plan with."""
        from trainlab.config.hf_model import read_hf_dims

        if bool(self.config) == bool(self.pretrained):
            raise ValueError(
                "model=hf needs one of model.config=CONFIG_JSON_OR_DIR (random init) or "
                "model.pretrained=DIR (fine-tune its weights)" + (", not both" if self.config else ""))
        dims = read_hf_dims(*self.hf_source())
        for key in dims.model_fields():
            setattr(self, key, getattr(dims, key))

    def hf_model_type(self) -> str:
        """model=hf's model_type (llama, gpt_neox, ...); "" for trainlab's presets and model=custom."""
        from trainlab.config.hf_model import read_hf_dims

        return read_hf_dims(*self.hf_source()).model_type if self.name == "hf" else ""

    def runs_transformers_forward(self) -> bool:
        """model=hf of a family trainlab has no decoder loop for (config.hf_model.own_loop): it runs
        transformers' own forward (models.hf_any), so it cannot be cut into pipeline stages."""
        from trainlab.config.hf_model import own_loop

        return self.name == "hf" and not own_loop(self.hf_model_type())

    def hf_source(self) -> tuple[str, str]:
        """model=hf's config.json: (value, field) of model.config, else of model.pretrained."""
        return (self.config, "model.config") if self.config else (self.pretrained, "model.pretrained")


@dataclass
class DataConfig:
    """Where tokens come from. Nothing is downloaded: every corpus is made or found here."""

    name: str = "text"
    """text: the Python language reference shipped with CPython (byte-level, real English);
    markov: a seeded synthetic Markov source whose true entropy is known exactly;
    tokens: a user's pre-tokenized binary token file (memory-mapped);
    hf: a local Hugging Face dataset or json/jsonl/parquet/txt files, tokenized once by a local
    tokenizer into a cached token file (trainlab.data.hf_corpus)."""
    path: str = ""
    """tokens: path to the raw token file (no header; a regular file of at most 1 TiB); hf: a
    folder `datasets.save_to_disk` wrote, a .json/.jsonl/.parquet/.txt file, or a folder of such
    files (a .txt file is one document). A Hugging Face Hub name is refused: nothing is downloaded."""
    token_dtype: str = "uint16"
    """tokens only: element type of the token file; a file written in a type twice as wide (int32
    read as uint16: every second id 0) is refused, naming the dtype to set."""
    vocab_size: int = bounded(0, ge=0, note="0 = unset")
    """markov: number of states (= vocabulary); tokens: vocabulary of the file (required);
    text: ignored (256 bytes)."""
    num_tokens: int = bounded(1_000_000, gt=0)
    """markov only: length of the generated corpus in tokens."""
    concentration: float = bounded(0.1, gt=0)
    """markov only: Dirichlet concentration of each transition row (smaller = more
    predictable source, lower true entropy)."""
    seed: int = bounded(1234, ge=0, le=SEED_MAX, why=SEED_WHY)
    """markov only: seed of the source, independent of the run seed so every trial of a
    sweep trains on the same corpus."""
    val_fraction: float = bounded(0.05, gt=0, lt=0.5)
    """Share of the token stream held out (at its end) for validation."""
    tokenizer: str = ""
    """hf only: a local tokenizer folder (AutoTokenizer.from_pretrained reads it with
    local_files_only); its vocabulary is the corpus's. A Hub name is refused: nothing is downloaded."""
    format: str = "text"
    """hf only: text (each row's text_field is a document) or chat (each row's messages_field is
    a conversation, rendered by the tokenizer's chat template)."""
    text_field: str = "text"
    """hf, format=text: the column holding each document's text."""
    messages_field: str = "messages"
    """hf, format=chat: the column holding each conversation, a list of {role, content}."""
    loss_on: str = "all"
    """hf: all (every token is a target) or answer (format=chat only: only the assistant's
    tokens are targets; the others are masked to -100 and carry no loss)."""
    split: str = ""
    """hf, a saved DatasetDict: the split to read; empty = its `train` split. A saved Dataset and
    data files have no splits, so it stays empty for them (its own splits are not used for
    validation: val_fraction holds out the end of the token stream, as for every corpus)."""
    cache_dir: str = ""
    """hf only: where the tokenized corpus is cached, one folder per dataset version, tokenizer
    and fields (re-tokenized only when one of them changes); empty = ~/.cache/trainlab/tokens."""

    def __post_init__(self) -> None:
        check_fields(self, section="data")
        _one_of("data", "name", self.name, DATASETS)
        _one_of("data", "token_dtype", self.token_dtype, TOKEN_DTYPES)
        if self.name == "markov":
            _positive("data", vocab_size=self.vocab_size)
        if self.name == "tokens":
            if not self.path:
                raise ValueError("data.path is empty; data=tokens needs data.path=/path/to/tokens.bin")
            _positive("data", vocab_size=self.vocab_size)
        _one_of("data", "format", self.format, HF_FORMATS)
        _one_of("data", "loss_on", self.loss_on, LOSS_ON)
        if self.name == "hf":
            if not self.path:
                raise ValueError("data.path is empty; data=hf needs data.path=/path/to/dataset "
                                 "(a save_to_disk folder, or json/jsonl/parquet/txt files)")
            if not self.tokenizer:
                raise ValueError("data.tokenizer is empty; data=hf needs data.tokenizer=/path/to/tokenizer "
                                 "(a folder AutoTokenizer.from_pretrained reads)")
            field_name = "text_field" if self.format == "text" else "messages_field"
            if not getattr(self, field_name):
                raise ValueError(f"data.{field_name} is empty; name the dataset's column, e.g. "
                                 f"data.{field_name}={getattr(DataConfig(), field_name)}")
            if self.loss_on == "answer" and self.format != "chat":
                raise ValueError("data.loss_on=answer needs data.format=chat (the answers are the "
                                 "assistant's turns); set data.format=chat or data.loss_on=all")


@dataclass
class ParallelConfig:
    """How the world of workers is laid out on a DeviceMesh: dp x tp x pp = the world size.

    `data_parallel` says how the dp ranks share the model; tp and pp cut it. Hybrids are
    degrees above 1 together (e.g. data_parallel=fsdp tp=2, or dp=2 pp=4 on 8 devices)."""

    name: str = "ddp"
    """The layout's name, recorded as the `parallel` tag (the option chosen in conf/parallel/)."""
    data_parallel: str = "ddp"
    """ddp (full replica per rank), zero1 (DDP + optimizer states sharded), zero2 (FSDP2
    without resharding after forward: gradients and states sharded), fsdp (FSDP2, ZeRO-3:
    parameters too), hsdp (FSDP2 sharded within dp_shard groups, replicated across them)."""
    dp: int = bounded(0, ge=0, note="0 = derive")
    """Data-parallel degree; 0 = world size / (tp * pp)."""
    dp_replicate: int = bounded(1, gt=0)
    """hsdp only: replica groups (the rest of dp shards within a group)."""
    tp: int = bounded(1, gt=0)
    """Tensor-parallel degree (attention heads and MLP columns split across ranks)."""
    sequence_parallel: bool = False
    """tp only: norms and residuals sharded along the sequence (less activation memory)."""
    pp: int = bounded(1, gt=0)
    """Pipeline-parallel degree (the blocks cut into pp stages)."""
    pp_schedule: str = "1f1b"
    """gpipe, 1f1b or interleaved_1f1b."""
    pp_microbatches: int = bounded(0, ge=0, note="0 = derive")
    """Micro-batches per pipeline step; 0 = the micro-batches gradient accumulation would run
    (train.global_batch_size / (dp x train.micro_batch_size)). The bubble is (pp-1)/(m+pp-1)."""
    pp_virtual_stages: int = bounded(1, gt=0)
    """interleaved_1f1b: stages per rank."""
    bucket_cap_mb: float = bounded(25.0, gt=0)
    """DDP gradient bucket size in MiB (PyTorch's default is 25)."""
    comm_dtype: str = "fp32"
    """Precision of the data-parallel gradient all-reduce: fp32, fp16 or bf16."""
    powersgd_rank: int = bounded(0, ge=0, note="0 = off")
    """ddp: PowerSGD low-rank gradient compression of this rank; 0 = off."""
    activation_checkpoint: str = "none"
    """none, block (recompute every block in backward) or selective (every other block)."""
    dp_balance: str = "equal"
    """How the global batch is cut over data-parallel ranks of unequal speed (pure data
    parallel only: tp = pp = 1). equal: global_batch_size / dp sequences each; weighted: each
    rank's sequences per step proportional to its weight, cut into the same number of
    micro-batches on every rank (a faster rank gets larger micro-batches); accumulate: every
    micro-batch has train.micro_batch_size sequences, a rank's number of micro-batches
    (accumulation steps) is proportional to its weight (ddp and zero1 only). The gradient is
    the global-batch mean in every mode (trainlab.engine.balance)."""
    dp_weights: list[float] = bounded(default_factory=list, gt=0,
                                      why="each is a rank's relative throughput, e.g. [2, 1]")
    """weighted and accumulate: relative throughput of each data-parallel rank (e.g. [2, 1]);
    empty = measured: sequences per compute-second over the first dp_balance_warmup steps."""
    dp_balance_warmup: int = bounded(3, gt=0)
    """weighted and accumulate with empty dp_weights: steps run with equal shares while each
    rank's compute rate is measured; the rates are measured again over as many steps at the
    shares they give, and the second shares kept (trainlab.engine.balance). Steps 1 and 2 are
    left out when there are later ones: step 1 warms up, and in step 2 DDP rebuilds its
    buckets with a collective inside forward, where a fast rank's wait would pass for compute."""

    def __post_init__(self) -> None:
        check_fields(self, section="parallel")
        _one_of("parallel", "name", self.name, PARALLEL_LAYOUTS)
        _one_of("parallel", "data_parallel", self.data_parallel, DATA_PARALLEL)
        _one_of("parallel", "pp_schedule", self.pp_schedule, PP_SCHEDULES)
        _one_of("parallel", "comm_dtype", self.comm_dtype, COMM_DTYPES)
        _one_of("parallel", "activation_checkpoint", self.activation_checkpoint, CHECKPOINTING)
        _one_of("parallel", "dp_balance", self.dp_balance, DP_BALANCE)
        if self.dp_replicate > 1 and self.data_parallel != "hsdp":
            raise ValueError(f"parallel.dp_replicate={self.dp_replicate} only applies to "
                             "parallel.data_parallel=hsdp; set parallel.dp_replicate=1")
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("parallel.sequence_parallel=true needs parallel.tp > 1")
        if self.powersgd_rank and self.data_parallel != "ddp":
            raise ValueError(f"parallel.powersgd_rank={self.powersgd_rank} is a DDP communication "
                             f"hook; it does not combine with parallel.data_parallel="
                             f"{self.data_parallel}; set parallel.powersgd_rank=0")


@dataclass
class EmulatedFormats:
    """precision=emulated: the format each kind of tensor is cast to; "" = left in high precision.

    A format is eXmY (exponent and mantissa bits, with infinities, IEEE-style) or eXmYfn (no
    infinities, saturating, like float8_e4m3fn in FP8 recipes); e4m3 means e4m3fn, fp16 = e5m10,
    bf16 = e8m7. Casts use a per-tensor scale (precision.scaling)."""

    activations: str = ""
    """Inputs of the low-precision linear layers."""
    weights: str = ""
    """Weights of the low-precision linear layers (as the matmul sees them; masters stay fp32)."""
    gradients: str = ""
    """Gradients flowing back into the low-precision linear layers (grad_output)."""
    optimizer_states: str = ""
    """Both AdamW moments, re-rounded after every step."""
    comm_grads: str = ""
    """Gradients as the data-parallel all-reduce sends them."""


@dataclass
class PrecisionConfig:
    """Numeric format of compute, parameters and loss scaling."""

    name: str = "fp32"
    """fp32; bf16 (autocast, fp32 master weights); fp16 (autocast + dynamic loss scaling);
    bf16_pure (bf16 parameters and compute); fp8_tensorwise, fp8_rowwise, fp8_rowwise_gw_hp
    (torchao Float8Linear, current scaling); fp8_delayed (FP8 with an amax history, as
    Transformer Engine); emulated (any eXmY format on chosen tensors, see formats)."""
    fp16_impl: str = "auto"
    """fp16 only: native (torch fp16 kernels), emulated (operands rounded through fp16,
    fp32 accumulation; fast on CPU), auto = emulated on CPU, native on GPU."""
    loss_scale: str = "dynamic"
    """fp16 only: 'dynamic' (GradScaler) or 'none' (watch gradients underflow)."""
    init_scale: float = bounded(65536.0, gt=0, le=2.0**127, why="the scale is held in fp32")
    """fp16 dynamic scaling: initial loss scale."""
    growth_factor: float = bounded(2.0, gt=1, why="the scale grows by it")
    """fp16 dynamic scaling: multiply the scale by this after growth_interval clean steps."""
    backoff_factor: float = bounded(0.5, gt=0, lt=1, why="the scale shrinks by it")
    """fp16 dynamic scaling: multiply the scale by this after a non-finite gradient."""
    growth_interval: int = bounded(2000, gt=0)
    """fp16 dynamic scaling: clean steps before the scale grows."""
    fp8_impl: str = "native"
    """fp8 modes: native (real float8 casts and scaled matmuls; needs SM 8.9+ on a GPU, refused
    with a message on an older one; runs slowly on CPU) or emulated (the same casts, matmuls in
    high precision: any GPU)."""
    tf32: bool = False
    """fp32 only, on CUDA GPUs of SM 8.0+: run fp32 matmuls on TF32 tensor cores (10-bit
    mantissa inputs, fp32 accumulation). Off by default, so fp32 means fp32; MFU is measured
    against the TF32 peak when on and the plain FP32 peak when off."""
    hp_dtype: str = "bf16"
    """fp8 and emulated modes: dtype of everything that is not a low-precision linear
    (attention, norms, the high-precision layers): bf16 autocast or fp32."""
    keep_hp: list[str] | None = None
    """fp8 and emulated modes: linear layers kept in high precision. Each entry is first_block,
    last_block, output (the LM head), unaligned (in or out features not a multiple of 16,
    which FP8 matmuls cannot take), small (fp8 modes: too small for FP8 matmuls to pay for
    their casts, by torchao's thresholds for the recipe) or a glob on module names (e.g.
    'layers.*.attention.*'). Unset (null) = the mode's default: [output, unaligned, small]
    for fp8 modes, [output, unaligned] otherwise; [] = keep none."""
    amax_history_len: int = bounded(16, gt=0)
    """fp8_delayed: steps of amax history a scale is taken from (the max over it)."""
    fp8_margin: int = bounded(0, ge=0, le=126, why="scales are divided by 2**margin, held in fp32")
    """fp8_delayed: scales are divided by 2**margin (headroom against growing amaxes)."""
    formats: EmulatedFormats = field(default_factory=EmulatedFormats)
    """emulated: the format of each tensor kind."""
    scaling: str = "tensor"
    """emulated: 'tensor' (per-tensor scale to the format's range, as FP8 recipes do) or 'none'
    (raw casts: watch values fall off the format's range)."""
    bf16_update: str = "kahan"
    """bf16_pure only: how the bf16 parameters take an update. plain: torch's AdamW, rounded
    to nearest (an update below half a bf16 ulp, 2**-9 of the weight, is lost: late-cosine
    steps vanish); stochastic: computed in fp32 and rounded up or down with the probability
    of the remainder (kept in expectation, as torchao's bf16_stochastic_round); kahan: a bf16
    compensation buffer per parameter carries what rounding lost (2 more bytes a parameter,
    deterministic, follows the fp32-master trajectory)."""

    def __post_init__(self) -> None:
        check_fields(self, section="precision")
        _one_of("precision", "name", self.name, PRECISIONS)
        _one_of("precision", "fp16_impl", self.fp16_impl, FP16_IMPLS)
        gone = removed_value_message("precision.fp8_impl", self.fp8_impl)
        if gone:
            raise ValueError(gone)
        _one_of("precision", "fp8_impl", self.fp8_impl, FP8_IMPLS)
        _one_of("precision", "hp_dtype", self.hp_dtype, HP_DTYPES)
        _one_of("precision", "loss_scale", self.loss_scale, ("dynamic", "none"))
        _one_of("precision", "scaling", self.scaling, ("tensor", "none"))
        _one_of("precision", "bf16_update", self.bf16_update, BF16_UPDATES)
        spec = spec_of(self.name)
        if self.keep_hp is None:
            self.keep_hp = list(spec.keep_hp)
        if "small" in self.keep_hp and not spec.size_filter:
            raise ValueError(
                f"precision.keep_hp entry 'small' (linears too small for FP8 matmuls to pay) has no "
                f"meaning with precision={self.name}, which runs no FP8 kernels; remove it")
        if self.name == "emulated":
            chosen = {t: getattr(self.formats, t) for t in EMULATION_TARGETS if getattr(self.formats, t)}
            if not chosen:
                raise ValueError(
                    "precision=emulated sets no format; set at least one of "
                    + ", ".join(f"precision.formats.{t}" for t in EMULATION_TARGETS)
                    + " (e.g. precision.formats.activations=e4m3)"
                )
            for target, spec in chosen.items():
                try:
                    parse_format(spec)
                except ValueError as e:
                    raise ValueError(f"precision.formats.{target}: {e}") from None


@dataclass
class OptimConfig:
    """AdamW with linear warmup then cosine decay to min_lr_ratio * lr."""

    name: str = "adamw"
    """Optimizer (adamw)."""
    lr: float = bounded(1e-3, gt=0)
    """Peak learning rate."""
    min_lr_ratio: float = bounded(0.1, ge=0, le=1)
    """Final LR as a fraction of lr at the end of the cosine."""
    warmup_steps: int = bounded(10, ge=0)
    """Optimizer steps of linear warmup from 0."""
    weight_decay: float = bounded(0.1, ge=0)
    """Decoupled weight decay (not applied to norms and biases)."""
    beta1: float = bounded(0.9, ge=0, lt=1)
    """AdamW's decay rate of the first moment (the running mean of gradients)."""
    beta2: float = bounded(0.95, ge=0, lt=1)
    """AdamW's decay rate of the second moment (the running mean of squared gradients)."""
    eps: float = bounded(1e-8, gt=0)
    """AdamW's epsilon, added to the second moment's square root in the update's denominator."""
    grad_clip: float = bounded(1.0, ge=0, note="0 = no clipping")
    """Clip the global gradient norm to this; 0 = no clipping (norm still measured)."""
    exp_avg_dtype: str = "fp32"
    """Storage of AdamW's first moment: fp32, bf16, e4m3 (FP8, per-tensor scaled) or e5m2."""
    exp_avg_sq_dtype: str = "fp32"
    """Storage of AdamW's second moment: fp32, bf16, e4m3 or e5m2. The FP8 trillion-token
    study keeps the first moment in e4m3 and the second in e5m2."""

    def __post_init__(self) -> None:
        check_fields(self, section="optim")
        _one_of("optim", "name", self.name, ("adamw",))
        _one_of("optim", "exp_avg_dtype", self.exp_avg_dtype, STATE_DTYPES)
        _one_of("optim", "exp_avg_sq_dtype", self.exp_avg_sq_dtype, STATE_DTYPES)


EVAL_AUTO = -1
"""train.eval_every's default: validate on a schedule that fits the run's length."""
AUTO_EVAL_EVERY = 50
"""Auto: the interval of a long run (the interval trainlab always had)."""
AUTO_MIN_EVALS = 5
"""Auto: validations a short run gets at least (a curve, for a few eval_batches passes each)."""


@dataclass
class TrainConfig:
    """The loop: how long, how big, how often to evaluate and report."""

    max_steps: int = bounded(200, gt=0)
    """Optimizer steps to train."""
    global_batch_size: int = bounded(16, gt=0)
    """Sequences per optimizer step, summed over data-parallel ranks and micro-batches."""
    micro_batch_size: int = bounded(8, gt=0)
    """Sequences per forward/backward on one rank; accumulation = global / (micro * dp)."""
    seq_len: int = bounded(128, gt=0)
    """Tokens per sequence; at most model.max_seq_len."""
    eval_every: int = bounded(EVAL_AUTO, ge=EVAL_AUTO, note="-1 = auto, 0 = only at the end")
    """Validate every N optimizer steps (and after the last); 0 = only at the end; -1 (the
    default) = auto: every min(50, max(1, max_steps // 5)) steps, so a run of any length has a
    val curve (5 points at least; every step under 5 steps) and a long one validates every 50
    steps. Read `eval_interval`."""
    eval_batches: int = bounded(8, gt=0)
    """Micro-batches in one validation pass, summed over data-parallel ranks (each rank takes
    eval_batches // dp, at least 1), so the held-out set is the same whatever the layout."""
    log_every: int = bounded(1, gt=0)
    """Record metrics every N optimizer steps."""
    spike_factor: float = bounded(3.0, gt=0)
    """A loss above spike_factor x its running mean (after 10 steps) counts as a spike."""
    stop_on_nonfinite: bool = True
    """End the trial as `diverged` once a loss, activation or (unscaled) gradient is
    non-finite (no compute burned after a NaN)."""
    on_divergence: str = "stop"
    """What a diverged trial does: stop (end as `diverged`, resources freed at once), or
    rollback (go back to the last checkpoint, or to the start if there is none, and retry with
    the learning rate times rollback_lr_factor and/or in rollback_precision; the trial's run
    records each rollback)."""
    rollback_lr_factor: float = bounded(0.5, gt=0, le=1, note="1 = keep it")
    """on_divergence=rollback: each retry multiplies the learning rate (its whole schedule) by
    this, compounding over retries; 1 = keep it."""
    rollback_precision: str = ""
    """on_divergence=rollback: the higher precision to retry in (fp32, bf16 or fp16); empty =
    keep the trial's precision."""
    max_rollbacks: int = bounded(2, gt=0)
    """on_divergence=rollback: retries before the trial ends as `diverged` after all."""
    numerics_every: int = bounded(10, ge=0, note="0 = never")
    """Sample the numerics (per-layer amax, scale, underflow and overflow of every
    low-precision cast, SwiGLU outliers, update-to-weight ratio, grad-norm percentiles)
    every N optimizer steps; 0 = never. Costs one extra pass over the casts when sampled."""
    compile: str = "auto"
    """torch.compile the model: true, false, or auto = on CUDA GPUs for every mode that runs
    natively (FP8 pays only compiled: torch.compile fuses its casts; bf16 is compiled too, so
    the two compare fairly), off on CPU (slow to start) and for emulated casts. auto compiles
    each block (compile_unit=block) where the layout shards or splits the model. The trial's
    `compile` tag says what ran (engine.run.build_trainer decides, config.validate.compile_unit)."""
    compile_unit: str = "model"
    """What train.compile=true compiles: `model` (one graph, before any parallel wrapping; plain
    DDP / ZeRO-1 layouts) or `block` (each transformer block on its own, after tensor
    parallel and activation checkpointing and before FSDP2, as torchtitan does; every layout)."""
    deterministic: bool = False
    """Reproducible mode (engine.determinism): deterministic kernels
    (torch.use_deterministic_algorithms, cuDNN deterministic without autotuning,
    CUBLAS_WORKSPACE_CONFIG=:4096:8) and, with DDP, a fixed rank-order sum of the gradients
    instead of the backend's all-reduce. FSDP / tensor / pipeline collectives keep the
    backend's order (a warning says so). Costs throughput: see `trainlab bench determinism`."""
    checkpoint_every: int = bounded(100, ge=0, note="0 = only on SIGTERM")
    """Save a checkpoint (engine.checkpoint) every N optimizer steps; 0 = only on SIGTERM."""
    checkpoint_keep: int = bounded(2, gt=0)
    """Checkpoints kept on disk; older ones are deleted once a newer one is complete."""
    checkpoint_dir: str = ""
    """Where the trial's checkpoints go; empty = <output_dir>/checkpoints."""
    export: str = ""
    """hf: when the trial finishes, save the trained model as transformers' save_pretrained folder
    (config.json, model.safetensors, the tokenizer of data=hf) in <output_dir>/hf_model and log it
    to the trial's MLflow run (artifact hf_model/); needs model=hf. "" = no export."""
    resume: str = "auto"
    """auto: continue from the latest checkpoint in checkpoint_dir if there is one (a restarted
    worker, a rerun sweep); never: always start fresh (refused where checkpoint_dir holds another
    config's checkpoint: those are never replaced); or a path to a checkpoint (step_* folder) or
    to a folder of them. A resume may raise train.max_steps past the checkpoint's step."""

    @property
    def eval_interval(self) -> int:
        """Steps between validations as the trainer runs them (train.eval_every, auto resolved);
        0 = only after the last step."""
        if self.eval_every != EVAL_AUTO:
            return self.eval_every
        return max(1, min(AUTO_EVAL_EVERY, self.max_steps // AUTO_MIN_EVALS))

    def __post_init__(self) -> None:
        check_fields(self, section="train")
        self.compile = str(self.compile).lower()  # YAML and Hydra's true / false arrive as 'True' / 'False'
        _one_of("train", "compile", self.compile, COMPILE)
        _one_of("train", "compile_unit", self.compile_unit, COMPILE_UNITS)
        _one_of("train", "on_divergence", self.on_divergence, ON_DIVERGENCE)
        if self.export:
            _one_of("train", "export", self.export, EXPORTS)
        if self.rollback_precision:
            _one_of("train", "rollback_precision", self.rollback_precision, ROLLBACK_PRECISIONS)
        if (self.on_divergence == "rollback" and self.rollback_lr_factor == 1.0
                and not self.rollback_precision):
            raise ValueError("train.on_divergence=rollback with train.rollback_lr_factor=1 and no "
                             "train.rollback_precision would retry the same computation; lower the "
                             "factor (e.g. 0.5) or name a higher precision (e.g. train.rollback_precision=fp32)")


@dataclass
class ClusterConfig:
    """Where the gang of workers runs."""

    name: str = "local"
    """local: start a Ray cluster on this machine; ray: join cluster.address."""
    address: str = ""
    """Ray address (host:port of the GCS, or 'auto'); empty = start a local cluster."""
    num_workers: int = bounded(2, gt=0)
    """Workers in the trial's gang (= torch.distributed world size)."""
    device: str = "auto"
    """cpu, cuda, or auto (cuda when the cluster has GPUs, else cpu)."""
    cpus_per_worker: int = bounded(1, gt=0)
    """CPU cores reserved per worker; also its torch thread count."""
    start_timeout_s: float = bounded(10.0, gt=0, le=WAIT_MAX_S, why=WAIT_WHY)
    """Seconds to wait for a Ray address to answer before giving up with an error."""
    host: str = "127.0.0.1"
    """cluster=local: the address the local Ray cluster's services (GCS, raylet, workers) and its
    dashboard listen on. 127.0.0.1 = this machine only; set this node's IP to reach the dashboard
    and services from other machines, or 0.0.0.0 for the dashboard on every interface (Ray then
    picks the node IP for its services). Ignored when joining cluster.address."""
    accelerator_type: str = ""
    """GPU type the trial must run on, by Ray's name (H100, A100, V100, ...); empty = any type
    that can run the precision."""
    min_capability: str = ""
    """Lowest CUDA compute capability the trial accepts, MAJOR.MINOR (e.g. 8.9); empty = what
    the precision needs."""
    placement: str = "same_type"
    """How a gang may use a mixed cluster: same_type (every worker on one GPU type), pack (any
    eligible types, few nodes), spread (any eligible types, many nodes)."""
    max_failures: int = bounded(0, ge=0, note="0 = a failure ends the trial")
    """Worker failures (a process killed, a node lost) Ray Train survives per trial by
    restarting the gang from the last checkpoint; past it the trial ends failed."""
    min_workers: int = bounded(0, ge=0, le="num_workers", note="0 = a fixed gang; below num_workers = the "
                               "fewest workers an elastic trial goes on with")
    """Elastic data parallel: the fewest workers the trial goes on with; 0 = a fixed gang of
    num_workers. With 1 <= min_workers < num_workers, a trial that loses workers (a node lost)
    restarts from its last checkpoint on as many as Ray can place, down to min_workers, and
    grows back to num_workers when they return; the global batch (train.global_batch_size)
    is kept by more micro-batches per worker. Pure data parallel (parallel=ddp) only; each
    loss counts against max_failures, a grow-back does not."""
    resize_interval_s: float = bounded(60.0, gt=0, le=WAIT_MAX_S, why=WAIT_WHY)
    """Elastic only: how often, in seconds, a running gang below num_workers asks whether it can
    grow back (Ray Train's elastic_resize_monitor_interval_s, whose default 60 this keeps). A
    grow-back restarts the gang from its last checkpoint, so the steps since it run again."""
    # what `trainlab estimate` plans for (trainlab.estimate); none of these changes what is trained
    nodes: list[str] = field(default_factory=list)
    """The cluster to estimate for, one COUNTxTYPE per node by Ray's accelerator type names
    (e.g. [8xH100,8xH100]; [4xcpu] for CPU ranks; COUNT at most 1024); empty = the running cluster when
    cluster.address is set, else this machine. A launched trial is estimated on the devices it
    was placed on, whatever this says."""
    nvlink_gb_s: float = bounded(0.0, ge=0, note="0 = the GPU type's own")
    """Bandwidth between two GPUs of a node, GB/s per direction."""
    network_gb_s: float = bounded(0.0, ge=0, note="0 = the link model's default")
    """Bandwidth between nodes per GPU, GB/s per direction."""
    calibration: str = ""
    """A calibration JSON (`trainlab calibrate -o FILE`) whose efficiencies the estimate uses;
    empty = the defaults."""

    def __post_init__(self) -> None:
        check_fields(self, section="cluster")
        _one_of("cluster", "device", self.device, DEVICES)
        _one_of("cluster", "placement", self.placement, PLACEMENTS)
        if not self.host or any(c.isspace() or c == "/" for c in self.host):
            raise ValueError(f"cluster.host={self.host!r} is not an address to listen on; use 127.0.0.1 "
                             "(this machine only), this node's IP, or 0.0.0.0")
        # parse_node raises a ValueError naming cluster.nodes
        for item in self.nodes:
            parse_node(item)


@dataclass
class TrackingConfig:
    """Where results go."""

    name: str = "mlflow"
    """mlflow: an MLflow run per trial; none: no tracking (a JSONL file in the run dir)."""
    uri: str = ""
    """MLflow tracking URI; empty = $MLFLOW_TRACKING_URI if set, else sqlite:///mlflow.db
    in the working directory (MLflow's own default)."""
    experiment: str = text("trainlab", nonempty=True, max_bytes=500, why="the MLflow experiment's name")
    """MLflow experiment name."""
    run_name: str = text("", max_bytes=200, file_name=True, why="it names the trial's folder")
    """MLflow run name; empty = derived from model, precision and layout."""
    system_metrics: bool = True
    """Log MLflow system metrics (CPU, memory, GPU) on the trial's run."""
    flush_every_s: float = bounded(2.0, gt=0, le=WAIT_MAX_S, why=WAIT_WHY)
    """Background flush interval of batched metrics, seconds."""
    outage_buffer: int = bounded(100_000, gt=0)
    """Metric points held in memory while the MLflow server is unreachable; past it they go to
    the trial's spill file (<output_dir>/mlflow_spill.jsonl). Training never waits either way."""
    close_timeout_s: float = bounded(30.0, gt=0, le=WAIT_MAX_S, why=WAIT_WHY)
    """At a trial's end, seconds to wait for an unreachable MLflow server before leaving the
    held metrics in the spill file (deliver them later with `trainlab import-spill PATH`)."""
    detail: str = "summary"
    """summary: the per-layer (num/layers.*) and per-rank (rank/<r>/*) numbers go to the run's
    detail.parquet artifact only, the run's metrics stay the few dozen a person compares;
    full: they are metrics as well (thousands on a deep model)."""

    def __post_init__(self) -> None:
        check_fields(self, section="tracking")
        _one_of("tracking", "name", self.name, ("mlflow", "none"))
        _one_of("tracking", "detail", self.detail, DETAIL_LEVELS)


@dataclass
class RunConfig:
    """One training trial, as composed by Hydra from conf/config.yaml."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    """Test and benchmark instruments (faults to inject, devices to emulate): config.debug."""
    seed: int = bounded(0, ge=0, le=SEED_MAX, why=SEED_WHY)
    """Seed of model init and data order."""
    sweep_name: str = text("", max_bytes=200, why="it names the sweep's parent run")
    """Name of the sweep this trial belongs to (set by sweeps/sweep/<name>.yaml); in a multirun
    the parent MLflow run is named after it. Empty = tracking.experiment."""
    output_dir: str = ""
    """Where this trial writes files; empty = Hydra's run directory (or the cwd)."""

    def __post_init__(self) -> None:
        check_fields(self, recurse=False)  # the sections checked their own fields


GROUPS = ("model", "data", "parallel", "precision", "optim", "train", "cluster", "tracking")

_SCHEMAS = {
    "model": ModelConfig, "data": DataConfig, "parallel": ParallelConfig,
    "precision": PrecisionConfig, "optim": OptimConfig, "train": TrainConfig,
    "cluster": ClusterConfig, "tracking": TrackingConfig,
}


def register_configs() -> None:
    """Register the schemas so YAML options can name `/<group>_schema@_here_` in their defaults:
    at the top of the config tree, in no group, so none of them is a group's option. Once per
    ConfigStore (the app's import and the override check both call it: 0.15 s each)."""
    cs = ConfigStore.instance()
    if "run_schema.yaml" in cs.repo:
        return
    run, model = OmegaConf.structured(RunConfig), OmegaConf.structured(ModelConfig)
    # model.tp_plan's keys are the user's module paths: `model.tp_plan={layers.*.fc:colwise}` sets
    # new keys, which Hydra's struct mode (every key declared) would refuse; its values stay str
    for tp_plan in (run.model.tp_plan, model.tp_plan):
        OmegaConf.set_struct(tp_plan, False)
    cs.store(name="run_schema", node=run)
    for group, schema in _SCHEMAS.items():
        cs.store(name=f"{group}_schema", node=model if group == "model" else schema)
