"""A safetensors file's header, read and checked without reading a weight.

    tensors = read_header(path, field="model.pretrained", fix=fix)    # {name: TensorEntry}
    check_index(folder, field="model.pretrained", fix=fix)            # the shards an index names exist

The format (safetensors' own): 8 bytes, a little-endian length N; N bytes of a JSON object
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}; then the
data, each tensor at [begin, end) of it. The safetensors library (and so torch's
HuggingFaceStorageReader, which every worker loads with) refuses a file whose tensors do not tile
the data exactly, end to end: a file cut short by an interrupted copy, or one with bytes after its
last tensor. So is refused here, with the file, the tensor and the fix, before any worker starts.
Only the header is read (at most MAX_HEADER_BYTES, the library's own bound): a model of any size
is checked in milliseconds.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from trainlab.vocab.files import CONFIG_FILE_MAX_BYTES, check_file, open_file, read_text

MAX_HEADER_BYTES = 100_000_000
"""The safetensors library's bound on a header (its N_MAX): a longer one is refused as corrupt."""

DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
    "F8_E4M3": 1, "F8_E4M3FNUZ": 1, "F8_E5M2": 1, "F8_E5M2FNUZ": 1, "C64": 8, "U64": 8, "U32": 4, "U16": 2,
}
"""Bytes per element of each dtype safetensors.torch reads (its _TYPES): the reader the workers'
load goes through refuses a file holding any other, whichever tensors the model asks for."""

INDEX_FILE = "model.safetensors.index.json"
"""The index save_pretrained writes beside a model sharded over several files."""


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as a header describes it."""

    file: str
    """The file's name inside the folder."""
    dtype: str
    shape: tuple[int, ...]


def _refuse(path: Path, field: str, what: str, fix: str) -> ValueError:
    return ValueError(f"{field}: {path.name} in {str(path.parent)!r} {what}; {fix}")


def read_header(path: Path, *, field: str, fix: str, max_bytes: int | None) -> dict[str, TensorEntry]:
    """{tensor name: its entry} of the safetensors file `path`, checked against the file's size:
    the header's length, its JSON, every tensor's dtype, shape and byte range (inside the data,
    dtype size x elements long, the ranges tiling the data with no gap, overlap or tail).
    ValueError naming the file, the tensor and `fix` for anything else."""
    size = check_file(path, field=field, fix=fix, max_bytes=max_bytes)
    if size < 8:
        raise _refuse(path, field, f"is {size} bytes, too short to hold a safetensors header (8 bytes of length, "
                                   "then JSON): an empty or cut-short copy", fix)
    with open_file(path, field=field, fix=fix, max_bytes=max_bytes) as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > min(MAX_HEADER_BYTES, size - 8):
            raise _refuse(path, field, f"begins with a header length of {n:,} bytes, but the file holds "
                                       f"{size - 8:,} after it{' (safetensors allows 100 MB)' if n > MAX_HEADER_BYTES else ''}: "
                                       "it is cut short or not a safetensors file", fix)
        text = f.read(n)
    try:
        header = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _refuse(path, field, f"has a header that is not JSON ({e}): not a safetensors file, or damaged",
                      fix) from None
    if not isinstance(header, dict):
        raise _refuse(path, field, "has a header that is not a JSON object: not a safetensors file", fix)
    data_len = size - 8 - n
    tensors: dict[str, TensorEntry] = {}
    spans: list[tuple[int, int, str]] = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, begin, end = _entry(path, field, fix, name, entry)
        need = math.prod(shape) * DTYPE_BYTES[dtype]
        if end - begin != need:
            raise _refuse(path, field, f"gives tensor {name} ({dtype} {list(shape)}: {need:,} bytes) the byte range "
                                       f"[{begin:,}, {end:,}) of {end - begin:,} bytes: the header is damaged", fix)
        if end > data_len:
            raise _refuse(path, field, f"is cut short: its header places tensor {name} at bytes [{begin:,}, {end:,}) "
                                       f"of the data, but the file holds {data_len:,} bytes of data", fix)
        tensors[name] = TensorEntry(file=path.name, dtype=dtype, shape=shape)
        spans.append((begin, end, name))
    _check_tiling(path, field, fix, sorted(spans), data_len)
    return tensors


def _entry(path: Path, field: str, fix: str, name: str, entry) -> tuple[str, tuple[int, ...], int, int]:
    def bad(what: str) -> ValueError:
        return _refuse(path, field, f"has tensor {name} with {what}: the header is damaged", fix)

    if not isinstance(entry, dict):
        raise bad(f"an entry that is not an object ({json.dumps(entry)[:60]})")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_BYTES:
        raise _refuse(path, field, f"stores tensor {name} as dtype {json.dumps(dtype)[:40]}, which torch's "
                                   f"safetensors reader cannot read (it reads {', '.join(DTYPE_BYTES)})", fix)
    if not isinstance(shape, list) or not all(_whole(d) for d in shape):
        raise bad(f"shape {json.dumps(shape)[:60]} (not a list of whole numbers)")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_whole(o) for o in offsets)
            or offsets[0] > offsets[1]):
        raise bad(f"data_offsets {json.dumps(offsets)[:60]} (not [begin, end])")
    return dtype, tuple(shape), offsets[0], offsets[1]


def _whole(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _check_tiling(path: Path, field: str, fix: str, spans: list[tuple[int, int, str]], data_len: int) -> None:
    at = 0
    for begin, end, name in spans:
        if begin != at:
            where = f"overlaps the tensor before it (which ends at byte {at:,})" if begin < at else (
                f"starts at byte {begin:,}, leaving bytes [{at:,}, {begin:,}) of the data unused")
            raise _refuse(path, field, f"has tensor {name} that {where}: the header is damaged", fix)
        at = end
    if at != data_len:
        raise _refuse(path, field, f"holds {data_len - at:,} bytes after its last tensor (the header covers "
                                   f"{at:,} of {data_len:,}): safetensors refuses a file with a tail", fix)


def check_index(folder: Path, files: list[Path], *, field: str, fix: str) -> None:
    """A sharded model's model.safetensors.index.json (where there is one): every file its weight_map
    names is a plain name of a file in `files` (the folder's safetensors). ValueError otherwise."""
    index = folder / INDEX_FILE
    if not index.exists():
        return
    try:
        raw = json.loads(read_text(index, field=field, fix=fix, max_bytes=CONFIG_FILE_MAX_BYTES))
    except json.JSONDecodeError as e:
        raise _refuse(index, field, f"is not JSON ({e.msg} at line {e.lineno})", fix) from None
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(weight_map, dict):
        raise _refuse(index, field, "has no weight_map object ({tensor name: file name})", fix)
    present = {f.name for f in files}
    for name, file in weight_map.items():
        if not isinstance(file, str) or file not in present:
            what = "a name that is not a file of this folder" if not isinstance(file, str) or Path(
                file).name != file else "which is not in the folder"
            raise _refuse(index, field, f"places tensor {name} in {json.dumps(file)[:80]}, {what} (the folder holds "
                                        f"{', '.join(sorted(present))}): the copy is incomplete", fix)


__all__ = ["DTYPE_BYTES", "INDEX_FILE", "MAX_HEADER_BYTES", "TensorEntry", "check_index", "read_header"]
