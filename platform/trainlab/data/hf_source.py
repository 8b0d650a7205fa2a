"""data=hf's input: a local dataset found, checked and read row by row, never downloaded.

data.path is one of
    a folder `datasets.Dataset(Dict).save_to_disk` wrote   read with datasets.load_from_disk
    a .jsonl / .json file (JSON lines, or one JSON array)  read line by line (an array: whole)
    a .parquet file                                          read in record batches
    a .txt file                                              one document: the whole file
    a folder of such files (one kind; e.g. a Hub snapshot)   read in sorted path order
Every file is checked for what it is and how big before it is read (vocab.files); a Hub name
with no local copy is refused naming the copy to use (vocab.hub). Rows come in a fixed order,
so the tokens, and the training order after them, are the same on every read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainlab.vocab.files import check_file, open_file, read_text
from trainlab.vocab.hub import hub_refusal, looks_like_hub_name

SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text"}
"""Data file suffixes and the reader of each."""
SAVED_MARKERS = ("dataset_dict.json", "state.json")
"""Files save_to_disk writes at the top of its folder (a DatasetDict, a Dataset)."""
DATA_FILE_MAX_BYTES = 1 << 40
"""1 TiB per file, as data=tokens' token file: bigger (or sparse, absurd) would tokenize for days."""
WHOLE_FILE_MAX_BYTES = 1 << 30
"""A .txt document or a .json array is read whole: 1 GiB at most."""
FIX = ("point data.path at a local dataset: a folder save_to_disk wrote, or .jsonl/.json/.parquet/.txt "
       "files (a folder of them)")


@dataclass(frozen=True)
class Source:
    """A checked local dataset: what data.path is and every file it reads."""

    path: str
    """data.path as given (absolute after the driver's resolve_paths)."""
    kind: str
    """saved (a save_to_disk folder), json, parquet or text."""
    files: tuple[str, ...]
    """Every file read, sorted: the data files (for saved: everything in the folder)."""

    def identity(self) -> list:
        """[real path of data.path, then (name under it, size, mtime ns) of each file]: changes when any
        file does, so a cache keyed by it is rebuilt (data.hf_cache)."""
        root = os.path.realpath(self.path)
        out: list = [root, self.kind]
        for f in self.files:
            st = os.stat(f)
            out.append((os.path.relpath(f, self.path) if f != self.path else "", st.st_size, st.st_mtime_ns))
        return out


def find_source(path: str) -> Source:
    """The dataset at data.path, checked; ValueError (one line: field, value, fix) for a Hub name, a
    missing path, a path that is no dataset, or a file of the wrong kind or size."""
    if not os.path.lexists(path):
        if looks_like_hub_name(path):
            raise ValueError(hub_refusal("data.path", path, repo_type="dataset"))
        check_file(path, field="data.path", fix=FIX, max_bytes=None)  # raises: does not exist
    if not os.path.isdir(path):
        suffix = Path(path).suffix.lower()
        check_file(path, field="data.path", fix=FIX, max_bytes=DATA_FILE_MAX_BYTES)  # FIFOs, devices, size
        if suffix not in SUFFIXES:
            hint = "; a raw token file is data=tokens" if suffix in (".bin", ".npy", "") else ""
            raise ValueError(f"data.path={path!r} is a {suffix or 'suffix-less'} file, not a dataset{hint}; {FIX}")
        return Source(path, SUFFIXES[suffix], (path,))
    root = Path(path)
    if any((root / m).is_file() for m in SAVED_MARKERS):
        files = sorted(str(p) for p in root.rglob("*") if not p.is_dir())
        for f in files:
            check_file(f, field="data.path", fix=FIX, max_bytes=DATA_FILE_MAX_BYTES)
        return Source(path, "saved", tuple(files))
    # a folder of data files; hidden folders (.cache, .git of a Hub snapshot) are not data
    found = sorted(str(p) for p in root.rglob("*") if p.suffix.lower() in SUFFIXES
                   and not any(part.startswith(".") for part in p.relative_to(root).parts))
    kinds = sorted({SUFFIXES[Path(f).suffix.lower()] for f in found})
    if not found:
        raise ValueError(f"data.path={path!r} is a folder holding no .jsonl/.json/.parquet/.txt file and no "
                         f"save_to_disk dataset; {FIX}")
    if len(kinds) > 1:
        raise ValueError(f"data.path={path!r} holds files of {len(kinds)} kinds ({', '.join(kinds)}); point "
                         "data.path at one file, or a folder of one kind")
    for f in found:
        check_file(f, field="data.path", fix=FIX, max_bytes=DATA_FILE_MAX_BYTES)
    return Source(path, kinds[0], tuple(found))


