"""data=hf's tokenizer: a local folder loaded offline, and documents or conversations encoded into
one packed stream (EOS between documents) with a loss mask for data.loss_on=answer.

A conversation is rendered by the tokenizer's chat template. Its answer spans are found by
rendering it a turn at a time: the text before an assistant turn is the template of the messages
before it with the generation prompt, and the turn ends where the template of the messages up to
it ends. The conversation is tokenized as these pieces (prompt, answer, prompt, ...), each on its
own, so a token never straddles a prompt and an answer; answer tokens get mask 1, the rest 0.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from trainlab.vocab.files import check_file
from trainlab.vocab.hub import hub_refusal, looks_like_hub_name

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model", "spiece.model",
                   "sentencepiece.bpe.model", "chat_template.jinja", "chat_template.json", "config.json")
"""Files AutoTokenizer.from_pretrained may read from a folder: each present one is checked first."""
TOKENIZER_FILE_MAX_BYTES = 1 << 30
"""1 GiB per tokenizer file: the largest vocabularies' tokenizer.json are tens of MB."""
FIX = "point data.tokenizer at a local tokenizer folder (tokenizer.save_pretrained(DIR) writes one)"
PIECE_CHARS = 1 << 16
"""A document is given to the tokenizer in pieces of at most 64 Ki characters (cut_text): a fast
tokenizer holds about 200 bytes per character of a call's text (measured: a 40 MB document in one
call took 7 GB), so no piece, and no call, grows with the document."""
BATCH_CHARS = 1 << 18
"""Characters a tokenizer call is given (about 50 MB held by it), several pieces or documents:
a fast tokenizer encodes a batch on all cores."""
BATCH_PIECES = 512
"""Pieces a tokenizer call is given at most (short documents are one piece each)."""


def tokenizer_files(path: str) -> list[str]:
    """The tokenizer files in folder `path`, each checked (vocab.files); ValueError for a Hub name
    with no local copy, a missing path, a file, or a folder holding no tokenizer."""
    if not os.path.lexists(path):
        if looks_like_hub_name(path):
            raise ValueError(hub_refusal("data.tokenizer", path, repo_type="model"))
        check_file(path, field="data.tokenizer", fix=FIX, max_bytes=None)  # raises: does not exist
    if not os.path.isdir(path):
        check_file(path, field="data.tokenizer", fix=FIX, max_bytes=TOKENIZER_FILE_MAX_BYTES)  # FIFOs, devices
        raise ValueError(f"data.tokenizer={path!r} is a file, not a tokenizer folder; set data.tokenizer to "
                         f"the folder holding it ({os.path.dirname(path) or '.'}) with its tokenizer_config.json")
    found = [str(Path(path) / name) for name in TOKENIZER_FILES if os.path.lexists(Path(path) / name)]
    for f in found:
        check_file(f, field="data.tokenizer", fix=FIX, max_bytes=TOKENIZER_FILE_MAX_BYTES)
    if not any(Path(f).name != "config.json" for f in found):
        raise ValueError(f"data.tokenizer={path!r} holds no tokenizer files (tokenizer.json, "
                         f"tokenizer_config.json, ...); {FIX}")
    return found


def load_tokenizer(path: str) -> Any:
    """AutoTokenizer.from_pretrained(path, local_files_only=True) after tokenizer_files' checks;
    it must have an EOS token (the separator between documents)."""
    tokenizer_files(path)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - transformers raises OSError, ValueError, KeyError, ... for a bad folder
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"data.tokenizer={path!r} could not be loaded ({first[:300]}); {FIX}") from None
    if tok.eos_token_id is None:
        raise ValueError(f"data.tokenizer={path!r} has no EOS token, which separates documents; set one "
                         "(tokenizer.eos_token = '...'; tokenizer.save_pretrained(DIR)) and point data.tokenizer there")
    return tok


