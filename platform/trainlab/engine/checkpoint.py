"""Trial checkpoints: save every N steps (and on SIGTERM), resume exactly where a run stopped.

One checkpoint is one folder, ``<root>/step_00000100/``, holding what Trainer.state_dict()
returns (the trainer says what its state is; this module says where each part goes):

- the model and optimizer through torch.distributed.checkpoint (DCP): every rank writes its
  own shards in parallel (FSDP and tensor-parallel DTensors are saved sharded, DDP replicas
  once), under the model's parameter names;
  pipeline stages are keyed by their pipeline rank, since each rank holds different ones;
- ``rank_<r>.pt`` per rank: the state's `local` part, small and rank-local (LR schedule, loss
  scaler, data position, RNG states, the loop's counters and loss curve, a ZeRO-1 optimizer
  shard), tensors and plain values only, so it loads with ``torch.load(weights_only=True)``;
- ``trainlab.json`` (the manifest): step, world size, layout, precision and rollback (read
  before a trainer is built: they choose its precision), the config's hash and fields, and
  every file's size and SHA-256 (engine/integrity.py), written last.

Atomic: everything is written into ``step_XXXXXXXX.tmp/``; once every rank has finished
(a barrier), rank 0 renames it to its final name. A crash mid-write leaves a ``.tmp`` folder
that is never read and is removed at the next start, so the previous checkpoint stays the
latest; a save that fails (a full disk) removes its ``.tmp`` at once, on every rank's word.
Retention: rank 0 keeps the newest ``keep`` of the trial's own (its config hash) and deletes the rest of
those; a checkpoint of another config is never deleted or replaced (engine.checkpoint.owned).

The root must be storage every rank sees (one machine, or a shared file system).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Protocol

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from trainlab import names
from trainlab.config.checkpoints import (
    META_FILE,
    Checkpoint,
    CheckpointError,
    complete_checkpoints,
    latest_checkpoint,
    remove_unfinished_saves,
    start_over,
    step_dir,
)
from trainlab.distributed import gather_strings
from trainlab.engine import integrity
from trainlab.engine.resume import check_checkpoint
from trainlab.engine.rollback import Rollback
from trainlab.vocab.files import CONFIG_FILE_MAX_BYTES, read_text


class Checkpointable(Protocol):
    """What a checkpoint saves and restores: the engine's Trainer (its step, its config, and
    its whole state as state_dict() says; load_state_dict puts it back)."""

    step: int
    run: Any

    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...

FORMAT_VERSION = 2
"""2: files carry a SHA-256 and the manifest the config's fields and its own digest (1: sizes)."""


class CheckpointWriteError(RuntimeError):
    """A save that failed on some rank (a full disk, an I/O error); its partial files are gone."""


