"""Hugging Face Hub names among paths: trainlab reads local copies only and downloads nothing.

A value like `HuggingFaceFW/fineweb` or `meta-llama/Llama-3.1-8B` that is not a path on this
machine names a Hub repository. It is refused before anything starts, naming the local copy to
use: the snapshot huggingface_hub's cache holds (`hf_cache_snapshot`), else how to make one.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from trainlab.vocab.files import read_text

_HUB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
"""owner/name as the Hub spells repository ids: one slash, no leading '.', '/' or '~'."""


def looks_like_hub_name(value: str) -> bool:
    """`value` reads as a Hub repository id (owner/name); says nothing of whether it exists locally."""
    return bool(_HUB_NAME.match(value)) and ".." not in value


def hub_cache_root() -> Path:
    """huggingface_hub's cache folder, as it resolves it ($HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/...)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def hf_cache_snapshot(repo_id: str, *, repo_type: str) -> Path | None:
    """The local snapshot folder of `repo_id` in huggingface_hub's cache (the one refs/main points
    at, else the newest), or None when the cache holds none. Reads folder names only."""
    repo = hub_cache_root() / f"{repo_type}s--{repo_id.replace('/', '--')}"
    snapshots = repo / "snapshots"
    ref = repo / "refs" / "main"
    try:
        if ref.exists():
            main = snapshots / read_text(ref, field="huggingface_hub's refs/main", fix="", max_bytes=256).strip()
            if main.is_dir():
                return main
        found = [p for p in snapshots.iterdir() if p.is_dir()]
    except (OSError, ValueError):  # no cache, or a damaged one: no snapshot to name
        return None
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def hub_refusal(field: str, value: str, *, repo_type: str) -> str:
    """The one-line refusal of `field=value`, a Hub name with no local path: the cached snapshot to
    point at, or how to make a local copy (`repo_type`: dataset or model)."""
    where = f"{field}={value!r} is not a path on this machine: it names a Hugging Face Hub {repo_type}, and trainlab downloads nothing"
    snapshot = hf_cache_snapshot(value, repo_type=repo_type)
    if snapshot is not None:
        return f"{where}; use the copy in the Hugging Face cache: {field}={snapshot}"
    local = value.split("/")[1]
    flag = " --repo-type dataset" if repo_type == "dataset" else ""
    return (f"{where}; make a local copy first (`hf download {value}{flag} --local-dir {local}`) and set "
            f"{field}={os.path.join('.', local)}")