def chat_pieces(tok: Any, messages: Any, *, answer_only: bool, where: str) -> list[tuple[str, int]]:
    """A conversation as (text, is_answer) pieces that join into its chat-template rendering; one
    piece, marked 1, when the loss is on every token."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise ValueError(f"data.messages_field: {where} is not a list of {{role, content}} messages; "
                         "point data.messages_field at the column of conversations")
    if getattr(tok, "chat_template", None) is None:
        raise ValueError("data.format=chat needs a chat template, and data.tokenizer has none; use a "
                         "tokenizer with one (tokenizer_config.json chat_template) or data.format=text")

    def render(msgs: list, prompt: bool) -> str:
        return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=prompt)

    full = render(messages, False)
    if not answer_only:
        return [(full, 1)]
    pieces, pos = [], 0
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start, end = len(render(messages[:i], True)), len(render(messages[:i + 1], False))
        if not (pos <= start <= end <= len(full)):
            raise ValueError("data.loss_on=answer: the chat template of data.tokenizer renders a conversation "
                             "differently turn by turn, so its answers cannot be located; use data.loss_on=all")
        pieces += [(full[pos:start], 0), (full[start:end], 1)]
        pos = end
    pieces.append((full[pos:], 0))
    return [(text, mark) for text, mark in pieces if text]


def cut_text(chunks: Iterable[str], *, limit: int | None = None) -> Iterator[str]:
    """The text of `chunks` in pieces of at most `limit` characters, each cut before a run of blanks
    in its second half where there is one: a tokenizer that splits words at blanks (byte-level
    BPE, a Metaspace SentencePiece) gives the pieces the tokens of the whole text. A run of
    `limit` characters without a blank is cut inside it (the tokens at that cut may differ from
    the whole text's). `limit`: PIECE_CHARS unless given."""
    limit = limit or PIECE_CHARS
    buf = ""
    for chunk in chunks:
        buf = buf + chunk if buf else chunk
        start = 0
        while len(buf) - start > limit:
            lo, hi = start + limit // 2, start + limit
            end = max(buf.rfind(" ", lo, hi), buf.rfind("\n", lo, hi))
            while end > start and buf[end - 1].isspace():  # to the run's start: BPE merges a run of blanks
                end -= 1
            end = end if end > start else hi
            yield buf[start:end]
            start = end
        buf = buf[start:]
    if buf:
        yield buf


def encode(tok: Any, rows: Iterable[tuple[Any, str]], *, fmt: str, loss_on: str,
           field: str) -> Iterator[tuple[np.ndarray, np.ndarray | None, int]]:
    """(token ids, mask or None, documents ended) for each batch of pieces, in order: every
    document's tokens followed by EOS (unless they end in it). `rows` are (value, where it is);
    `field` is the setting that chose the values (data.text_field='text'), for a refusal. The mask
    (int8, 1 = a target) exists with loss_on=answer; EOS separators are not targets there.

    Memory: the tokenizer gets pieces of at most PIECE_CHARS characters, at most BATCH_CHARS (and
    BATCH_PIECES pieces) a call, so what it holds is bounded whatever a document's length."""
    packer = _Packer(tok, answer_only=loss_on == "answer")
    for value, where in rows:
        ended = False
        for text, mark in _pieces(tok, value, fmt=fmt, answer_only=packer.answer_only, where=where, field=field):
            if packer.full(len(text)):  # before adding: the document's last piece waits for its end mark
                yield packer.flush()
            packer.add(text, mark)
            ended = True
        if ended:
            packer.end_document()
    if packer.texts:
        yield packer.flush()


def _pieces(tok: Any, value: Any, *, fmt: str, answer_only: bool, where: str, field: str) -> Iterator[tuple[str, int]]:
    """One row's (text, is_answer) pieces, each at most PIECE_CHARS; none for an empty document."""
    if fmt == "chat":
        parts = chat_pieces(tok, value, answer_only=answer_only, where=where)
    elif isinstance(value, str):
        parts = [(value, 1)] if value else []
    elif value is None:
        parts = []  # a missing text is an empty document
    elif isinstance(value, Iterator):  # a .txt file's text, read a chunk at a time
        yield from ((piece, 1) for piece in cut_text(value))
        return
    else:
        shown = repr(value)
        kind = type(value).__name__
        raise ValueError(f"{field}: {where} holds {'an' if kind[0] in 'aeiou' else 'a'} {kind} "
                         f"({shown[:40] + '...' if len(shown) > 40 else shown}), not text; set it to the key "
                         "holding the text (data.format=chat for conversations), or fix that row")
    for text, mark in parts:
        yield from ((piece, mark) for piece in cut_text([text]))


class _Packer:
    """Pieces waiting for the tokenizer, and the stream state that spans its calls."""

    def __init__(self, tok: Any, *, answer_only: bool):
        self.tok, self.answer_only, self.eos = tok, answer_only, int(tok.eos_token_id)
        self.texts: list[str] = []
        self.marks: list[int] = []
        self.ends: list[bool] = []
        self.chars = 0
        self.last = -1  # the last token out, across calls: a document ending in EOS gets no second one

    def full(self, more: int) -> bool:
        """Adding `more` characters would pass BATCH_CHARS (or BATCH_PIECES pieces)."""
        return bool(self.texts) and (self.chars + more > BATCH_CHARS or len(self.texts) >= BATCH_PIECES)

    def add(self, text: str, mark: int) -> None:
        self.texts.append(text)
        self.marks.append(mark)
        self.ends.append(False)
        self.chars += len(text)

    def end_document(self) -> None:
        self.ends[-1] = True

    def flush(self) -> tuple[np.ndarray, np.ndarray | None, int]:
        ids = self.tok(self.texts, add_special_tokens=False, verbose=False, return_attention_mask=False,
                       return_token_type_ids=False)["input_ids"]
        out_ids: list[int] = []
        out_mask: list[int] = []
        documents = 0
        for piece, mark, end in zip(ids, self.marks, self.ends, strict=True):
            out_ids += piece
            out_mask += [mark] * len(piece) if self.answer_only else []
            if end:
                documents += 1
                if (out_ids[-1] if out_ids else self.last) != self.eos:
                    out_ids.append(self.eos)
                    out_mask += [0] if self.answer_only else []
        self.last = out_ids[-1] if out_ids else self.last
        self.texts, self.marks, self.ends, self.chars = [], [], [], 0
        return (np.asarray(out_ids, dtype=np.int64),
                np.asarray(out_mask, dtype=np.int8) if self.answer_only else None, documents)
