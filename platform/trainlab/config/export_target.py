"""train.export=hf's folder: where the trained model goes, and whether it may go there.

    folder = export_folder(run)                          # <output_dir>/hf_model, absolute
    check_export_target(run, trial_hash=config_hash(run))   # ValueError: the field, the folder, the fix

The export never deletes what it did not write. It is written whole into a staging folder beside
the target (``hf_model.partial``) and renamed into place; a folder already at the target is
replaced only when it is this trial's own earlier export, untouched: it holds EXPORT_RECORD
(the trial's config hash and every file it wrote, with its size) and nothing else. Anything
else there (a user's file, another trial's export, the model or tokenizer this trial reads,
a symlink) is refused on the driver before anything starts, and checked again by the
exporting rank before it renames (models.hf_export).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from trainlab import names
from trainlab.config.schema import RunConfig
from trainlab.vocab.files import read_text

EXPORT_RECORD = "trainlab_export.json"
"""Written last into an export: the trial's config hash and the files it wrote ({name: bytes})."""
STAGING_SUFFIX = ".partial"
"""The folder an export is written into before it is renamed to its name."""
RECORD_MAX_BYTES = 1 << 20


def export_folder(run: RunConfig) -> Path:
    """Where train.export writes: <output_dir>/hf_model (output_dir "" = the working directory)."""
    return Path(os.path.abspath(os.path.expanduser(run.output_dir or "."))) / names.ARTIFACT_HF_MODEL


def staging_folder(target: Path) -> Path:
    return target.with_name(target.name + STAGING_SUFFIX)


def files_of(folder: Path) -> dict[str, int]:
    """Every file under `folder` (relative name -> bytes), the export record left out."""
    found = {}
    for dirpath, _, filenames in os.walk(folder):
        for name in filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(folder).as_posix()
            if rel != EXPORT_RECORD:
                found[rel] = path.lstat().st_size
    return found


def write_record(folder: Path, *, trial_hash: str, partial: bool = False) -> None:
    """The export record: which trial wrote `folder` and what it holds (read by replace_reason)."""
    record = {"config_hash": trial_hash, "partial": partial, "files": {} if partial else files_of(folder)}
    (folder / EXPORT_RECORD).write_text(json.dumps(record, indent=1, sort_keys=True))


def _record(folder: Path) -> dict | None:
    """The folder's export record, or None where it has none that reads (not a file, too big, not JSON)."""
    try:  # checked and bounded: a FIFO or a huge file there is no record, never waited on
        record = json.loads(read_text(folder / EXPORT_RECORD, field=EXPORT_RECORD, fix="",
                                      max_bytes=RECORD_MAX_BYTES))
    except (OSError, ValueError):  # InputFileError is a ValueError
        return None
    return record if isinstance(record, dict) else None


def replace_reason(folder: Path, *, trial_hash: str, partial: bool = False) -> str:
    """Why `folder` may not be replaced by this trial's export ("" where it may: absent, empty, or
    this trial's own earlier export untouched; `partial`: its own unfinished staging folder)."""
    if not os.path.lexists(folder):
        return ""
    if folder.is_symlink():
        return f"is a symlink (to {os.readlink(folder)})"
    if not folder.is_dir():
        return "is a file, not an export"
    held = files_of(folder)
    record = _record(folder)
    if record is None:
        if not held and not any(folder.iterdir()):
            return ""
        some = ", ".join(sorted(held)[:3]) or "folders"
        return f"holds files that no trainlab export wrote ({some}{', ...' if len(held) > 3 else ''})"
    if record.get("config_hash") != trial_hash:
        return f"holds the export of another trial (config hash {record.get('config_hash')}, this one {trial_hash})"
    if partial and record.get("partial"):
        return ""  # this trial's own export, cut off before its rename
    written = record.get("files") if isinstance(record.get("files"), dict) else {}
    added = sorted(set(held) - set(written))
    if added:
        return f"holds files the export did not write ({', '.join(added[:3])}{', ...' if len(added) > 3 else ''})"
    changed = sorted(k for k in written if held.get(k) != written[k])
    if changed:
        return f"was changed since it was exported ({', '.join(changed[:3])})"
    return ""


def unused_output_dir(output_dir: Path) -> Path:
    """A folder beside `output_dir` that does not exist yet: the output_dir a refusal suggests."""
    n = 2
    while os.path.lexists(candidate := output_dir.with_name(f"{output_dir.name}-{n}")):
        n += 1
    return candidate


def _inputs(run: RunConfig) -> list[tuple[str, Path]]:
    """The paths a trial reads that an export must never replace: (field, absolute path)."""
    fields = [("model.pretrained", run.model.pretrained), ("model.config", run.model.config)]
    if run.data.name == "hf":
        fields += [("data.tokenizer", run.data.tokenizer), ("data.path", run.data.path)]
    return [(f, Path(os.path.abspath(os.path.expanduser(v)))) for f, v in fields if v]


def check_export_target(run: RunConfig, *, trial_hash: str) -> None:
    """ValueError, before anything starts, where train.export=hf would replace anything that is
    not this trial's own earlier export: an input of the trial, a user's file, another export."""
    if not run.train.export:
        return
    target = export_folder(run)
    fix = (f"set output_dir to a folder of its own, e.g. output_dir={unused_output_dir(target.parent)} "
           "(the export goes to <output_dir>/hf_model)")
    for field, path in _inputs(run):
        real, dest = Path(os.path.realpath(path)), Path(os.path.realpath(target))
        if real == dest or dest in real.parents:
            raise ValueError(f"train.export={run.train.export} would write {target}, which holds {field}="
                             f"{path} that this trial reads; an export never replaces its inputs: {fix}")
    for folder, partial in ((target, False), (staging_folder(target), True)):
        why = replace_reason(folder, trial_hash=trial_hash, partial=partial)
        if why:
            raise ValueError(f"train.export={run.train.export} would replace {folder}, which {why}; "
                             f"an export never deletes what it did not write: move it away or {fix}")


__all__ = ["EXPORT_RECORD", "check_export_target", "export_folder", "replace_reason", "staging_folder",
           "write_record"]
