"""data=hf's text data files, read in bounded memory, refused at the line where they are damaged.

    json_rows(path, where=...)    each row of a JSON lines file, or of a .json file holding one
                                  JSON array (streamed: the array is never held whole)
    text_chunks(path, where=...)  a .txt file (one document) as UTF-8 text of TEXT_CHUNK_BYTES a piece

Memory: a JSON row is read whole, so a row may be ROW_MAX_BYTES at most (bigger is refused with
the fix: split it into rows); a .txt document is streamed, so it has no bound but the file's.
Every refusal is one line naming data.path (and the file, for a folder), the line, what is
wrong and the fix: a byte that is not UTF-8, a line that is no JSON, a file cut short.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator
from typing import Any

from trainlab.vocab.files import open_file, size_text

ROW_MAX_BYTES = 64 << 20
"""64 MiB: one JSON line (a row) or one element of a JSON array, read whole. Parsing takes about
3 copies of it (bytes, text, the parsed string; 4 bytes a character for text beyond Latin-1), so
the driver holds at most a few hundred MB for a row, whatever the file's size."""
TEXT_CHUNK_BYTES = 1 << 20
"""A .txt file (or a JSON array) is read this many bytes at a time."""
DATA_FILE_MAX_BYTES = 1 << 40
"""1 TiB per file, as data=tokens' token file: bigger (or sparse, absurd) would tokenize for days."""
FIX = ("point data.path at a local dataset: a folder save_to_disk wrote, or .jsonl/.json/.parquet/.txt "
       "files (a folder of them)")
UTF8_FIX = ("convert it to UTF-8 into a new file (from Latin-1: iconv -f LATIN1 -t UTF-8 FILE > NEW) and point "
            "data.path at that")
CUT_FIX = "the file looks cut short (an interrupted copy or download?): copy or write it again whole"

_WS = re.compile(r"[ \t\n\r]*")


def row_fix() -> str:
    return f"a row is read whole, so it may be {size_text(ROW_MAX_BYTES)} at most: split long documents into several rows"


def _not_utf8(e: UnicodeDecodeError, *, where: str, line: int, cut: bool) -> ValueError:
    if cut:
        return ValueError(f"{where} line {line} ends in the middle of a UTF-8 character; {CUT_FIX}")
    return ValueError(f"{where} line {line} is not UTF-8 text (byte 0x{e.object[e.start]:02x}); {UTF8_FIX}")


def json_rows(path: str, *, where: str) -> Iterator[tuple[Any, str]]:
    """(row, where it is: `<where> line N`) for each row of the file: JSON lines, or one JSON array."""
    with open_file(path, field="data.path", fix=FIX, max_bytes=DATA_FILE_MAX_BYTES) as f:
        first = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")[:1]  # a UTF-8 BOM, then blanks, then [ or {
        f.seek(0)
        if first == b"[":
            yield from _array_rows(f, where=where)
        else:
            yield from _line_rows(f, where=where, array_too=path.lower().endswith(".json"))


def _line_rows(f, *, where: str, array_too: bool) -> Iterator[tuple[Any, str]]:
    number = 0
    while line := f.readline(ROW_MAX_BYTES + 1):
        number += 1
        last = not line.endswith(b"\n")
        if last and len(line) > ROW_MAX_BYTES:
            raise ValueError(f"{where} line {number} is more than {size_text(ROW_MAX_BYTES)} long; {row_fix()}")
        if not line.strip():
            continue
        try:
            text = line.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as e:
            raise _not_utf8(e, where=where, line=number, cut=last and e.end == len(line)) from None
        del line  # the row's text, not three copies of it, while it is tokenized
        try:
            row = json.loads(text)
        except json.JSONDecodeError as e:
            if last and (e.msg.startswith("Unterminated") or e.pos >= len(text.rstrip())):
                raise ValueError(f"{where} line {number}, the last, ends in the middle of a row; "
                                 f"{CUT_FIX}") from None
            fix = ("a .json file holds one JSON array of objects, or one JSON object per line" if array_too
                   else "write one JSON object per line (JSON lines), e.g. {\"text\": \"...\"}")
            raise ValueError(f"{where} line {number} is not JSON ({e.msg} at column {e.colno}); {fix}") from None
        del text
        yield row, f"{where} line {number}"


