"""data=hf's token cache: a dataset tokenized once, kept as a token file (and a loss-mask file).

    <data.cache_dir>/<key>/tokens.bin   raw ids (uint16, or uint32 past 65,536 tokens), as data=tokens reads
    <data.cache_dir>/<key>/mask.bin     data.loss_on=answer: one uint8 per token, 1 = a target
    <data.cache_dir>/<key>/meta.json    what it holds (written last)

The key hashes the dataset files' identity (names, sizes, modification times), the tokenizer's
files and the fields that change the tokens, so a changed input is tokenized again and an
unchanged one never is. A folder is built under a temporary name and renamed into place whole,
under an exclusive lock on <key>.lock (removed with the lock: nothing is left behind): a process
that finds the folder finds it complete, and a second process waiting on the lock uses the first
one's folder instead of tokenizing again.

A folder found damaged (a meta.json cut short or edited, a token file of the wrong size) is
tokenized again beside it and swapped in, if it holds nothing but trainlab's files; otherwise it is
refused naming it. data.cache_dir is only written on a miss, so a read-only cache of complete
folders serves; one that cannot be written where it must be is refused in one line.
"""

from __future__ import annotations

import contextlib
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


class DamagedCache(Exception):
    """A cache folder that is there but not whole (a meta.json cut short, a token file of the wrong
    size, ...): rebuilt under the lock (build_cached), never trusted."""


META_FIELDS = {"version": int, "num_tokens": int, "num_targets": int, "documents": int, "dtype": str,
               "vocab_size": int, "eos_id": int, "masked": bool}
"""What meta.json must hold, and of what type, for its folder to be read."""


def read_meta(folder: Path) -> dict | None:
    """meta.json of a complete cache folder; None when there is no folder; DamagedCache when it
    cannot be read or lacks a field."""
    if not folder.exists():
        return None
    try:
        meta = json.loads(read_text(folder / META, field="data.cache_dir", fix="rebuilt"))
    except ValueError as e:  # InputFileError, JSONDecodeError, UnicodeDecodeError
        raise DamagedCache(f"{META}: {getattr(e, 'what', None) or e}") from None
    if not isinstance(meta, dict):
        raise DamagedCache(f"{META} holds no object")
    for key, kind in META_FIELDS.items():
        if not isinstance(meta.get(key), kind) or (kind is int and isinstance(meta[key], bool)):
            raise DamagedCache(f"{META} has no {kind.__name__} {key!r}")
    if meta["version"] != CACHE_VERSION or meta["dtype"] not in ("uint16", "uint32"):
        raise DamagedCache(f"{META} has version {meta['version']}, dtype {meta['dtype']!r}")
    return meta


def open_cached(folder: Path) -> CachedTokens | None:
    """The cache folder opened (each file checked, the ids scanned as data=tokens does), or None
    when there is none; DamagedCache when it is there and not whole."""
    meta = read_meta(folder)
    if meta is None:
        return None
    try:
        tokens = open_token_file(str(folder / TOKENS), dtype=meta["dtype"], vocab_size=meta["vocab_size"])
        if len(tokens) != meta["num_tokens"]:
            raise DamagedCache(f"{TOKENS} holds {len(tokens)} tokens, {META} says {meta['num_tokens']}")
        mask = None
        if meta["masked"]:
            size = check_file(folder / MASK, field="data.cache_dir", fix="rebuilt", max_bytes=len(tokens))
            if size != len(tokens):
                raise DamagedCache(f"{MASK} has {size} entries for {len(tokens)} tokens")
            mask = np.memmap(folder / MASK, dtype=np.uint8, mode="r", shape=(len(tokens),))
    except (ValueError, OSError) as e:  # open_token_file's, check_file's refusals: a file missing, cut
        raise DamagedCache(str(e)) from None
    return CachedTokens(folder, tokens, mask, meta)


class TokenWriter:
    """Appends token ids (and mask entries) to a cache folder's files as they are made; a write that
    fails (a full disk) is one line naming data.cache_dir."""

    def __init__(self, folder: Path, *, dtype: str, masked: bool):
        self.dtype = np.dtype(dtype)
        self._root = folder.parent
        with self._writing():
            self._tokens = open(folder / TOKENS, "wb")  # noqa: SIM115 - closed by close()
            self._mask = open(folder / MASK, "wb") if masked else None  # noqa: SIM115
        self.num_tokens = 0
        self.num_targets = 0

    @contextlib.contextmanager
    def _writing(self):
        try:
            yield
        except OSError as e:
            raise ValueError(f"data.cache_dir={str(self._root)!r}: writing the tokens failed "
                             f"({e.strerror or e}); free space there, or set data.cache_dir to a folder "
                             "with room for them") from None

    def append(self, ids: np.ndarray, mask: np.ndarray | None) -> None:
        with self._writing():
            ids.astype(self.dtype).tofile(self._tokens)
            if self._mask is not None:
                assert mask is not None and len(mask) == len(ids)
                mask.astype(np.uint8).tofile(self._mask)
        self.num_targets += int(mask.sum()) if self._mask is not None else len(ids)
        self.num_tokens += len(ids)

    def close(self) -> None:
        with self._writing():
            for f in (self._tokens, self._mask):
                if f is not None and not f.closed:
                    try:
                        f.flush()
                        os.fsync(f.fileno())
                    finally:
                        f.close()