def iter_rows(source: Source, *, column: str, field: str, split: str) -> Iterator[Any]:
    """Each row's `column` value, in order. `field` names the setting that chose the column
    (data.text_field, data.messages_field), for the refusal of a missing one. A .txt file is one
    row, its text (any column)."""
    if source.kind == "saved":
        yield from _saved_rows(source.path, column=column, field=field, split=split)
        return
    for path in source.files:
        if source.kind == "text":
            yield read_text(path, field="data.path", fix=FIX, max_bytes=WHOLE_FILE_MAX_BYTES)
        elif source.kind == "parquet":
            yield from _parquet_rows(path, column=column, field=field)
        else:
            yield from _json_rows(path, column=column, field=field)


def _missing(field: str, column: str, path: str, columns) -> ValueError:
    cols = sorted(str(c) for c in columns)
    other = ("; for conversations set data.format=chat" if field == "data.text_field" and "messages" in cols
             else "")
    return ValueError(f"{field}={column!r} is not a column of {path!r} (its columns: {', '.join(cols) or 'none'}); "
                      f"set {field} to one of them{other}")


def _saved_rows(path: str, *, column: str, field: str, split: str) -> Iterator[Any]:
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # nothing is downloaded
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import datasets

    try:
        ds = datasets.load_from_disk(path)
    except (OSError, ValueError, FileNotFoundError) as e:
        raise ValueError(f"data.path={path!r} could not be read by datasets.load_from_disk "
                         f"({str(e).splitlines()[0] if str(e) else type(e).__name__}); {FIX}") from None
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise ValueError(f"data.split={split!r} is not a split of data.path={path!r} (its splits: "
                             f"{', '.join(sorted(ds))}); set data.split to one of them")
        ds = ds[split]
    if column not in ds.column_names:
        raise _missing(field, column, path, ds.column_names)
    for batch in ds.select_columns([column]).iter(batch_size=1024):
        yield from batch[column]


def _parquet_rows(path: str, *, column: str, field: str) -> Iterator[Any]:
    import pyarrow.parquet as pq

    with open_file(path, field="data.path", fix=FIX, max_bytes=DATA_FILE_MAX_BYTES) as f:
        try:
            pf = pq.ParquetFile(f)
        except Exception as e:  # noqa: BLE001 - pyarrow raises its own ArrowInvalid for a damaged file
            raise ValueError(f"data.path={path!r} is not a readable parquet file ({e}); {FIX}") from None
        if column not in pf.schema_arrow.names:
            raise _missing(field, column, path, pf.schema_arrow.names)
        for batch in pf.iter_batches(batch_size=1024, columns=[column]):
            yield from batch.column(0).to_pylist()


def _json_rows(path: str, *, column: str, field: str) -> Iterator[Any]:
    with open_file(path, field="data.path", fix=FIX, max_bytes=DATA_FILE_MAX_BYTES, text=True) as f:
        head = f.read(4096).lstrip()
    if head.startswith("["):  # one JSON array of rows, read whole
        rows = json.loads(read_text(path, field="data.path", fix=FIX, max_bytes=WHOLE_FILE_MAX_BYTES))
        for i, row in enumerate(rows):
            yield _column(row, column=column, field=field, where=f"{path!r} row {i}")
        return
    with open_file(path, field="data.path", fix=FIX, max_bytes=DATA_FILE_MAX_BYTES, text=True) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"data.path={path!r} line {number} is not JSON ({e.msg}); write one JSON "
                                 "object per line (JSON lines)") from None
            yield _column(row, column=column, field=field, where=f"{path!r} line {number}")


def _column(row: Any, *, column: str, field: str, where: str) -> Any:
    if not isinstance(row, dict):
        raise ValueError(f"data.path: {where} is a JSON {type(row).__name__}, not an object; write one "
                         "object per row, e.g. {\"text\": \"...\"}")
    if column not in row:
        raise _missing(field, column, where, row)
    return row[column]
