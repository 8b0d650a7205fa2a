"""Checks that need the machine, run on the driver before any Ray resource is reserved.

Each raises ConfigError naming the field, the value and the fix, so a bad run fails in a
second instead of after workers have started (or hanging on an unreachable address).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import torch

from trainlab.config import ConfigError, RunConfig, config_hash, ignored_options
from trainlab.config.export_target import check_export_target
from trainlab.config.folders import check_run_folders
from trainlab.config.schema import PrecisionConfig
from trainlab.config.validate import check_vocab_fits
from trainlab.console import warn
from trainlab.data.batches import num_windows
from trainlab.data.build_corpus import corpus_vocab_size
from trainlab.data.corpus import split_point
from trainlab.data.hf_corpus import prepare_hf
from trainlab.data.token_file import open_token_file
from trainlab.devices import resolve_device
from trainlab.estimate.calibration import load_calibration
from trainlab.estimate.fit_check import checked_estimate, estimate_run, local_cluster, size_refusal
from trainlab.estimate.hardware import host_memory_gb
from trainlab.launch.interfaces import check_listen_host
from trainlab.launch.paths import shared_storage_notes
from trainlab.plan.derive_layout import plan_layout, unordered_reductions
from trainlab.precision.capability import check_precision_on_gpu, check_precision_supported
from trainlab.tracking.store import resolve_tracking_uri, tracking_field
from trainlab.tracking.store_check import check_experiment, check_sqlite_uri, check_tracking_uri
from trainlab.vocab.files import read_text
from trainlab.vocab.precision import emulates

if TYPE_CHECKING:
    from trainlab.estimate.result import Estimate

STORE_ELSEWHERE = "set tracking.uri to another store (or tracking=none)"
DEFAULT_GCS_PORT = 6379
DEFAULT_CLIENT_PORT = 10001
LOCAL_CPU_OVERSUBSCRIPTION = 2
"""Workers' CPUs a local Ray cluster accepts per core of this machine: 4 gloo ranks on 2 cores
train (slowly); 64 on 2 started 62 workers and reached no step."""


def ray_address_file() -> Path:
    """Where `ray start` records its cluster's GCS address on this node, and where Ray's
    address='auto' reads it (ray._common.utils.get_ray_address_file): under $RAY_TMPDIR, else
    $TMPDIR, else /tmp. A cluster killed rather than stopped leaves the file behind."""
    base = os.environ["RAY_TMPDIR"] if "RAY_TMPDIR" in os.environ else os.environ.get("TMPDIR", "/tmp")
    return Path(base) / "ray" / "ray_current_cluster"


@dataclass(frozen=True)
class TrialChecks:
    """What a trial's checks found before anything of it started, handed to its plan
    (launch.plan.plan_launch) so that nothing of it is checked or estimated twice."""

    device: str
    """check_device's: cpu or cuda; 'auto' on a joined cluster (resolved against its resources
    once connected: launch.plan)."""
    estimate: Estimate | None = None
    """check_fits_here's, on this machine (a local cluster): the plan's estimate; None where none
    was made here (a joined cluster, or one that could not be made: warned)."""


def preflight(run: RunConfig, *, tracking_uri: str | None, services: bool = True,
              swept: TrialChecks | None = None) -> TrialChecks:
    """Run every environment check; returns what they found (its device: 'cpu' or 'cuda'; 'auto'
    for a joined cluster, resolved against its resources once connected: launch.plan).
    `services=False`: the cluster and the tracking store were checked (check_sweep_services).
    `swept`: a sweep's trial, whose gang, data, device and memory the sweep checked with every
    other trial's before the first started (check_sweep_services, check_sweep_trials): not again."""
    try:
        if swept is None:
            check_gang_cpus(run)
        check_run_folders(output_dir=run.output_dir, checkpoint_dir=run.train.checkpoint_dir)
        check_export_target(run, trial_hash=config_hash(run))
        if swept is None:
            check_data(run)
        load_calibration(run.cluster.calibration)  # the file the user named, read as the estimate will
        device = swept.device if swept else check_device(run)
        check_size_here(run, device)  # from the config's arithmetic, before anything below builds the model
        check_module_names(run)
        check_layout(run)
        checks = swept or TrialChecks(device, estimate=check_fits_here(run, device))
        if device != "auto":
            check_comm_backend(run, device)
        if services:
            check_cluster(run)
        if tracking_uri is not None and services:
            field = tracking_field(run.tracking.uri)
            check_tracking_uri(tracking_uri, setting=field)
            check_sqlite_uri(tracking_uri, field=field, elsewhere=STORE_ELSEWHERE)
            check_store_state(tracking_uri, run)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    for note in ignored_options(run) + unordered_reductions(run) + shared_storage_notes(run):
        warn(note)
    return checks