class Checkpointer:
    """Saves and loads a Trainer's whole state under `root` (see the module docstring)."""

    def __init__(self, root: Path, *, keep: int, rank: int, world_size: int, config_hash: str,
                 config: dict | None = None, shard_key: str = ""):
        self.root = Path(root)
        self.config_hash = config_hash
        """The trial's identity, written into every checkpoint: the hash of its config as
        launched, which stays the same when the trial resizes or rolls back at run time."""
        self.config = integrity.as_json(config) if config is not None else None
        """The fields that hash covers, as launched: a resume names those in which it differs."""
        self.keep = keep
        self.rank, self.world_size = rank, world_size
        self.shard_key = shard_key
        """Pipeline layouts: this rank's stages' key (each pipeline rank holds other modules)."""
        if rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            remove_unfinished_saves(self.root)  # a save that crashed: never complete
        _barrier()

    # -- save ------------------------------------------------------------------------------
    def save(self, trainer: Checkpointable) -> dict[str, float]:
        """Write a checkpoint of `trainer`'s state_dict() at its current step (a collective); returns the
        metrics ckpt/save_s, ckpt/size_mb and ckpt/checksum_s, the same on every rank.
        A rank that fails to write (a full disk) fails the save on every rank, together: the
        partial folder is removed and each raises CheckpointWriteError."""
        t0 = time.perf_counter()
        final = step_dir(self.root, trainer.step)
        tmp = final.with_name(final.name + ".tmp")
        together = _Together(self, tmp, trainer.step)
        together(lambda: tmp.mkdir(parents=True, exist_ok=True) if self.rank == 0 else None)

        state = trainer.state_dict()
        local = state.pop("local")

        def write() -> None:
            dcp.save(self._keyed(state), checkpoint_id=str(tmp))
            path = tmp / f"rank_{self.rank}.pt"
            torch.save(local, path)
            _fsync(path)

        together(write)  # every rank's shards and rank file are on disk
        t_sum = time.perf_counter()
        # each rank hashes its share of the folder's files (they are in the page cache now)
        names_here = sorted(p.name for p in tmp.iterdir() if p.is_file())
        shares = together(lambda: json.dumps(integrity.describe_files(
            tmp, integrity.share(names_here, rank=self.rank, world=self.world_size))))
        checksum_s = time.perf_counter() - t_sum
        files = dict(sorted((k, v) for part in shares for k, v in json.loads(part).items()))
        size = sum(f["bytes"] for f in files.values())

        def finish() -> None:
            if self.rank != 0:
                return
            meta = {"version": FORMAT_VERSION, "step": local["step"], "tokens_seen": local["tokens_seen"],
                    "world_size": self.world_size, "parallel": trainer.run.parallel.name,
                    "precision": local["precision"], "rollback": local["rollback"],
                    "layout_bound": not elastic_layout(trainer.run),
                    "config_hash": self.config_hash, "config": self.config, "time": time.time(),
                    "files": files}
            _write_synced(tmp / META_FILE, json.dumps(integrity.seal(meta), indent=1))
            if final.exists() and not owned(final, self.config_hash):  # never another trial's
                raise CheckpointError(f"{final} holds a checkpoint of another config; it is never replaced: "
                                      "give this trial its own train.checkpoint_dir")
            if final.exists():  # the same step again (a resumed run re-saving): replace it
                shutil.rmtree(final)
            os.replace(tmp, final)
            _fsync(self.root)
            retire(self.root, keep=self.keep, config_hash=self.config_hash)

        together(finish)
        return {names.CKPT_SAVE_S: time.perf_counter() - t0, names.CKPT_SIZE_MB: size / 2**20,
                names.CKPT_CHECKSUM_S: checksum_s}

    def _keyed(self, sharded: dict) -> dict:
        """The sharded state as DCP holds it: pipeline ranks under their stages' key."""
        return {self.shard_key: sharded} if self.shard_key else sharded

    # -- load ------------------------------------------------------------------------------
    def load(self, trainer: Checkpointable, ckpt: Checkpoint) -> None:
        """Put `trainer` back in the state it had at `ckpt` (its load_state_dict; a collective)."""
        meta = check_checkpoint(ckpt.path, world_size=self.world_size)
        state = trainer.state_dict()  # DCP loads into its tensors, in place
        del state["local"]
        try:
            dcp.load(self._keyed(state), checkpoint_id=str(ckpt.path))
        except (Exception, CheckpointException) as e:  # DCP's own errors are long and wrapped per rank
            raise CheckpointError(f"checkpoint {ckpt.path} could not be loaded into this model "
                                  f"({_reason(e)}); it was written "
                                  f"for another model or layout; resume with that config or {start_over(ckpt.path.parent)}") from e
        path = ckpt.path / f"rank_{self.rank}.pt"
        if not path.is_file():  # elastic: more ranks than wrote it; rank 0's holds the shared state
            path = ckpt.path / "rank_0.pt"
        local = torch.load(path, weights_only=True, map_location="cpu")
        # rank files written before the trainer's own state_dict lack these; the manifest has them
        local.setdefault("precision", meta.get("precision", trainer.run.precision.name))
        local.setdefault("rollback", meta.get("rollback"))
        trainer.load_state_dict({**state, "local": local})


