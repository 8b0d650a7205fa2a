"""Folders a run writes to, proven writable before anything starts.

Hydra makes its run folder (hydra.run.dir; hydra.sweep.dir in a multirun) before the app runs,
and a trial its output_dir and train.checkpoint_dir on the driver and in the workers. A folder
that cannot be made or written failed there with Hydra's traceback, or after the trial's MLflow
run was opened. check_writable_dir makes the folder as the run would, writes a file in it, and
removes what it made, so a refused run leaves nothing behind and an accepted one can write;
Hydra's own folder is kept once it passed (checked last, after the values: the run makes it next).
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import Any


def check_writable_dir(*, key: str, path: str, fix: str, keep: bool = False) -> None:
    """ValueError naming `key`, `path` and `fix` unless the folder `path` exists or can be
    made, and a file can be written in it. What this check made is removed, unless `keep` and
    the folder passed (the run makes it next anyway, and another process of the same run, a
    torchrun rank, may be using it already)."""
    target = Path(os.path.abspath(os.path.expanduser(path)))
    missing: list[Path] = []  # the folders to make, deepest last
    probe = target
    while not os.path.lexists(probe):
        missing.insert(0, probe)
        probe = probe.parent
    made: list[Path] = []  # those this process made (another may make one at the same time)
    passed = False
    try:
        for folder in missing:
            try:
                folder.mkdir()
                made.append(folder)
            except FileExistsError:  # made meanwhile by another process of this run
                pass
        if not target.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(target))
        fd, name = tempfile.mkstemp(dir=target, prefix=".trainlab-probe-")
        os.close(fd)
        os.unlink(name)
        passed = True
    except OSError as e:
        where = e.filename or target
        raise ValueError(f"{key}={path!r}: the folder cannot be made or written ({e.strerror or e}: "
                         f"{where}); {fix}") from None
    finally:
        for folder in reversed(made if not (keep and passed) else []):
            try:
                folder.rmdir()
            except OSError:
                break  # no longer empty: leave it


def check_run_folders(*, output_dir: str, checkpoint_dir: str) -> None:
    """The trial's output_dir and train.checkpoint_dir (those set), before its run is opened."""
    if output_dir:
        check_writable_dir(key="output_dir", path=output_dir,
                           fix="choose a folder you can write, or leave output_dir empty (Hydra's run folder)")
    if checkpoint_dir:
        check_writable_dir(key="train.checkpoint_dir", path=checkpoint_dir,
                           fix="choose a folder you can write, or leave train.checkpoint_dir empty "
                               "(<output_dir>/checkpoints)")


def check_hydra_folder(cfg: Any, *, multirun: bool) -> None:
    """The folder Hydra will make before the app runs: hydra.sweep.dir in a multirun, else
    hydra.run.dir, resolved from a config composed with return_hydra_config=True."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    try:
        path = OmegaConf.select(cfg, key, throw_on_missing=True)
    except (OmegaConfBaseException, ValueError):
        return  # an interpolation only Hydra's run can resolve: Hydra reports it
    if not path:
        return
    example = "multirun/sweep1" if multirun else "outputs/run1"
    check_writable_dir(key=key, path=str(path), keep=True,
                       fix=f"set {key} to a folder you can write (e.g. {key}={example}), or run from one")