def check_sweep_services(runs: list[RunConfig]) -> None:
    """What a sweep's driver reaches before any trial's preflight: its Ray cluster and its
    tracking store, each distinct one once, before the parent run opens or Ray starts."""
    seen = set()
    try:
        # every trial's gang fits the local cluster: one that cannot refuses the sweep
        refused = next((why for why in gang_refusals(runs) if why), "")
        if refused:
            raise ValueError(refused)
        for run in runs:
            key = (run.cluster.address, run.cluster.host, run.tracking.name, run.tracking.uri, run.tracking.experiment)
            if key in seen:
                continue
            seen.add(key)
            check_cluster(run)
            if run.tracking.name == "mlflow":
                uri, field = resolve_tracking_uri(run.tracking.uri), tracking_field(run.tracking.uri)
                check_tracking_uri(uri, setting=field)
                check_sqlite_uri(uri, field=field, elsewhere=STORE_ELSEWHERE)
                check_store_state(uri, run)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def check_store_state(uri: str, run: RunConfig) -> None:
    """The trial's experiment not deleted in the store (a store not made yet holds none; the
    driver makes it after the checks: tracking.store.ensure_store)."""
    check_experiment(uri, run.tracking.experiment)


def check_data(run: RunConfig) -> None:
    """A token file is read as the workers will read it (size against data.token_dtype, ids
    against data.vocab_size, scanned in bounded chunks); a data=hf dataset and tokenizer are
    checked (a Hub name, a missing or wrong-kind path refused) and tokenized into the cache; every
    corpus whose length is known here must hold a global batch of sequences for training and a
    batch per rank for validation."""
    d = run.data
    if d.name == "tokens":
        path = str(Path(d.path).expanduser())
        num_tokens = len(open_token_file(path, dtype=d.token_dtype, vocab_size=d.vocab_size))
        check_corpus_length(run, num_tokens=num_tokens, source=f"data.path={d.path!r}")
    elif d.name == "hf":
        # tokenized here, once, into data.cache_dir: the gang's workers find it made
        cached = prepare_hf(d)
        check_vocab_fits(run.model, cached.vocab_size, source=f", data.tokenizer={d.tokenizer!r}")
        check_corpus_length(run, num_tokens=len(cached.tokens), source=f"data.path={d.path!r}")
    elif d.name == "markov":
        check_markov_memory(run)
    if run.model.name == "hf":  # its config, architecture and weights (headers against shapes), before Ray
        from trainlab.models.hf_checks import check_hf_model

        check_hf_model(run.model)
    if run.model._target_:  # your own builder: imported and built on the meta device here, not first in the gang
        from trainlab.models import build_model

        with torch.device("meta"):
            build_model(run.model, vocab_size=model_vocab(run), shapes_only=True)
    if run.model.pretrained:
        check_corpus_length(run, num_tokens=d.num_tokens, source=f"data.num_tokens={d.num_tokens}")


MARKOV_COPIES = 2
"""Copies of its token stream a worker holds while it generates the Markov corpus (data.markov:
the chains, then the stream read chain after chain)."""