class _Together:
    """One step of a save on every rank, then every rank's word on it (a collective that also
    stands for a barrier): if the step failed anywhere, rank 0 removes the partial folder and
    every rank raises the same CheckpointWriteError, so no rank waits for one that gave up."""

    def __init__(self, ckpt: Checkpointer, tmp: Path, step: int):
        self.ckpt, self.tmp, self.step = ckpt, tmp, step

    def __call__(self, fn: Callable[[], str | None]) -> list[str]:
        try:
            said = "ok:" + (fn() or "")
        except (Exception, CheckpointException) as e:
            said = f"failed:rank {self.ckpt.rank}: {_reason(e)}"
        heard = gather_strings(said)
        failed = [h.removeprefix("failed:") for h in heard if h.startswith("failed:")]
        if not failed:
            return [h.removeprefix("ok:") for h in heard]
        if self.ckpt.rank == 0:
            shutil.rmtree(self.tmp, ignore_errors=True)
        _barrier()  # the partial folder is gone before any rank reports
        last = latest_checkpoint(self.ckpt.root)
        free = shutil.disk_usage(self.ckpt.root).free / 2**30
        raise CheckpointWriteError(
            f"the checkpoint of step {self.step} could not be written to {self.tmp} "
            f"({'; '.join(failed)[:600]}); its partial files were removed (the latest complete checkpoint: "
            f"{last.path if last else 'none'}); the file system there has {free:.2f} GiB free: free space, "
            "or set train.checkpoint_dir to a larger one (train.checkpoint_every=0 saves none)")


def _reason(e: BaseException) -> str:
    """'Type: first line' of an error; for DCP's per-rank wrapper, of the first rank's error."""
    if isinstance(e, CheckpointException) and e.failures:
        e = next(iter(e.failures.values()))[0]
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {first[:300]}"


def owned(path: Path, config_hash: str) -> bool:
    """Whether the checkpoint folder `path` is the trial's of `config_hash` (its manifest says
    so): only those are ever deleted or replaced; another config's stay as they are."""
    try:
        text = read_text(path / META_FILE, field=META_FILE, fix="", max_bytes=CONFIG_FILE_MAX_BYTES)
        return json.loads(text).get("config_hash") == config_hash
    except (OSError, ValueError, AttributeError):  # InputFileError is a ValueError: not provably the trial's
        return False


def retire(root: Path, *, keep: int, config_hash: str) -> None:
    """Retention: delete this trial's checkpoints but its newest `keep` (never another config's)."""
    mine = [c for c in complete_checkpoints(root) if owned(c.path, config_hash)]
    for old in mine[:-keep] if keep > 0 else []:
        shutil.rmtree(old.path, ignore_errors=True)


def discard_after(root: Path, step: int, *, config_hash: str) -> None:
    """Delete this trial's checkpoints past `step`: a rollback to `step` abandons them (a restart
    or a later rollback must never land on the diverged attempt's timeline)."""
    for ckpt in complete_checkpoints(root):
        if ckpt.step > step and owned(ckpt.path, config_hash):
            shutil.rmtree(ckpt.path)


def rollback_of(ckpt: Checkpoint | None) -> Rollback:
    """The divergence rollbacks the trial had made when it wrote `ckpt` (none for None)."""
    if ckpt is None:
        return Rollback()
    text = read_text(ckpt.path / META_FILE, field=META_FILE, max_bytes=CONFIG_FILE_MAX_BYTES,
                     fix="resume from an earlier checkpoint or with train.resume=never")
    return Rollback.from_state(json.loads(text).get("rollback"))


def elastic_layout(run) -> bool:
    """Pure data parallel (DDP) with a replicated optimizer: the checkpoint does not depend
    on the number of workers, so a run may resume on fewer or more of them."""
    p = run.parallel
    return p.tp == 1 and p.pp == 1 and p.data_parallel == "ddp"


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
