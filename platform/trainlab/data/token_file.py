"""The ``tokens`` corpus: a user's raw binary token file, memory-mapped, never read whole.

The file is a flat array of token ids in ``data.token_dtype`` (native byte order, no
header), as written by :func:`write_token_file` or ``ndarray.tofile``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

from trainlab.config.schema import TOKEN_DTYPES
from trainlab.data.corpus import Corpus, iter_chunks, make_corpus
from trainlab.vocab.files import check_file, open_file

MIN_TOKENS = 4
"""Smallest usable file: 2 tokens (one input/target pair) in each of train and val."""
TOKEN_FILE_MAX_BYTES = 1 << 40
"""1 TiB: 2**39 uint16 tokens, hundreds of times the corpora trainlab trains on; the preflight
scans every id, so a bigger (or sparse, absurd) file would take hours before the trial starts."""
_WIDER = {"uint8": "uint16", "uint16": "int32", "int32": "int64", "uint32": "int64"}
"""The type twice as wide as each token dtype: a file written in it and read in the narrower one
has every second id 0 (the high halves of small ids, little-endian)."""
MIN_PAIRS = 64
"""Id pairs needed before 'every second id is 0' is taken as a misread dtype, not chance."""
NPY_MAGIC = b"\x93NUMPY"
_FIX = "point data.path at a raw token file (write one with trainlab.data.write_token_file)"


def _check_dtype(dtype: str, *, field: str) -> np.dtype:
    if dtype not in TOKEN_DTYPES:
        raise ValueError(f"{field}={dtype!r} is not known; choose one of {', '.join(TOKEN_DTYPES)}")
    return np.dtype(dtype)


def write_token_file(path, tokens: np.ndarray, dtype: str) -> Path:
    """Write ``tokens`` to ``path`` as raw ``dtype`` values (no header); returns the path.

    Refuses ids that ``dtype`` cannot hold instead of letting them wrap around.
    """
    dt = _check_dtype(dtype, field="dtype")
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(
            f"tokens must be a 1-D integer array, got shape {tokens.shape} dtype {tokens.dtype}"
        )
    info = np.iinfo(dt)
    if len(tokens) and (tokens.min() < info.min or tokens.max() > info.max):
        raise ValueError(
            f"token ids span [{tokens.min()}, {tokens.max()}], outside {dtype}'s range "
            f"[{info.min}, {info.max}]; pick a wider dtype"
        )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tokens.astype(dt, copy=False).tofile(path)
    return path


def open_token_file(path: str, *, dtype: str, vocab_size: int) -> np.memmap:
    """Memory-map ``path`` read-only after checking it is a well-formed token file.

    Raises ValueError naming data.path / data.token_dtype / data.vocab_size with the fix.
    """
    dt = _check_dtype(dtype, field="data.token_dtype")
    size = check_file(path, field="data.path", fix=_FIX, max_bytes=TOKEN_FILE_MAX_BYTES)
    if size % dt.itemsize:
        raise ValueError(
            f"data.path={path!r} has {size} bytes, not a multiple of {dt.itemsize} (the item "
            f"size of data.token_dtype={dtype}); the dtype is probably wrong: set "
            "data.token_dtype to the type the file was written with"
        )
    count = size // dt.itemsize
    if count < MIN_TOKENS:
        # np.memmap also cannot map an empty file, so this check must come first.
        raise ValueError(
            f"data.path={path!r} holds {count} tokens of {dtype}; at least {MIN_TOKENS} are "
            "needed (a train and a val split); use a longer token file"
        )
    with open_file(path, field="data.path", fix=_FIX, max_bytes=TOKEN_FILE_MAX_BYTES) as f:
        if f.read(len(NPY_MAGIC)) == NPY_MAGIC:
            raise ValueError(
                f"data.path={path!r} is a .npy file (np.save writes a header the raw reader would "
                "take for token ids); write the raw ids instead with ndarray.tofile or "
                "trainlab.data.write_token_file")
    tokens = np.memmap(path, dtype=dt, mode="r", shape=(count,))
    st = os.stat(path)  # the scan is kept for this file as it is now: a changed file is scanned again
    lo, hi, even_set, odd_set = _scan_ids(tokens, (os.path.realpath(path), dtype, st.st_dev, st.st_ino,
                                                   st.st_size, st.st_mtime_ns))
    _check_ids(lo, hi, even_set, odd_set, count=count, path=path, vocab_size=vocab_size, dtype=dtype)
    return tokens


_SCANS: dict[tuple, tuple[int, int, bool, bool]] = {}
"""_scan_ids' results by (real path, dtype, file identity): a sweep's driver checks every trial's
data, then plans each; the same file version is scanned once in a process."""
MAX_SCANS_KEPT = 32


def _scan_ids(tokens: np.ndarray, key: tuple) -> tuple[int, int, bool, bool]:
    """(lowest id, highest id, any even-position id set, any odd-position id set) of `tokens`,
    read chunk by chunk (bounded memory); once per `key` (file version and dtype)."""
    if key in _SCANS:
        return _SCANS[key]
    lo, hi = 0, 0
    even_set = odd_set = False  # chunks have an even length, so odd positions stay odd
    for chunk in iter_chunks(tokens):
        lo, hi = min(lo, int(chunk.min())), max(hi, int(chunk.max()))
        even_set = even_set or bool(chunk[0::2].any())
        odd_set = odd_set or bool(chunk[1::2].any())
    if len(_SCANS) >= MAX_SCANS_KEPT:
        _SCANS.pop(next(iter(_SCANS)))  # the oldest
    _SCANS[key] = lo, hi, even_set, odd_set
    return _SCANS[key]


def _check_ids(lo: int, hi: int, even_set: bool, odd_set: bool, *, count: int, path: str, vocab_size: int,
               dtype: str) -> None:
    """Every id in [0, vocab_size), and not every second one 0 (a file written in a type twice as
    wide: its ids misread in halves)."""
    if even_set and not odd_set and count >= 2 * MIN_PAIRS and sys.byteorder == "little":
        wider = _WIDER[dtype]
        fix = (f"set data.token_dtype={wider}" if wider in TOKEN_DTYPES else
               f"rewrite it as int32 (trainlab.data.write_token_file), as {wider} is not read")
        raise ValueError(
            f"data.path={path!r} read as data.token_dtype={dtype} has every second id 0: the high "
            f"halves of ids written as {wider}, so every id would be misread; {fix}")
    if lo < 0:
        raise ValueError(
            f"data.path={path!r} holds a negative token id ({lo}); token ids start at 0: "
            "check data.token_dtype (a signed type may be misreading the file)"
        )
    if hi >= vocab_size:
        raise ValueError(
            f"data.path={path!r} holds token id {hi}, but data.vocab_size={vocab_size} allows "
            f"ids up to {vocab_size - 1}; set data.vocab_size={hi + 1} (or larger), or check "
            "data.token_dtype"
        )


def token_file_corpus(*, path: str, dtype: str, vocab_size: int, val_fraction: float) -> Corpus:
    """Corpus over a memory-mapped token file (checked; the scan is reused only while the file is
    unchanged: open_token_file)."""
    tokens = open_token_file(path, dtype=dtype, vocab_size=vocab_size)
    return make_corpus(
        tokens,
        name="tokens",
        vocab_size=vocab_size,
        val_fraction=val_fraction,
        source=f"data.path={path!r}",
        description=f"token file {path} ({dtype}, vocab {vocab_size}, {len(tokens):,} tokens)",
    )
