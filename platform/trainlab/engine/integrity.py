"""Is a checkpoint intact, and is it this trial's? Checked before any worker loads it.

At save, every file of a checkpoint gets its size and a SHA-256 digest in the manifest
(``trainlab.json``), beside the fields of the config that wrote it (those config_hash covers)
and a digest of the manifest itself. Before a resume the driver reads every file back and
compares, and compares the trial's config field by field, so that a flipped byte in a shard,
in DCP's ``.metadata`` or in a rank file, or a checkpoint of another model, is refused naming
the file (or the fields) instead of failing later inside torch, after the workers started.

Why SHA-256: it is in the standard library (no wheel to carry to a GPU machine) and the
fastest of its digests where the CPU has SHA extensions (x86 since Zen / Ice Lake, ARMv8):
measured on a 2-core AMD EPYC VM (256 MiB in memory, one thread) 0.9-1.6 GiB/s against
BLAKE2b's 0.55-1.1 GiB/s; xxHash's XXH3 ran 20 GiB/s but is a dependency, and reading a
checkpoint back from disk costs as much (1 GiB of shards verified: 0.9 GiB/s from the page
cache, 0.4-0.9 GiB/s with its pages dropped). Files are hashed on several threads (hashlib
releases the GIL), and at save each rank hashes its share of the folder's files.
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

DIGEST = "sha256"
"""The manifest's per-file key and hashlib's name for it."""
SELF_KEY = "manifest_sha256"
"""The manifest's own digest: of its JSON without this key (sorted keys)."""
THREADS = min(8, os.cpu_count() or 1)
"""Files hashed at once in one process (reading and hashing both release the GIL)."""
AUTO_DEVICE_KEY = "cluster.device"


def file_digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, DIGEST).hexdigest()


def share(names: list[str], *, rank: int, world: int) -> list[str]:
    """The files of `names` (sorted) that `rank` of `world` hashes: every world-th one."""
    return sorted(names)[rank::world]


def describe_files(folder: Path, names: list[str]) -> dict[str, dict]:
    """{name: {'bytes': size, 'sha256': hex}} of these files of `folder`, hashed on threads."""
    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        digests = list(pool.map(lambda n: file_digest(folder / n), names))
    return {n: {"bytes": (folder / n).stat().st_size, DIGEST: d} for n, d in zip(names, digests)}


def seal(meta: dict) -> dict:
    """`meta` with its own digest added (the manifest's flipped bytes are found too)."""
    return {**meta, SELF_KEY: _meta_digest(meta)}


def _meta_digest(meta: dict) -> str:
    body = {k: v for k, v in meta.items() if k != SELF_KEY}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def manifest_problem(meta: dict) -> str:
    """Why the manifest itself is not what was written ('' if it is, or if it predates seals)."""
    if SELF_KEY in meta and meta[SELF_KEY] != _meta_digest(meta):
        return "its own checksum does not match its contents"
    return ""


def expected_size(entry) -> int:
    """A manifest entry's size: {'bytes': n, 'sha256': ...}, or a bare n (format version 1)."""
    return int(entry["bytes"]) if isinstance(entry, dict) else int(entry)


def digest_problems(folder: Path, files: dict, *, rank: int = 0, world: int = 1) -> list[str]:
    """What is wrong with the files of this rank's share whose content differs from the digest
    recorded at save, one phrase each (files saved before digests were recorded are skipped)."""
    mine = [n for n in share(list(files), rank=rank, world=world) if isinstance(files[n], dict)
            and DIGEST in files[n]]

    def check(name: str) -> str:
        try:
            got = file_digest(folder / name)
        except OSError as e:
            return f"{name} cannot be read ({e.strerror or e})"
        return "" if got == files[name][DIGEST] else f"{name} does not match the {DIGEST} recorded at save"

    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        return [p for p in pool.map(check, mine) if p]


# -- is it this trial's? ---------------------------------------------------------------------
def as_json(fields: dict) -> dict:
    """`fields` as the manifest holds them (tuples as lists, enums as their values)."""
    return json.loads(json.dumps(fields, sort_keys=True, default=str))


def config_differences(saved: dict, trial: dict) -> list[tuple[str, object, object]]:
    """(field, checkpoint's value, trial's value) for every field that differs. cluster.device
    'auto' matches any device: the Ray driver resolves it before the workers start, torchrun
    does not, and a checkpoint does not depend on which of the two launched it."""
    trial = as_json(trial)
    out = []
    for key in sorted(set(saved) | set(trial)):
        a, b = saved.get(key, "<absent>"), trial.get(key, "<absent>")
        if key == AUTO_DEVICE_KEY and "auto" in (a, b):
            continue
        if a != b:
            out.append((key, a, b))
    return out


def override(key: str, value) -> str:
    """`key=value` in Hydra's override grammar (lists in brackets, odd strings quoted)."""
    return f"{key}={_hydra_value(value)}"


def _hydra_value(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_hydra_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if isinstance(value, str) and (text == "" or any(c in text for c in " ,=:'\"[]{}()\\$*?")):
        return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return text


def describe_differences(diffs: list[tuple[str, object, object]], *, limit: int = 6) -> tuple[str, str]:
    """('model.dim 128 vs 64, ...', 'model.dim=128 ...'): the differences as the checkpoint's
    value vs the trial's, and the overrides that give the trial the checkpoint's values."""
    shown = diffs[:limit]
    more = f" and {len(diffs) - limit} more" if len(diffs) > limit else ""
    said = ", ".join(f"{k} {json.dumps(a)} vs {json.dumps(b)}" for k, a, b in shown) + more
    fix = " ".join(override(k, a) for k, a, _ in shown if a != "<absent>") + (" ..." if more else "")
    return said, fix
