"""Where a trial's checkpoints are and which are complete: folder naming, no torch.

One checkpoint is one folder ``<root>/step_00000100/`` whose manifest (``trainlab.json``) is
written last (trainlab.engine.checkpoint writes and reads their contents). The engine saves
and resumes them; the tracker and the launcher look for them (does a trial have one to
resume?), so the naming sits below both.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from trainlab.config.convert import config_hash

_STEP_DIR = re.compile(r"^step_(\d{8})$")
META_FILE = "trainlab.json"


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from: missing, incomplete, corrupt or of another run."""


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    step: int


def checkpoint_root(run) -> Path:
    """train.checkpoint_dir, or <output_dir>/checkpoints (absolute: workers run elsewhere).
    Without an output_dir (the engine called as a library) it is ./checkpoints/<config hash>,
    so two different trials started in one folder never resume each other."""
    if run.train.checkpoint_dir:
        return Path(run.train.checkpoint_dir).resolve()
    if run.output_dir:
        return (Path(run.output_dir) / "checkpoints").resolve()
    return (Path("checkpoints") / config_hash(run)).resolve()


def unused_checkpoint_root(run) -> Path:
    """checkpoint_root(run) if it is empty or absent, else the first empty `<root>-rerun<N>`
    beside it: hydra.launcher.rerun=true trains a trial again from step 1, so it must neither
    resume the checkpoints (nor continue the MLflow run, trial.json) that an earlier run of the
    trial left in its folder, nor mix its own among them."""
    return unused_beside(checkpoint_root(run), "rerun")


def unused_beside(root: Path, word: str = "new") -> Path:
    """`root` if it is empty or absent, else the first empty or absent `<root>-<word><N>` beside it."""
    root = Path(root)
    found, n = root, 1
    while found.is_dir() and any(found.iterdir()):
        n += 1
        found = root.with_name(f"{root.name}-{word}{n}")
    return found


def start_over(folder: Path) -> str:
    """The one start-over every message suggests: train.resume=never in a fresh folder beside
    `folder` (checkpoints are never replaced: a start-over where they are would lose them)."""
    return f"train.resume=never train.checkpoint_dir={unused_beside(folder)}"


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def remove_unfinished_saves(root: Path) -> None:
    """Remove the ``step_*.tmp`` folders under `root`: saves cut off before their rename (a crash,
    a SIGKILL, a second Ctrl-C) are never complete. Only where nothing writes there any more."""
    for stale in Path(root).glob("step_*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)


def complete_checkpoints(root: Path) -> list[Checkpoint]:
    """The finished checkpoints under `root`, oldest first (``.tmp`` folders are ignored)."""
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir() and (p / META_FILE).is_file():
            found.append(Checkpoint(p, int(m.group(1))))
    return sorted(found, key=lambda c: c.step)


def latest_checkpoint(root: Path) -> Checkpoint | None:
    found = complete_checkpoints(root)
    return found[-1] if found else None
