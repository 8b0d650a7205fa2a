"""data=hf's token cache: a dataset tokenized once, kept as a token file (and a loss-mask file).

    <data.cache_dir>/<key>/tokens.bin   raw ids (uint16, or uint32 past 65,536 tokens), as data=tokens reads
    <data.cache_dir>/<key>/mask.bin     data.loss_on=answer: one uint8 per token, 1 = a target
    <data.cache_dir>/<key>/meta.json    what it holds (written last)

The key hashes the dataset files' identity (names, sizes, modification times), the tokenizer's
files and the fields that change the tokens, so a changed input is tokenized again and an
unchanged one never is. A folder is built under a temporary name and renamed into place whole,
under an exclusive lock on <key>.lock: a process that finds the folder finds it complete, and a
second process waiting on the lock uses the first one's folder instead of tokenizing again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainlab.data.token_file import open_token_file
from trainlab.vocab.file_lock import held
from trainlab.vocab.files import check_file, read_text

CACHE_VERSION = 1
"""Bumped when what a cache folder holds changes: older folders are then rebuilt under new keys."""
DEFAULT_CACHE_DIR = "~/.cache/trainlab/tokens"
TOKENS, MASK, META = "tokens.bin", "mask.bin", "meta.json"


def cache_dir(configured: str) -> Path:
    """data.cache_dir, or the default, with `~` expanded."""
    return Path(os.path.expanduser(configured or DEFAULT_CACHE_DIR))


def cache_key(*parts: object) -> str:
    """24 hex chars of sha256 over the JSON of `parts` (identities and fields) and CACHE_VERSION."""
    text = json.dumps([CACHE_VERSION, *parts], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def token_dtype(vocab_size: int) -> str:
    """The narrowest TOKEN_DTYPES type holding ids below vocab_size."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


@dataclass(frozen=True)
class CachedTokens:
    """One cache folder, opened: the token stream memory-mapped, its mask, what meta.json says."""

    folder: Path
    tokens: np.ndarray
    mask: np.ndarray | None
    meta: dict

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])


def _fix(folder: Path) -> str:
    return f"delete {folder} to tokenize again"


def read_meta(folder: Path) -> dict | None:
    """meta.json of a complete cache folder; None when there is no folder."""
    if not folder.exists():
        return None
    meta = json.loads(read_text(folder / META, field="data.cache_dir", fix=_fix(folder)))
    if meta.get("version") != CACHE_VERSION:
        raise ValueError(f"data.cache_dir: {folder} was written by another trainlab version; {_fix(folder)}")
    return meta


def open_cached(folder: Path) -> CachedTokens | None:
    """The cache folder opened (each file checked, the ids scanned as data=tokens does), or None
    when there is none."""
    meta = read_meta(folder)
    if meta is None:
        return None
    tokens = open_token_file(str(folder / TOKENS), dtype=meta["dtype"], vocab_size=int(meta["vocab_size"]))
    if len(tokens) != meta["num_tokens"]:
        raise ValueError(f"data.cache_dir: {folder / TOKENS} holds {len(tokens)} tokens, its meta.json "
                         f"{meta['num_tokens']}; {_fix(folder)}")
    mask = None
    if meta["masked"]:
        size = check_file(folder / MASK, field="data.cache_dir", fix=_fix(folder), max_bytes=len(tokens))
        if size != len(tokens):
            raise ValueError(f"data.cache_dir: {folder / MASK} has {size} entries for {len(tokens)} tokens; "
                             f"{_fix(folder)}")
        mask = np.memmap(folder / MASK, dtype=np.uint8, mode="r", shape=(len(tokens),))
    return CachedTokens(folder, tokens, mask, meta)


class TokenWriter:
    """Appends token ids (and mask entries) to a cache folder's files as they are made."""

    def __init__(self, folder: Path, *, dtype: str, masked: bool):
        self.dtype = np.dtype(dtype)
        self._tokens = open(folder / TOKENS, "wb")  # noqa: SIM115 - closed by close()
        self._mask = open(folder / MASK, "wb") if masked else None  # noqa: SIM115
        self.num_tokens = 0
        self.num_targets = 0

    def append(self, ids: np.ndarray, mask: np.ndarray | None) -> None:
        ids.astype(self.dtype).tofile(self._tokens)
        if self._mask is not None:
            assert mask is not None and len(mask) == len(ids)
            mask.astype(np.uint8).tofile(self._mask)
            self.num_targets += int(mask.sum())
        else:
            self.num_targets += len(ids)
        self.num_tokens += len(ids)

    def close(self) -> None:
        for f in (self._tokens, self._mask):
            if f is not None:
                f.flush()
                os.fsync(f.fileno())
                f.close()


def build_cached(folder: Path, write: Callable[[Path], dict]) -> CachedTokens:
    """The cache `folder`, made by `write(tmp)` unless another process made it meanwhile: `write`
    fills the temporary folder and returns the meta fields; meta.json goes in last, then the folder
    is renamed into place whole."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with held(folder.parent / f"{folder.name}.lock"):  # a second process waits here for the first one's folder
        cached = open_cached(folder)
        if cached is not None:
            return cached
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
        try:
            meta = {"version": CACHE_VERSION, **write(tmp)}
            (tmp / META).write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
            tmp.chmod(0o755)  # mkdtemp's 0700 would keep other users of a shared data.cache_dir out
            os.rename(tmp, folder)  # atomic: the folder appears complete or not at all
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    cached = open_cached(folder)
    assert cached is not None
    return cached
