"""Which checkpoint a trial resumes from, and whether it may: intact and this trial's.

The driver calls resolve_resume before any worker starts, reading every file back against the
digest its manifest recorded at save (engine/integrity.py); the workers resolve again, together
(agreed_resume: each rank reads its share of the files, rank 0 decides), because under torchrun
there is no driver and a restarted gang resumes from checkpoints the driver never saw.

What a user gets:
- a step_* folder named in train.resume that is damaged (a file missing, of another size, of
  other content, a corrupt manifest) is refused, naming the file, and suggesting the newest
  earlier checkpoint beside it that has all its files;
- train.resume=auto, or a folder of checkpoints, goes back to the newest intact one, saying
  which one was damaged, and is refused only when none is (a damaged checkpoint is never
  skipped silently, and never loaded);
- a checkpoint another config wrote is refused naming the fields that differ, checkpoint's
  value vs this trial's, and the overrides that continue it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from trainlab.config.checkpoints import (
    _STEP_DIR,
    META_FILE,
    Checkpoint,
    CheckpointError,
    complete_checkpoints,
    start_over,
)
from trainlab.config.moved import upgraded
from trainlab.distributed import gather_strings
from trainlab.engine import integrity
from trainlab.vocab.files import CONFIG_FILE_MAX_BYTES, InputFileError, read_text

Verify = Callable[[Path, dict], list[str]]
"""(checkpoint folder, its manifest's files) -> what is wrong with those whose content differs
from their digest at save (one phrase each)."""
Warn = Callable[[str], None]


def resolve_resume(resume: str, root: Path, *, expect_hash: str | None = None,
                   expect_config: dict | None = None, verify: Verify | None = None,
                   warn: Warn | None = None) -> Checkpoint | None:
    """train.resume: `auto` = the latest checkpoint under the trial's checkpoint folder if
    there is one; `never`; or a path to a checkpoint (a step_* folder) or to a folder of them.
    An explicit path that holds no usable checkpoint is an error, never a fresh start.

    Damage (a file missing, of another size or, with `verify`, of other content than at save):
    a step_* folder named is refused; `auto` and a folder of checkpoints go back to the newest
    intact one, saying so through `warn`, and are refused only when none is intact.
    Another trial's checkpoint is refused naming the config fields that differ from
    `expect_config` (the trial's hashed fields). A manifest without fields (format 1) is
    compared by `expect_hash`, with `auto` only, as before."""
    if resume == "never":  # a start-over: never where another config's checkpoints would be replaced
        _refuse_foreign(root, expect_hash=expect_hash, expect_config=expect_config)
        return None
    named = False
    if resume == "auto":
        candidates = complete_checkpoints(root)
    else:
        path = Path(resume).expanduser()
        m = _STEP_DIR.match(path.name)
        if m:
            candidates, named = [Checkpoint(path, int(m.group(1)))], True
        else:
            candidates = complete_checkpoints(path) if path.is_dir() else []
            if not candidates:
                raise CheckpointError(f"train.resume={resume!r} holds no complete checkpoint (no step_* "
                                      f"folder with {META_FILE}); give a checkpoint folder, or "
                                      "train.resume=auto, or train.resume=never to start afresh")
    found, meta = _newest_intact(candidates, named=named, verify=verify, warn=warn)
    if found is not None:
        _check_same_trial(found.path, meta, auto=resume == "auto", expect_hash=expect_hash,
                          expect_config=expect_config, step=found.step, warn=warn)
    return found


def _newest_intact(candidates: list[Checkpoint], *, named: bool, verify: Verify | None,
                   warn: Warn | None) -> tuple[Checkpoint | None, dict]:
    damaged: list[DamagedCheckpoint] = []
    for ckpt in reversed(candidates):
        try:
            meta = check_checkpoint(ckpt.path, verify=verify)
        except DamagedCheckpoint as e:
            if named:
                raise
            damaged.append(e)
            continue
        if damaged and warn is not None:
            warn(f"checkpoint {damaged[0].path} {damaged[0].problem}"
                 + (f" (and {len(damaged) - 1} more damaged)" if len(damaged) > 1 else "")
                 + f"; resuming from {ckpt.path} (step {ckpt.step}), the newest intact one, instead; "
                 "the damaged ones stay in place until later saves replace them")
        return ckpt, meta
    if damaged:
        newest = damaged[0]
        raise CheckpointError(f"checkpoint {newest.path} {newest.problem}, and no earlier checkpoint "
                              f"beside it is intact ({len(damaged)} checked); start over with "
                              f"{start_over(newest.path.parent)} (the damaged ones stay where they are) or "
                              "give an intact one as train.resume=PATH")
    return None, {}


EXTENDS = "train.max_steps"
"""The one field a resume may change: a longer run (its learning-rate schedule then decays to
the new end), never one that ends at or before the checkpoint's step."""


def _check_same_trial(path: Path, meta: dict, *, auto: bool, expect_hash: str | None,
                      expect_config: dict | None, step: int = 0, warn: Warn | None = None) -> None:
    """Refuse another trial's checkpoint, naming the fields that differ (checkpoint vs trial);
    a run extended past the checkpoint (EXTENDS) is the same trial going on."""
    saved = meta.get("config")
    if isinstance(saved, dict) and expect_config is not None:
        # fields a checkpoint written before a key moved (or a value went) recorded, as they are now
        diffs = integrity.config_differences(upgraded(saved), expect_config)
        extended = [d for d in diffs if d[0] == EXTENDS]
        diffs = [d for d in diffs if d[0] != EXTENDS]
        if not diffs and extended:
            _, was, now = extended[0]
            if not isinstance(now, int) or now <= step:
                raise CheckpointError(f"{EXTENDS}={now} ends at or before step {step} of checkpoint {path} "
                                      f"(it was written by a run of {EXTENDS}={was}); to go on from it, give "
                                      f"{EXTENDS} greater than {step} (e.g. {EXTENDS}={was})")
            if warn is not None:
                warn(f"resuming {path} (step {step}) with {EXTENDS}={now} (the run that wrote it had {was}): "
                     "the learning-rate schedule decays to the new end from here")
            return
        if not diffs:
            return
        said, fix = integrity.describe_differences(diffs)
        if auto:
            raise CheckpointError(f"train.resume=auto found {path}, written by another config ({said}: "
                                  "checkpoint vs this trial); give this trial its own folder: "
                                  f"{start_over(path.parent)}")
        raise CheckpointError(f"checkpoint {path} was written by another config ({said}: checkpoint vs this "
                              f"trial); to continue it, run with {fix}; or start this trial afresh with "
                              f"{start_over(path.parent)}")
    if auto and expect_hash is not None and meta.get("config_hash") != expect_hash:
        raise CheckpointError(
            f"train.resume=auto found {path}, written by another config (config hash "
            f"{meta.get('config_hash')}, this one {expect_hash}); give this trial its own folder: "
            f"{start_over(path.parent)}")


def _refuse_foreign(root: Path, *, expect_hash: str | None, expect_config: dict | None) -> None:
    """train.resume=never where `root` holds a checkpoint of another config: refused (starting
    over there would replace its step_* folders and trial.json), suggesting a fresh folder."""
    for ckpt in reversed(complete_checkpoints(root)):
        try:
            meta = json.loads(read_text(ckpt.path / META_FILE, field=META_FILE, fix="", max_bytes=CONFIG_FILE_MAX_BYTES))
        except (OSError, ValueError):  # InputFileError is a ValueError: unreadable, so no proof it is ours
            meta = {}
        saved = meta.get("config") if isinstance(meta, dict) else None
        if isinstance(saved, dict) and expect_config is not None:
            diffs = integrity.config_differences(upgraded(saved), expect_config)
            if not diffs:
                continue
            whose = f"a checkpoint of another config ({integrity.describe_differences(diffs)[0]}: checkpoint vs this trial)"
        elif expect_hash is not None and isinstance(meta, dict) and meta.get("config_hash") == expect_hash:
            continue
        else:
            known = meta.get("config_hash") if isinstance(meta, dict) else None
            whose = (f"a checkpoint of another config (config hash {known})" if known
                     else "a checkpoint whose manifest names no config (it may be another trial's)")
        raise CheckpointError(f"train.resume=never would start this trial over in {root}, which holds "
                              f"{ckpt.path}, {whose}; checkpoints this trial cannot prove its own are never "
                              f"replaced: start it in a fresh folder, {start_over(root)}")


class DamagedCheckpoint(CheckpointError):
    """A checkpoint whose files are not what its manifest recorded at save."""

    def __init__(self, path: Path, problem: str, message: str = ""):
        self.path, self.problem = path, problem
        if not message:
            earlier = _earlier_intact(path)
            again = f"train.resume={earlier}" if earlier else "train.resume=PATH"
            message = (f"checkpoint {path} {problem}; resume from an earlier checkpoint ({again}) or start "
                       f"over ({start_over(path.parent)})")
        super().__init__(message)

    def __reduce__(self):  # as it was raised, also where it is unpickled (a Ray worker's error)
        return type(self), (self.path, self.problem, str(self))


def _earlier_intact(path: Path) -> Path | None:
    """The newest checkpoint beside `path` before it whose files have their sizes (suggested)."""
    m = _STEP_DIR.match(path.name)
    for ckpt in reversed(complete_checkpoints(path.parent) if m else []):
        if ckpt.step < int(m.group(1)):
            try:
                _sized_manifest(ckpt.path)
                return ckpt.path
            except CheckpointError:
                continue
    return None


def check_checkpoint(path: Path, *, world_size: int | None = None, verify: Verify | None = None) -> dict:
    """The checkpoint's manifest, after checking every file it names is there with its size
    and, with `verify`, its content (a digest per file): a truncated, half-copied or corrupted
    checkpoint is refused before any worker loads it."""
    meta = _sized_manifest(path)
    if verify is not None:
        problems = verify(path, meta["files"])
        if problems:
            more = f" and {len(problems) - 3} more" if len(problems) > 3 else ""
            raise DamagedCheckpoint(path, f"is damaged: {', '.join(problems[:3])}{more}")
    if world_size is not None and meta.get("layout_bound") and meta["world_size"] != world_size:
        raise CheckpointError(f"checkpoint {path} was written by {meta['world_size']} workers in a layout "
                              f"that cannot change size ({meta['parallel']}); resume with "
                              f"cluster.num_workers={meta['world_size']}")
    return meta


def _sized_manifest(path: Path) -> dict:
    where = f"checkpoint {path}"
    if not path.is_dir():
        raise CheckpointError(f"{where} does not exist; give an existing step_* folder, or train.resume=auto "
                              "(the latest in train.checkpoint_dir) or train.resume=never to start afresh")
    meta_path = path / META_FILE
    if not meta_path.exists() and not meta_path.is_symlink():
        raise CheckpointError(f"{where} is incomplete ({META_FILE} is missing): it was not finished "
                              f"or was copied in part; resume from an earlier one or start over with "
                              f"{start_over(path.parent)}")
    try:  # a FIFO, a device or a huge file there is refused before it is read
        text = read_text(meta_path, field=META_FILE, fix="", max_bytes=CONFIG_FILE_MAX_BYTES)
    except InputFileError as e:
        raise DamagedCheckpoint(path, f"is damaged: {META_FILE} {e.what}") from None
    try:
        meta = json.loads(text)
        files = dict(meta["files"])
        sizes = {name: integrity.expected_size(entry) for name, entry in files.items()}
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise DamagedCheckpoint(path, f"is damaged: {META_FILE} is corrupt ({e})") from None
    if integrity.manifest_problem(meta):
        raise DamagedCheckpoint(path, f"is damaged: {META_FILE} is corrupt "
                                      f"({integrity.manifest_problem(meta)})")
    for name, size in sizes.items():
        f = path / name
        if not f.is_file():  # said as such: "should have 8192 bytes, has missing" read as a size problem
            raise DamagedCheckpoint(path, f"is damaged: {name} is missing ({size} bytes at save)")
        if f.stat().st_size != size:
            raise DamagedCheckpoint(path, f"is damaged: {name} should have {size} bytes, has {f.stat().st_size}")
    return meta


def verify_here(path: Path, files: dict) -> list[str]:
    """Verify: every file of the checkpoint read back in this process (the driver's check)."""
    return integrity.digest_problems(path, files)


def agreed_resume(resume: str, root: Path, *, expect_hash: str | None, expect_config: dict | None,
                  warn: Warn | None = None) -> Checkpoint | None:
    """resolve_resume as the workers run it (a collective): rank 0 chooses, every rank reads
    its share of each candidate's files back against their digests, and every rank returns the
    same checkpoint or raises the same CheckpointError."""
    import torch.distributed as dist

    kwargs = {"expect_hash": expect_hash, "expect_config": expect_config, "warn": warn}
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return resolve_resume(resume, root, verify=verify_here, **kwargs)
    rank, world = dist.get_rank(), dist.get_world_size()

    def my_share(path: Path, files: dict) -> list[str]:
        try:
            return integrity.digest_problems(path, files, rank=rank, world=world)
        except Exception as e:  # never leave rank 0 waiting for this rank's word
            return [f"rank {rank} could not check its files ({type(e).__name__}: {e})"]

    if rank != 0:  # follow rank 0's orders until it has chosen
        while True:
            order = json.loads(gather_strings("")[0])
            if order["do"] == "verify":
                gather_strings(json.dumps(my_share(Path(order["path"]), order["files"])))
            elif order["do"] == "error":
                raise CheckpointError(order["error"])
            else:
                return Checkpoint(Path(order["path"]), order["step"]) if order["path"] else None

    def verify(path: Path, files: dict) -> list[str]:
        gather_strings(json.dumps({"do": "verify", "path": str(path), "files": files}))
        return [p for said in gather_strings(json.dumps(my_share(path, files))) for p in json.loads(said)]

    try:
        found = resolve_resume(resume, root, verify=verify, **kwargs)
    except BaseException as e:
        said = str(e) if isinstance(e, CheckpointError) else f"rank 0 could not choose a checkpoint: {e!r}"
        gather_strings(json.dumps({"do": "error", "error": said}))
        raise
    gather_strings(json.dumps({"do": "done", "path": str(found.path) if found else None,
                               "step": found.step if found else 0}))
    return found
