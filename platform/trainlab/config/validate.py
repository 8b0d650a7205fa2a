"""Cross-field checks of a RunConfig: pure functions, no environment, no side effects.

Checks that need the trial's layout (its parallel degrees, accumulation, pipeline micro-batches)
are the plan's: trainlab.plan.derive_layout derives the layout once and refuses what cannot run.

Checks that need the machine (devices, paths, addresses, stores) live in
trainlab.launch.preflight, which runs before any Ray resource is reserved.
"""

from __future__ import annotations

import os
from urllib.parse import urlparse

from trainlab.config.bounds import check_fields
from trainlab.config.schema import HF_ONLY_FIELDS, PP_SCHEDULES, RunConfig
from trainlab.vocab.precision import ROLLBACK_PRECISIONS, SPECS, spec_of


def check_pp_layout(*, n_layers: int, pp: int, virtual_stages: int, n_microbatches: int,
                    schedule: str, hf: bool = False) -> None:
    """A pipeline's shape: schedule, degrees, equal-depth stages and the micro-batches the
    schedule needs; ValueError naming the fields and the fix. Checked before launch
    (plan.derive_layout.check_parallel) and again by trainlab.parallel.pp for direct callers."""
    if schedule not in PP_SCHEDULES:
        raise ValueError(f"parallel.pp_schedule={schedule!r} is not one of {', '.join(PP_SCHEDULES)}")
    for name, value in (("parallel.pp", pp), ("parallel.pp_virtual_stages", virtual_stages),
                        ("parallel.pp_microbatches", n_microbatches)):
        if value < 1:
            raise ValueError(f"{name}={value} must be >= 1")
    if virtual_stages > 1 and schedule != "interleaved_1f1b":
        raise ValueError(
            f"parallel.pp_virtual_stages={virtual_stages} needs parallel.pp_schedule=interleaved_1f1b "
            f"({schedule} runs one stage per rank); set parallel.pp_virtual_stages=1 or switch schedule"
        )
    num_stages = pp * virtual_stages
    if n_layers % num_stages:
        raise ValueError(
            f"model.n_layers={n_layers} does not split into parallel.pp={pp} x "
            f"parallel.pp_virtual_stages={virtual_stages} = {num_stages} stages of equal depth; "
            + (f"use a config.json whose num_hidden_layers divides by {num_stages} (model=hf takes model.n_layers "
               f"from it)" if hf else f"pick n_layers divisible by {num_stages}") + f" or a pp that divides {n_layers}"
        )
    # torch: Schedule1F1B raises below pp micro-batches (its warm-up alone needs pp - 1 of them
    # in flight); interleaved 1F1B runs max(1, m // pp) rounds and needs m divisible by them.
    if schedule == "1f1b" and n_microbatches < pp:
        raise ValueError(
            f"parallel.pp_schedule=1f1b needs parallel.pp_microbatches >= parallel.pp, got "
            f"{n_microbatches} < {pp}; raise parallel.pp_microbatches (the bubble shrinks too) or use gpipe"
        )
    if schedule == "interleaved_1f1b":
        rounds = max(1, n_microbatches // pp)
        if n_microbatches % rounds:
            raise ValueError(
                f"parallel.pp_schedule=interleaved_1f1b runs max(1, pp_microbatches // pp) = {rounds} "
                f"rounds; parallel.pp_microbatches={n_microbatches} is not a multiple of them "
                f"(parallel.pp={pp}); use a multiple of parallel.pp"
            )



def escapes_cwd(path: str) -> bool:
    """A relative path whose `..` parts lead out of the working directory (decided on the
    string, as the path is written: `~` counts as absolute)."""
    path = os.path.expanduser(path)
    if not path or os.path.isabs(path):
        return False
    norm = os.path.normpath(path)
    return norm == os.pardir or norm.startswith(os.pardir + os.sep)


def store_path(uri: str) -> str | None:
    """The file system location in an MLflow tracking URI (sqlite file, file store, plain
    path); None for a server."""
    if uri.startswith("sqlite:///"):
        return uri[len("sqlite:///"):]
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return parsed.path
    return uri if parsed.scheme == "" else None


def check_paths(run: RunConfig) -> None:
    """Relative paths stay inside the working directory: one that climbs out of it with `..`
    is refused (a typo as often as not, and a run must not write or read outside where it
    was started by accident); an absolute path says it means it and is allowed."""
    paths = [("output_dir", run.output_dir, run.output_dir)]
    if run.data.name == "tokens":
        paths.append(("data.path", run.data.path, run.data.path))
    if run.data.name == "hf":  # a Hub name (org/name) never starts with '..'
        paths += [(f"data.{f}", getattr(run.data, f), getattr(run.data, f)) for f in ("path", "tokenizer", "cache_dir")]
    if run.train.checkpoint_dir:
        paths.append(("train.checkpoint_dir", run.train.checkpoint_dir, run.train.checkpoint_dir))
    if run.train.resume not in ("auto", "never"):
        paths.append(("train.resume", run.train.resume, run.train.resume))
    if run.tracking.name == "mlflow" and run.tracking.uri:
        paths.append(("tracking.uri", run.tracking.uri, store_path(run.tracking.uri) or ""))
    for name, value, path in paths:
        if escapes_cwd(path):
            absolute = os.path.abspath(os.path.expanduser(path))
            written = {"sqlite": f"sqlite:///{absolute}", "file": f"file://{absolute}"}.get(
                urlparse(value).scheme, absolute)
            raise ValueError(
                f"{name}={value!r} leads out of the working directory through '..' "
                f"(to {absolute}); relative paths must stay inside it. If that location is "
                f"really meant, pass it as an absolute path: {name}={written}")


def check_rollback(run: RunConfig) -> None:
    """train.rollback_precision must be a higher precision (a lower vocab.precision rank) than
    the trial's own."""
    fallback, own = run.train.rollback_precision, run.precision.name
    if not fallback:
        return
    if fallback == own:
        raise ValueError(f"train.rollback_precision={fallback} is the trial's own precision; name a "
                         "higher one (fp32, or bf16 for fp16's overflows) or leave it empty")
    if SPECS[fallback].rank >= SPECS[own].rank:
        higher = [p for p in ROLLBACK_PRECISIONS if SPECS[p].rank < SPECS[own].rank]
        raise ValueError(f"train.rollback_precision={fallback} is not higher than precision={own}; a "
                         f"diverged trial retries with more range and precision: use "
                         f"{' or '.join(higher)}, or leave it empty to keep {own}")


def check_run(run: RunConfig) -> None:
    """Every check that needs several sections and no derived layout (the layout's checks are
    trainlab.plan.derive_layout.plan_layout's). Raises ValueError naming field, value and fix."""
    check_fields(run)  # every field's type and declared range, again: a config may be edited after it was built
    check_paths(run)
    check_rollback(run)
    check_debug(run)
    check_corpus_and_vocab(run)
    if run.train.seq_len > run.model.max_seq_len:
        raise ValueError(
            f"train.seq_len={run.train.seq_len} exceeds the context of model={run.model.name} "
            f"(model.max_seq_len={run.model.max_seq_len}); lower train.seq_len or raise "
            "model.max_seq_len" + (" (model=hf: max_position_embeddings of its config.json)"
                                   if run.model.name == "hf" else "")
        )
    check_hf_run(run)
    if run.cluster.name == "ray" and not run.cluster.address:
        raise ValueError(
            "cluster=ray needs cluster.address (HEAD:6379, or 'auto' inside a Ray job); "
            "use cluster=local to start a cluster on this machine"
        )


def ignored_options(run: RunConfig) -> list[str]:
    """Options set away from their defaults that the chosen modes do not use (warned about; the
    layout's own, plan.derive_layout.unordered_reductions, are warned beside them)."""
    from trainlab.config.schema import (
        DataConfig,
        ParallelConfig,
        PrecisionConfig,
        TrainConfig,
    )

    notes = []
    spec = spec_of(run.precision.name)
    if not spec.loss_scaling:
        fp16_fields = ("fp16_impl", "loss_scale", "init_scale", "growth_factor", "backoff_factor",
                       "growth_interval")
        changed = [f for f in fp16_fields if getattr(run.precision, f) != getattr(PrecisionConfig(), f)]
        if changed:
            notes.append(f"precision.{', precision.'.join(changed)} only apply to precision=fp16; "
                         f"ignored with precision={run.precision.name}")
    if run.precision.tf32 and not spec.tf32:
        notes.append(f"precision.tf32 only applies to precision=fp32; ignored with "
                     f"precision={run.precision.name}")
    if not spec.low_precision_layers:
        lowp_fields = ("fp8_impl", "hp_dtype", "keep_hp", "amax_history_len", "fp8_margin", "scaling")
        changed = [f for f in lowp_fields if getattr(run.precision, f) != getattr(PrecisionConfig(), f)]
        if changed:
            notes.append(f"precision.{', precision.'.join(changed)} only apply to fp8 and emulated "
                         f"modes; ignored with precision={run.precision.name}")
    if not spec.low_precision_params and run.precision.bf16_update != PrecisionConfig().bf16_update:
        notes.append(f"precision.bf16_update={run.precision.bf16_update} only applies to precision=bf16_pure "
                     f"(the other modes keep fp32 master weights); ignored with precision={run.precision.name}")
    p = run.parallel
    if p.dp_balance == "equal" and (p.dp_weights or p.dp_balance_warmup != ParallelConfig().dp_balance_warmup):
        notes.append("parallel.dp_weights and parallel.dp_balance_warmup only apply to parallel.dp_balance="
                     "weighted or accumulate; ignored with parallel.dp_balance=equal")
    if p.dp_balance != "equal" and p.dp_weights and p.dp_balance_warmup != ParallelConfig().dp_balance_warmup:
        notes.append("parallel.dp_balance_warmup is ignored when parallel.dp_weights is given "
                     "(nothing is measured)")
    t, default = run.train, TrainConfig()
    if t.on_divergence == "stop":
        changed = [f for f in ("rollback_lr_factor", "rollback_precision", "max_rollbacks")
                   if getattr(t, f) != getattr(default, f)]
        if changed:
            notes.append(f"train.{', train.'.join(changed)} only apply to train.on_divergence=rollback; "
                         "ignored with train.on_divergence=stop")
    if run.data.name not in ("tokens", "hf") and run.data.path:
        notes.append(f"data.path={run.data.path!r} is ignored with data={run.data.name}; "
                     "use data=tokens to train on a token file, data=hf on a dataset")
    data_default = DataConfig()
    if run.data.name != "hf":
        changed = [f for f in HF_ONLY_FIELDS if getattr(run.data, f) != getattr(data_default, f)]
        if changed:
            notes.append(f"data.{', data.'.join(changed)} only apply to data=hf; ignored with data={run.data.name}")
    elif run.data.vocab_size != data_default.vocab_size:
        notes.append("data.vocab_size is ignored with data=hf (the tokenizer's vocabulary is used)")
    if run.data.name == "text" and run.data.vocab_size != DataConfig().vocab_size:
        notes.append("data.vocab_size is ignored with data=text (byte-level, 256)")
    return notes


def check_debug(run: RunConfig) -> None:
    """The debug knobs against the sections they act on."""
    d, c = run.debug, run.cluster
    if d.logical_gpus and c.device == "cuda":
        raise ValueError("debug.logical_gpus=true computes on CPU but cluster.device=cuda; "
                         "set cluster.device=cpu (or auto), or drop debug.logical_gpus")
    if d.slowdown and len(d.slowdown) != c.num_workers:
        raise ValueError(f"debug.slowdown={list(d.slowdown)} has {len(d.slowdown)} factors for "
                         f"cluster.num_workers={c.num_workers}; give one per worker or [] for none")


# issue 28: refusals -- the corpus and the model's vocabulary, decided here (the driver's config layer),
# not first in the worker: data.markov and models.resolve_dims call the same checks.
TEXT_VOCAB_SIZE = 256
"""data=text's vocabulary: byte-level tokens (data.text)."""
MARKOV_MAX_VOCAB = 4096
"""data=markov: the transition matrix and its cumulative table take 16 * vocab_size**2 bytes (4096: 256 MiB)."""


def corpus_vocab(data) -> int:
    """The vocabulary of the corpus data.* names: text is byte-level; markov and tokens have
    data.vocab_size; hf: 0 here (unknown until its tokenizer is read: the driver's preflight checks it)."""
    if data.name == "hf":
        return 0
    return TEXT_VOCAB_SIZE if data.name == "text" else int(data.vocab_size)


def check_markov_states(vocab_size: int) -> None:
    """A Markov source needs 2 to MARKOV_MAX_VOCAB states."""
    if vocab_size > MARKOV_MAX_VOCAB:
        raise ValueError(
            f"data.vocab_size={vocab_size} is too large for data=markov: the transition "
            f"matrix would take {16 * vocab_size**2 / 2**30:.1f} GiB; "
            f"use data.vocab_size<={MARKOV_MAX_VOCAB}")
    if vocab_size < 2:
        raise ValueError(f"data.vocab_size={vocab_size}: a Markov source needs at least 2 states; "
                         "set data.vocab_size>=2")


def check_model_vocab(model_vocab: int, corpus: int, *, source: str = "") -> None:
    """model.vocab_size 0 takes the corpus's; a larger one pads the embedding; a smaller one would
    index past it (token ids run to corpus - 1)."""
    if 0 < model_vocab < corpus:
        raise ValueError(
            f"model.vocab_size={model_vocab} is smaller than the corpus vocabulary ({corpus}{source}): "
            f"its token ids would index past the embedding; set model.vocab_size=0 (use the corpus's) "
            f"or a value >= {corpus}")


def check_corpus_and_vocab(run: RunConfig) -> None:
    d = run.data
    if d.name == "markov":
        check_markov_states(d.vocab_size)
    check_vocab_fits(run.model, corpus_vocab(d), source=f", data={d.name}")


def check_vocab_fits(model, corpus: int, *, source: str) -> None:
    """The model's embedding holds every token id of a corpus of `corpus` ids (0: not known yet).
    A Hugging Face model's vocabulary is its config.json's: the fix is its own tokenizer."""
    if model.name == "hf":
        if model.vocab_size < corpus:
            raise ValueError(
                f"the model's vocabulary (vocab_size={model.vocab_size} in its config.json) is smaller than "
                f"the corpus vocabulary ({corpus}{source}): token ids would index past its embedding; "
                "train it on text tokenized by its own tokenizer (data=hf data.tokenizer=MODEL_DIR)")
        return
    check_model_vocab(model.vocab_size, corpus, source=source)


def check_hf_run(run: RunConfig) -> None:
    """What a Hugging Face model (model=hf) needs of the other sections."""
    m = run.model
    if run.train.export and m.name != "hf":
        raise ValueError(f"train.export={run.train.export} saves a Hugging Face model; model={m.name} is "
                         "trainlab's own: use model=hf model.config=... (or drop train.export)")
    if m.name == "hf" and m.sliding_window and run.train.seq_len > m.sliding_window:
        raise ValueError(
            f"train.seq_len={run.train.seq_len} is longer than the model's sliding attention window "
            f"({m.sliding_window} tokens, config.json sliding_window); trainlab attends to the whole "
            f"sequence, so the model would see more than it was made for: set train.seq_len<={m.sliding_window}")