class _ArrayReader:
    """A JSON array read element by element: text decoded a chunk at a time into a window that
    holds the element being parsed (ROW_MAX_BYTES at most) and what follows it."""

    def __init__(self, f, *, where: str):
        self.f, self.where = f, where
        self.decoder = codecs.getincrementaldecoder("utf-8-sig")()
        self.buf, self.pos, self.eof = "", 0, False
        self.lines_before = 0  # newlines in the text dropped from the front of buf

    def line(self, pos: int | None = None) -> int:
        return self.lines_before + self.buf.count("\n", 0, self.pos if pos is None else pos) + 1

    def more(self, at_least: int = TEXT_CHUNK_BYTES) -> bool:
        """Read on (at least `at_least` bytes, unless the file ends); False at its end."""
        if self.eof:
            return False
        if self.pos > TEXT_CHUNK_BYTES:  # drop what is parsed
            self.lines_before += self.buf.count("\n", 0, self.pos)
            self.buf, self.pos = self.buf[self.pos:], 0
        chunk = self.f.read(max(at_least, TEXT_CHUNK_BYTES))
        self.eof = not chunk
        try:
            self.buf += self.decoder.decode(chunk, final=self.eof)
        except UnicodeDecodeError as e:
            line = self.lines_before + self.buf.count("\n") + chunk[:max(e.start, 0)].count(b"\n") + 1
            raise _not_utf8(e, where=self.where, line=line, cut=self.eof) from None
        return True

    def skip_blanks(self) -> str:
        """The next character after blanks ('' at the end of the file)."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf) or not self.more():
                return self.buf[self.pos:self.pos + 1]

    def value(self, decoder: json.JSONDecoder, index: int) -> Any:
        while True:
            try:
                row, end = decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as e:
                pending = len(self.buf) - self.pos
                if pending > ROW_MAX_BYTES:
                    raise ValueError(f"{self.where} element {index} (line {self.line()}) is more than "
                                     f"{size_text(ROW_MAX_BYTES)} long; {row_fix()}") from None
                if not self.more(at_least=pending):  # the whole file is read: the error is real
                    if e.msg.startswith("Unterminated") or e.pos >= len(self.buf.rstrip()):
                        raise ValueError(f"{self.where} ends inside element {index} of its JSON array "
                                         f"(line {self.line(e.pos)}); {CUT_FIX}") from None
                    raise self.damaged(f"{e.msg}", e.pos) from None
                continue
            if end - self.pos > ROW_MAX_BYTES:  # characters: at least as many bytes; held now, not allowed
                raise ValueError(f"{self.where} element {index} (line {self.line()}) is more than "
                                 f"{size_text(ROW_MAX_BYTES)} long; {row_fix()}")
            self.pos = end
            return row

    def damaged(self, what: str, pos: int) -> ValueError:
        return ValueError(f"{self.where} line {self.line(pos)} is not valid JSON ({what}); a .json file holds "
                          "one JSON array of objects, or one object per line (JSON lines)")


def _array_rows(f, *, where: str) -> Iterator[tuple[Any, str]]:
    r, decoder = _ArrayReader(f, where=where), json.JSONDecoder()
    r.skip_blanks()
    r.pos += 1  # the [
    index = 0
    if r.skip_blanks() == "]":
        return
    while True:
        line = r.line()
        row = r.value(decoder, index)
        yield row, f"{where} element {index} (line {line})"
        index += 1
        nxt = r.skip_blanks()
        if nxt == "]":
            return
        if nxt == "":
            raise ValueError(f"{where} ends after element {index - 1} of its JSON array, with no ]; {CUT_FIX}")
        if nxt != ",":
            raise r.damaged("expecting ',' or ']' after an element", r.pos)
        r.pos += 1
        if r.skip_blanks() == "":
            raise ValueError(f"{where} ends after element {index - 1} of its JSON array, with no ]; {CUT_FIX}")


def text_chunks(path: str, *, where: str) -> Iterator[str]:
    """A .txt file's text, TEXT_CHUNK_BYTES at a time (the tokenizer cuts it where words end)."""
    decoder = codecs.getincrementaldecoder("utf-8-sig")()
    lines = 0
    with open_file(path, field="data.path", fix=FIX, max_bytes=DATA_FILE_MAX_BYTES) as f:
        while True:
            chunk = f.read(TEXT_CHUNK_BYTES)
            try:
                text = decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as e:
                line = lines + chunk[:max(e.start, 0)].count(b"\n") + 1
                raise _not_utf8(e, where=where, line=line, cut=not chunk) from None
            lines += chunk.count(b"\n")
            if text:
                yield text
            if not chunk:
                return