def check_markov_memory(run: RunConfig) -> None:
    """Every worker of a local cluster generates the Markov corpus in its own memory: together they
    must leave this host half its memory (for the model and everything else it runs)."""
    if run.cluster.address:
        return  # a joined cluster's workers generate it on their own nodes
    d, workers = run.data, run.cluster.num_workers
    per_token = (1 if d.vocab_size <= 256 else 2) * MARKOV_COPIES * workers  # data.markov: uint8 up to 256 states
    host = host_memory_gb() * 1e9
    if d.num_tokens * per_token <= host / 2:
        return
    most = int(host / 2 // per_token)
    raise ValueError(
        f"data.num_tokens={d.num_tokens}: generating the markov corpus takes {d.num_tokens * per_token / 1e9:,.1f} GB "
        f"on this machine ({workers} workers, each its own copy), which holds {host / 1e9:,.1f} GB; "
        f"lower it to data.num_tokens={most} at most (half this machine's memory)")


def check_corpus_length(run: RunConfig, *, num_tokens: int, source: str) -> None:
    """The corpus split as the engine splits it holds enough windows of train.seq_len + 1."""
    t, dims = run.train, plan_layout(run).dims
    n_train = split_point(num_tokens=num_tokens, val_fraction=run.data.val_fraction, source=source)
    train_windows = num_windows(n_train, t.seq_len)
    if train_windows < t.global_batch_size:
        raise ValueError(
            f"{source} holds {num_tokens} tokens: its train split ({n_train} tokens) makes "
            f"{train_windows} sequences of train.seq_len={t.seq_len}, fewer than one step's "
            f"train.global_batch_size={t.global_batch_size}; use a longer corpus or lower "
            "train.seq_len or train.global_batch_size")
    per_round = t.micro_batch_size * dims.dp
    val_windows = num_windows(num_tokens - n_train, t.seq_len)
    if val_windows < per_round:
        raise ValueError(
            f"{source} holds {num_tokens} tokens: its val split (data.val_fraction="
            f"{run.data.val_fraction}, {num_tokens - n_train} tokens) makes {val_windows} sequences "
            f"of train.seq_len={t.seq_len}, fewer than one batch on every rank (train.micro_batch_size "
            f"x dp = {per_round}); raise data.val_fraction, lower train.seq_len or "
            "train.micro_batch_size, or use a longer corpus")


def check_module_names(run: RunConfig) -> None:
    """Names that refer to the model's modules (precision.keep_hp globs, debug.inject_nan)
    must exist in it: built on the meta device, so no memory and no time."""
    if not run.debug.inject_nan and run.precision.keep_hp == PrecisionConfig().keep_hp:
        return
    from trainlab.models import build_model
    from trainlab.precision.policy import check_keep_hp
    from trainlab.telemetry.nonfinite import injection_target

    with torch.device("meta"):
        model = build_model(run.model, vocab_size=model_vocab(run))
    check_keep_hp(model, run.precision.keep_hp)
    if run.debug.nan_injection is not None:
        injection_target(model, run.debug.nan_injection[0])


def model_vocab(run: RunConfig) -> int:
    """The model's vocabulary for shape checks: model.vocab_size, else the corpus's (data=hf: its
    tokenizer's, from the cache check_data filled), else 256."""
    if run.model.vocab_size:
        return run.model.vocab_size
    return corpus_vocab_size(run.data) if run.data.name == "hf" else run.data.vocab_size or 256


def check_size_here(run: RunConfig, device: str) -> None:
    """A model no layout can fit on a cluster started on this machine, refused from its config's
    arithmetic (estimate.fit_check.size_refusal: milliseconds) before check_module_names,
    check_layout or the estimate build it on the meta device (minutes for 100,000 layers)."""
    if run.cluster.address or device == "auto":
        return
    why = size_refusal(run, local_cluster(run, device=device), trial_layout=plan_layout(run))
    if why:
        raise ConfigError(why)


def check_fits_here(run: RunConfig, device: str) -> Estimate | None:
    """A trial on a cluster started on this machine fits its memory (the host's RAM shared by
    its CPU ranks, or its GPUs), by the same estimate and rule the plan applies
    (estimate.fit_check.checked_estimate): refused here, before Ray or any worker, with the
    numbers and the fix. Returns the estimate, which the plan takes as it is (None: it could not
    be made, warned here). A joined cluster's nodes are only known once joined (launch.plan): None."""
    if run.cluster.address or device == "auto":
        return None
    return checked_estimate(run, lambda: estimate_run(run, local_cluster(run, device=device),
                                                      trial_layout=plan_layout(run)),
                            warn=warn)


def sweep_refusal(lines: list[str]) -> ConfigError:
    """A sweep refused whole: one line per trial that cannot run ('#3 (k=v): why')."""
    return ConfigError("the sweep has trials that cannot run; nothing was started:\n  " + "\n  ".join(lines))


def check_sweep_trials(runs: list[RunConfig], labels: list[str]) -> list[TrialChecks]:
    """Every trial of a sweep has its data and fits this machine (check_data, check_fits_here) before its parent run opens or
    Ray starts: a sweep holding a trial that cannot run is refused whole, naming each such trial.
    Returns what was found of each, for its plan (launch.plan.plan_launch, `swept`)."""
    errors, found = [], []
    for run, label in zip(runs, labels):
        try:
            check_data(run)
            check_export_target(run, trial_hash=config_hash(run))
            device = check_device(run)
            found.append(TrialChecks(device, estimate=check_fits_here(run, device)))
        except (ValueError, ConfigError) as e:
            errors.append(f"{label}: {e}")
    if errors:
        raise sweep_refusal(errors)
    return found


def check_layout(run: RunConfig) -> None:
    """What the model's shape and the backend decide about a layout: tensor-parallel
    divisibility of heads and MLP width, and the gradient communication the backend can run.
    With model.tp_plan, the plan against the model's own modules (built on the meta device)."""
    p = run.parallel
    if p.tp > 1 and run.model.tp_plan:
        from trainlab.models import build_model
        from trainlab.parallel.tp import check_user_plan

        with torch.device("meta"):
            model = build_model(run.model, vocab_size=model_vocab(run), shapes_only=True)
        check_user_plan(model, run.model.tp_plan, p.tp, seq_len=run.train.seq_len)
    elif p.tp > 1:
        from trainlab.models import resolve_dims
        from trainlab.parallel.tp import check_tp

        check_tp(resolve_dims(run.model, vocab_size=model_vocab(run)), p.tp)


def check_comm_backend(run: RunConfig, device: str) -> None:
    """The gradient communication of parallel.comm_dtype / powersgd_rank runs on the backend
    of the trial's resolved `device` (the bf16 compression hook needs NCCL)."""
    p = run.parallel
    if p.comm_dtype != "fp32" or p.powersgd_rank:
        from trainlab.distributed import backend_for
        from trainlab.parallel.comm import check_comm

        check_comm(p.comm_dtype, p.powersgd_rank, backend_for(device))


def check_device(run: RunConfig) -> str:
    """Resolve cluster.device for a local cluster and check the precision runs on it.

    For a remote cluster the GPUs are not visible here; the check runs on the workers.
    """
    want = run.cluster.device
    local = not run.cluster.address
    has_cuda = torch.cuda.is_available()
    if want == "auto" and not local:
        return "auto"  # resolved against the cluster's resources once connected
    device = resolve_device(want, gpus=has_cuda, logical_gpus=run.debug.logical_gpus)
    if device == "cuda" and local and not has_cuda:
        raise ValueError("cluster.device=cuda but this machine has no CUDA GPU visible to torch; "
                         "use cluster.device=cpu (or auto)")
    if device == "cuda" and local:
        cap = torch.cuda.get_device_capability(0)
        check_precision_on_gpu(run.precision, capability=cap, device_name=torch.cuda.get_device_name(0))
        if run.train.rollback_precision:  # a retry must be able to run where the trial runs
            check_precision_on_gpu(PrecisionConfig(name=run.train.rollback_precision), capability=cap,
                                   device_name=torch.cuda.get_device_name(0))
        if run.cluster.num_workers > torch.cuda.device_count():
            raise ValueError(
                f"cluster.num_workers={run.cluster.num_workers} but this machine has "
                f"{torch.cuda.device_count()} GPU(s); lower cluster.num_workers or join a cluster"
            )
    else:
        check_precision_supported(run.precision.name, device=device,
                                  emulated=emulates(run.precision, device_type=device))
        if run.train.rollback_precision:
            check_precision_supported(run.train.rollback_precision, device=device)
    return device


def check_gang_cpus(run: RunConfig, *, cluster_cpus: float | None = None) -> None:
    """The gang's CPUs (cluster.num_workers x cluster.cpus_per_worker) fit the cluster: the local
    one Ray starts on this machine (LOCAL_CPU_OVERSUBSCRIPTION per core), or `cluster_cpus`, a
    joined cluster's (launch.plan, once connected). ValueError with both numbers and the fix."""
    c = run.cluster
    if cluster_cpus is None:
        if c.address:
            return  # a joined cluster's CPUs are known once connected
        cores = os.cpu_count() or 1
        cluster_cpus, where = cores * LOCAL_CPU_OVERSUBSCRIPTION, (
            f"the local Ray cluster on this machine takes {cores * LOCAL_CPU_OVERSUBSCRIPTION} "
            f"({cores} cores, {LOCAL_CPU_OVERSUBSCRIPTION} per core at most)")
    else:
        where = f"the Ray cluster at cluster.address={c.address} has {cluster_cpus:g}"
    need = c.num_workers * c.cpus_per_worker
    if need <= cluster_cpus:
        return
    fixes = []
    if cluster_cpus // c.cpus_per_worker >= 1:
        fixes.append(f"cluster.num_workers={int(cluster_cpus // c.cpus_per_worker)} or fewer")
    if c.cpus_per_worker > 1 and cluster_cpus // c.num_workers >= 1:
        fixes.append(f"cluster.cpus_per_worker={int(cluster_cpus // c.num_workers)} or fewer")
    fixes.append("a larger cluster (cluster=ray cluster.address=HEAD:6379)" if not c.address
                 else "a larger cluster")
    raise ValueError(f"cluster.num_workers={c.num_workers} x cluster.cpus_per_worker={c.cpus_per_worker} "
                     f"needs {need} CPUs, but {where}; use {', or '.join(fixes)}")


def gang_refusals(runs: list[RunConfig], *, cluster_cpus: float | None = None) -> list[str]:
    """check_gang_cpus's refusal of each run's gang ('' where it fits), each gang shape (its
    cluster, cluster.num_workers, cluster.cpus_per_worker) checked once however many trials share it."""
    by_shape: dict[tuple, str] = {}
    refusals = []
    for run in runs:
        c = run.cluster
        shape = (c.address, c.num_workers, c.cpus_per_worker)
        if shape not in by_shape:
            try:
                check_gang_cpus(run, cluster_cpus=cluster_cpus)
                by_shape[shape] = ""
            except ValueError as e:
                by_shape[shape] = str(e)
        refusals.append(by_shape[shape])
    return refusals


def check_cluster(run: RunConfig) -> None:
    """Where Ray will be: cluster.address answers within cluster.start_timeout_s, or a local
    cluster's cluster.host is an address of this machine. Either would otherwise hang in ray.init."""
    if run.cluster.address:
        check_ray_address(run.cluster.address, timeout_s=run.cluster.start_timeout_s)
    else:
        check_listen_host(run.cluster.host)


def _host_port(address: str, *, source: str) -> tuple[str, int]:
    parsed = urlparse(address if "://" in address else f"gcs://{address}")
    if parsed.scheme in ("http", "https"):
        raise ValueError(
            f"{source} is a dashboard/Jobs API URL; trainlab train joins "
            f"the cluster's GCS: use HEAD:{DEFAULT_GCS_PORT} (or submit with `ray job submit "
            f"--address {address} -- trainlab train cluster=ray`)"
        )
    try:
        port = parsed.port or (DEFAULT_CLIENT_PORT if parsed.scheme == "ray" else DEFAULT_GCS_PORT)
    except ValueError:  # 'HEAD:abc', a port past 65535
        port = None
    host = parsed.hostname or "127.0.0.1"
    if port is None or any(c.isspace() for c in address) or parsed.scheme not in ("gcs", "ray"):
        raise ValueError(f"{source} is not a Ray address; give HEAD:{DEFAULT_GCS_PORT} (the head's GCS), "
                         "ray://HEAD:10001, or auto (the cluster `ray start` runs on this node)")
    return host, port


def _auto_address() -> tuple[str, str]:
    """What Ray's address='auto' joins, and where that came from: RAY_ADDRESS, else the address
    `ray start` recorded on this node."""
    env = os.environ.get("RAY_ADDRESS", "")
    if env and env != "auto":  # Ray reads RAY_ADDRESS=auto as no address at all
        return env, f"cluster.address='auto' (from RAY_ADDRESS={env!r})"
    recorded = ray_address_file()
    try:  # Ray's own small file; anything else there (a FIFO, a device) is no address
        address = read_text(recorded, field="Ray's address file", fix="", max_bytes=4096).strip()
    except (OSError, ValueError):
        address = ""
    if not address:
        raise ValueError(
            "cluster.address='auto' but no Ray cluster runs on this node (no RAY_ADDRESS, "
            f"no `ray start`: {recorded} is absent); start one with `ray start --head`, give "
            "cluster.address=HEAD:6379, or use cluster=local")
    return address, f"cluster.address='auto' (the cluster `ray start` recorded in {recorded}: {address!r})"


def check_ray_address(address: str, *, timeout_s: float) -> None:
    """Fail fast (not hang: ray.init retries for minutes) when nothing listens at the Ray
    address, the one 'auto' stands for included; waits at most timeout_s."""
    source = f"cluster.address={address!r}"
    if address == "auto":
        address, source = _auto_address()
    host, port = _host_port(address, source=source)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as e:
        why = f"no answer within cluster.start_timeout_s={timeout_s:g} s" if isinstance(e, TimeoutError) else (
            e.strerror or str(e))
        raise ValueError(
            f"{source}: nothing answers at {host}:{port} ({why}); start the head with "
            "`ray start --head` (a cluster killed without `ray stop` leaves its address behind), "
            "fix the address, or leave cluster.address empty (cluster=local) to start a cluster "
            "on this machine"
        ) from None
