"""data=hf's input: a local dataset found, checked and read row by row, never downloaded.

data.path is one of
    a folder `datasets.Dataset(Dict).save_to_disk` wrote   read with datasets.load_from_disk
    a .jsonl / .json file (JSON lines, or one JSON array)  read row by row (data.hf_files)
    a .parquet file                                          read in record batches
    a .txt file                                              one document, read a chunk at a time
    a folder of such files (one kind; e.g. a Hub snapshot)   read in sorted path order
Every file is checked for what it is and how big before it is read (vocab.files); a Hub name
with no local copy is refused naming the copy to use (vocab.hub). Rows come in a fixed order,
so the tokens, and the training order after them, are the same on every read. A row is read
whole and may be ROW_MAX_BYTES at most; each comes with where it is (file, line or row) for a
refusal that names it. data.split picks a saved DatasetDict's split; nothing else has splits.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainlab.data.hf_files import DATA_FILE_MAX_BYTES, FIX, ROW_MAX_BYTES, json_rows, row_fix, text_chunks
from trainlab.vocab.files import check_file, open_file, read_text, size_text
from trainlab.vocab.hub import hub_refusal, looks_like_hub_name

SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text"}
"""Data file suffixes and the reader of each."""
SAVED_MARKERS = ("dataset_dict.json", "state.json")
"""Files save_to_disk writes at the top of its folder (a DatasetDict, a Dataset)."""
ARROW_BATCH_ROWS = 64
"""Rows of a parquet file or a saved dataset taken from Arrow at a time (each then made a Python
value one by one, after its size is checked against ROW_MAX_BYTES)."""


@dataclass(frozen=True)
class Source:
    """A checked local dataset: what data.path is and every file it reads."""

    path: str
    """data.path as given (absolute after the driver's resolve_paths)."""
    kind: str
    """saved (a save_to_disk folder), json, parquet or text."""
    files: tuple[str, ...]
    """Every file read, sorted: the data files (for saved: everything in the folder)."""
    split: str = ""
    """A saved DatasetDict's split to read (data.split, or its `train` split); '' for the rest."""

    def identity(self) -> list:
        """[real path of data.path, then (name under it, size, mtime ns) of each file]: changes when any
        file does, so a cache keyed by it is rebuilt (data.hf_cache)."""
        root = os.path.realpath(self.path)
        out: list = [root, self.kind]
        for f in self.files:
            st = os.stat(f)
            out.append((os.path.relpath(f, self.path) if f != self.path else "", st.st_size, st.st_mtime_ns))
        return out


def find_source(path: str, *, split: str = "") -> Source:
    """The dataset at data.path, checked, with data.split; ValueError (one line: field, value, fix)
    for a Hub name, a missing path, a path that is no dataset, a file of the wrong kind or size, or
    a split it does not have."""
    return _with_split(_find(path), split)


def _find(path: str) -> Source:
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




def _with_split(source: Source, split: str) -> Source:
    """`source` with the split to read: a saved DatasetDict's (data.split, empty: `train`); any
    other source has none, and data.split must be empty."""
    dict_file = Path(source.path) / "dataset_dict.json"
    if source.kind != "saved" or not dict_file.is_file():
        if split:
            what = ("one saved Dataset, with no splits (save_to_disk of a Dataset, not a DatasetDict)"
                    if source.kind == "saved" else f"{source.kind} rows, with no splits")
            raise ValueError(f"data.split={split!r}: data.path={source.path!r} holds {what}; set data.split='' "
                             "to read all of it (to train on one part, point data.path at that part's files)")
        return source
    fix = "save it again with DatasetDict.save_to_disk"
    try:
        splits = json.loads(read_text(dict_file, field="data.path", fix=fix))["splits"]
        assert isinstance(splits, list) and all(isinstance(x, str) for x in splits)
    except (ValueError, KeyError, TypeError, AssertionError):
        raise ValueError(f"data.path={source.path!r}: its dataset_dict.json holds no list of splits; {fix}") from None
    chosen = split or "train"
    if chosen not in splits:
        said = f"data.split={split!r} is not a split of" if split else "data.split='' reads the train split, and there is none in"
        raise ValueError(f"{said} data.path={source.path!r} (its splits: {', '.join(sorted(splits)) or 'none'}); "
                         "set data.split to one of them")
    return Source(source.path, source.kind, source.files, chosen)


def _where(source: Source, path: str) -> str:
    """How a refusal names the file `path` of `source`: data.path, and the file under a folder."""
    if path == source.path:
        return f"data.path={source.path!r}"
    return f"data.path={source.path!r}: {os.path.relpath(path, source.path)!r}"


def iter_rows(source: Source, *, column: str, field: str) -> Iterator[tuple[Any, str]]:
    """(each row's `column` value, where the row is: data.path, file, line or row), in order.
    `field` names the setting that chose the column (data.text_field, data.messages_field), for
    the refusal of a missing one. A .txt file is one row, its text as an iterator of chunks."""
    if source.kind == "saved":
        yield from _saved_rows(source, column=column, field=field)
        return
    for path in source.files:
        where = _where(source, path)
        if source.kind == "text":
            yield text_chunks(path, where=where), where
        elif source.kind == "parquet":
            yield from _parquet_rows(path, column=column, field=field, where=where)
        else:
            for row, at in json_rows(path, where=where):
                yield _column(row, column=column, field=field, where=at), at


def _missing(field: str, column: str, where: str, columns) -> ValueError:
    cols = sorted(str(c) for c in columns)
    other = ("; for conversations set data.format=chat" if field == "data.text_field" and "messages" in cols
             else "")
    return ValueError(f"{field}={column!r} is not a column of {where} (its columns: {', '.join(cols) or 'none'}); "
                      f"set {field} to the one holding the text{other}")


def _arrow_values(batches, *, column: str, field: str, where: str) -> Iterator[tuple[Any, str]]:
    """Each value of the Arrow record batches' first column, made a Python value one at a time
    after its size is checked (a string bigger than ROW_MAX_BYTES is refused, not copied)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    index = 0
    for batch in batches:
        values = batch.column(0)
        if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
            sizes = pc.fill_null(pc.binary_length(values), 0).to_pylist()
            big = next((i for i, n in enumerate(sizes) if n > ROW_MAX_BYTES), None)
            if big is not None:
                raise ValueError(f"{field}={column!r}: {where} row {index + big} holds "
                                 f"{size_text(sizes[big])} of text; {row_fix()}")
        for value in values:
            yield value.as_py(), f"{where} row {index}"
            index += 1


def _saved_rows(source: Source, *, column: str, field: str) -> Iterator[tuple[Any, str]]:
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # nothing is downloaded
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import datasets

    path, where = source.path, f"data.path={source.path!r}"
    fix = "save the dataset again with save_to_disk, or point data.path at a whole copy"
    try:
        ds = datasets.load_from_disk(path)
        if isinstance(ds, datasets.DatasetDict):
            ds, where = ds[source.split], f"{where} split {source.split!r}"
    except Exception as e:  # noqa: BLE001 - datasets and pyarrow raise their own errors for a damaged folder
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        raise ValueError(f"data.path={path!r} could not be read by datasets.load_from_disk ({first}); {fix}") from None
    if column not in ds.column_names:
        raise _missing(field, column, where, ds.column_names)
    tables = ds.select_columns([column]).with_format("arrow").iter(batch_size=ARROW_BATCH_ROWS)
    batches = (batch for t in tables for batch in t.to_batches())
    yield from _arrow_values(_damage_named(batches, where=where, fix=fix), column=column, field=field, where=where)


def _parquet_rows(path: str, *, column: str, field: str, where: str) -> Iterator[tuple[Any, str]]:
    import pyarrow.parquet as pq

    fix = "write it again (pyarrow.parquet.write_table), or point data.path at a whole copy"
    with open_file(path, field="data.path", fix=FIX, max_bytes=DATA_FILE_MAX_BYTES) as f:
        try:
            pf = pq.ParquetFile(f)
            names = pf.schema_arrow.names
        except Exception as e:  # noqa: BLE001 - pyarrow raises its own ArrowInvalid for a damaged file
            raise ValueError(f"{where} is not a readable parquet file ({e}); {fix}") from None
        if column not in names:
            raise _missing(field, column, where, names)
        batches = pf.iter_batches(batch_size=ARROW_BATCH_ROWS, columns=[column])
        yield from _arrow_values(_damage_named(batches, where=where, fix=fix), column=column, field=field,
                                 where=where)


def _damage_named(batches: Iterator, *, where: str, fix: str) -> Iterator:
    """`batches`, with pyarrow's error for a damaged page made one line naming the file."""
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except Exception as e:  # noqa: BLE001 - pyarrow raises its own errors (OSError, ArrowInvalid, ...)
            raise ValueError(f"{where} is damaged: reading it failed ({str(e).strip()[:300]}); {fix}") from None
        yield batch


def _column(row: Any, *, column: str, field: str, where: str) -> Any:
    if not isinstance(row, dict):
        raise ValueError(f"data.path: {where} is a JSON {type(row).__name__}, not an object; write one "
                         "object per row, e.g. {\"text\": \"...\"}")
    if column not in row:
        keys = sorted(str(k) for k in row)
        other = ("; for conversations set data.format=chat" if field == "data.text_field" and "messages" in keys
                 else "")
        raise ValueError(f"{field}={column!r} is not a key of {where} (its keys: {', '.join(keys) or 'none'}); "
                         f"set {field} to the key holding the text in every row, or add it to that row{other}")
    return row[column]
