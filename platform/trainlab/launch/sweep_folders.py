"""A multirun's jobs each write a folder of their own: two in one folder are refused before anything starts.

A trial writes into its output_dir (its checkpoints by default, train.export's hf_model, the MLflow
spill file, the detail parquet, Ray's storage) and holds a lease on its checkpoint folder
(launch.lease). Two jobs of one sweep resolving to the same output_dir (`output_dir=out seed=0,1`,
or hydra.sweep.subdir fixed) or the same train.checkpoint_dir would mix their files, and the second
would meet the first's lease: `LeaseHeld: another driver trains this trial`, the same driver's other
trial. Refused on the driver with both jobs named and a folder per job: output_dir unset (Hydra's
own job folder, hydra.sweep.dir/hydra.sweep.subdir, one per job number) or an interpolation of the
job's number, which a rerun of the sweep resolves to the same folder, so each job resumes its own.

Within one batch any two jobs clash. Across a search's batches, a job of the same config as an
earlier one may reuse its folder (the sweeper proposed the same point again: it resumes that
trial's checkpoints, its result); one of another config may not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from trainlab.config import config_hash
from trainlab.config.checkpoints import checkpoint_root
from trainlab.launch.sweep_trial import Trial

PER_JOB = "${hydra:job.num}"
"""The interpolation that gives each job of a multirun its own folder: Hydra's job number."""


@dataclass(frozen=True)
class _Folder:
    kind: str
    """"output" or "checkpoints": folders of one kind are compared."""
    key: str
    """The setting that made it: output_dir, train.checkpoint_dir, or hydra.sweep.subdir (output_dir unset)."""
    given: str
    """As the user wrote it (its interpolations unresolved); "" where Hydra's job folder was taken."""
    path: str


def _raw(trial: Trial, key: str) -> str:
    """The job's `key` as composed, interpolations unresolved ("" where unset or unknown)."""
    cfg = getattr(trial.job_return, "cfg", None)
    if cfg is None:
        return ""
    try:
        node = OmegaConf.to_container(cfg, resolve=False)
    except Exception:  # noqa: BLE001 - a config we cannot read back: the resolved folder is named alone
        return ""
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return str(node or "")


def _folders(trial: Trial) -> list[_Folder]:
    """The job's output folder, then its checkpoint folder (train.checkpoint_dir, else in its output_dir)."""
    run = trial.run
    given = _raw(trial, "output_dir")
    output = _Folder("output", "output_dir" if given else "hydra.sweep.subdir", given, str(Path(run.output_dir).resolve()))
    if not run.train.checkpoint_dir:
        return [output, _Folder("checkpoints", output.key, output.given, str(checkpoint_root(run)))]
    return [output, _Folder("checkpoints", "train.checkpoint_dir", _raw(trial, "train.checkpoint_dir"),
                            str(checkpoint_root(run)))]


def folder_clash(trials: Sequence[Trial], labels: Sequence[str], *, earlier: Sequence[Trial] = (),
                 earlier_labels: Sequence[str] = ()) -> str:
    """The refusal of the first job of `trials` whose output folder or checkpoint folder another job
    of `trials` has, or an earlier batch's job of another config (`earlier`); "" where none does."""
    seen: dict[tuple[str, str], tuple[Trial, str, _Folder]] = {}
    for t, label in zip(earlier, earlier_labels):
        for f in _folders(t):
            seen.setdefault((f.kind, f.path), (t, label, f))
    before = {id(t) for t in earlier}
    for t, label in zip(trials, labels):
        mine = _folders(t)
        for f in mine:
            other = seen.get((f.kind, f.path))
            if other is not None and (id(other[0]) not in before or config_hash(other[0].run) != config_hash(t.run)):
                return _message(f, other[2], label, other[1])
        for f in mine:
            seen.setdefault((f.kind, f.path), (t, label, f))
    return ""


def _message(f: _Folder, other: _Folder, label: str, other_label: str) -> str:
    jobs = f"jobs {other_label} and {label}"
    if f.key == "hydra.sweep.subdir" and other.key == "hydra.sweep.subdir":
        return (f"hydra.sweep.subdir gives {jobs} the same folder ({f.path}), so their checkpoints and files would "
                "mix and the second would wait on the first's lease; leave hydra.sweep.subdir unset (Hydra's "
                "default: the job's number, a folder per job)")
    mine = f if f.given else other
    key, value = mine.key, mine.given or mine.path
    what = "output folder" if key == "output_dir" else "checkpoint folder"
    unset = ("leave output_dir unset, so each job gets Hydra's own folder (hydra.sweep.dir/<job number>)"
             if key == "output_dir" else "leave train.checkpoint_dir unset, so each job keeps its checkpoints "
             "in its own output_dir")
    per_job = f"{value.rstrip('/')}/{PER_JOB}"
    return (f"{key}={value!r} is the same {what} ({f.path}) for {jobs}, so their checkpoints and files would "
            f"mix and the second would wait on the first's lease; {unset}, or give each job its own: "
            f"'{key}={per_job}'")


__all__ = ["PER_JOB", "folder_clash"]