FIX_DIR = f"set data.cache_dir to a folder you can write (empty: {DEFAULT_CACHE_DIR})"


def usable_root(root: Path) -> None:
    """data.cache_dir made if missing; ValueError (one line: the field, the value, why, the fix)
    where it is no folder or cannot be made."""
    if root.exists() and not root.is_dir():
        what = "a file" if root.is_file() else "not a folder"
        raise ValueError(f"data.cache_dir={str(root)!r} is {what}, not a folder; {FIX_DIR}")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"data.cache_dir={str(root)!r} cannot be made ({e.strerror or e}: "
                         f"{e.filename or root}); {FIX_DIR}") from None


@contextlib.contextmanager
def _unwritable(root: Path):
    """An OSError from making the lock or the temporary folder is data.cache_dir not writable."""
    try:
        yield
    except OSError as e:
        raise ValueError(f"data.cache_dir={str(root)!r} cannot be written ({e.strerror or e}); it must "
                         f"hold a new folder per dataset; {FIX_DIR}") from None


def _only_ours(folder: Path) -> list[str]:
    """The names in `folder` that are not files trainlab writes there (empty: all of it is ours)."""
    ours = {TOKENS, MASK, META}
    return sorted(e.name for e in os.scandir(folder) if e.name not in ours or not e.is_file(follow_symlinks=False))


def _remove_ours(folder: Path) -> None:
    """Unlink trainlab's files in `folder`, then the folder; anything else in it is left, and so the folder."""
    for name in (TOKENS, MASK, META):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(folder / name)
    with contextlib.suppress(OSError):
        folder.rmdir()


def _remove_leftovers(folder: Path) -> None:
    """Temporary folders of `folder`'s key a process killed while it built left (under the lock no
    other process builds one), where they hold trainlab's files only."""
    for e in os.scandir(folder.parent):
        if e.name.startswith(f".{folder.name}.") and e.is_dir(follow_symlinks=False):
            _remove_ours(Path(e.path))


def build_cached(folder: Path, write: Callable[[Path], dict]) -> CachedTokens:
    """The cache `folder`, made by `write(tmp)` unless another process made it meanwhile: `write`
    fills the temporary folder and returns the meta fields; meta.json goes in last, then the folder
    is renamed into place whole. A damaged folder (DamagedCache) is rebuilt beside and replaced
    where it holds trainlab's files only; else refused naming it. The lock file goes with the lock."""
    root = folder.parent
    usable_root(root)
    with contextlib.ExitStack() as stack:
        with _unwritable(root):  # the first write there: a read-only or immutable folder fails here
            stack.enter_context(held(root / f"{folder.name}.lock", remove=True))
        damaged = _locked_state(folder)
        if isinstance(damaged, CachedTokens):
            return damaged
        _remove_leftovers(folder)
        with _unwritable(root):
            tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=root))
        try:
            meta = {"version": CACHE_VERSION, **write(tmp)}
            (tmp / META).write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
            tmp.chmod(0o755)  # mkdtemp's 0700 would keep other users of a shared data.cache_dir out
            if damaged:  # moved aside whole first: the folder is never seen half replaced
                trash = Path(tempfile.mkdtemp(prefix=f".{folder.name}.damaged.", dir=root))
                os.rename(folder, trash)  # onto the empty folder mkdtemp made
                os.rename(tmp, folder)
                _remove_ours(trash)
            else:
                os.rename(tmp, folder)  # atomic: the folder appears complete or not at all
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    cached = open_cached(folder)
    assert cached is not None
    return cached


def _locked_state(folder: Path) -> CachedTokens | str:
    """Under the lock: the folder opened, or '' (none), or why it is damaged (to be replaced);
    ValueError where a damaged folder holds something trainlab did not write."""
    try:
        cached = open_cached(folder)
    except DamagedCache as e:
        if folder.is_symlink() or not folder.is_dir() or (foreign := _only_ours(folder)):
            what = "is not a folder" if folder.is_symlink() or not folder.is_dir() else \
                f"holds {', '.join(foreign)}, which trainlab does not write there"
            raise ValueError(f"data.cache_dir: {folder} is a damaged token cache ({e}) and {what}, so "
                             f"trainlab leaves it; move it away to tokenize again (mv {folder} "
                             f"{folder}.damaged)") from None
        return str(e)
    return cached if cached is not None else ""
