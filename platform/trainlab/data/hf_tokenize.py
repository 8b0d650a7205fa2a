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
BATCH_DOCUMENTS = 512
"""Documents tokenized per call (a fast tokenizer encodes a batch on all cores)."""


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


def encode(tok: Any, rows: Iterable[Any], *, fmt: str, loss_on: str,
           where: str) -> Iterator[tuple[np.ndarray, np.ndarray | None, int]]:
    """(token ids, mask or None, documents) for each batch of rows, in order: every document's tokens
    followed by EOS (unless they end in it). The mask (int8, 1 = a target) exists with
    loss_on=answer; EOS separators are not targets there."""
    eos = int(tok.eos_token_id)
    answer_only = loss_on == "answer"
    batch: list[Any] = []
    for number, row in enumerate(rows):
        batch.append((number, row))
        if len(batch) == BATCH_DOCUMENTS:
            yield _encode_batch(tok, batch, fmt=fmt, answer_only=answer_only, eos=eos, where=where)
            batch = []
    if batch:
        yield _encode_batch(tok, batch, fmt=fmt, answer_only=answer_only, eos=eos, where=where)


def _encode_batch(tok: Any, batch: list, *, fmt: str, answer_only: bool, eos: int,
                  where: str) -> tuple[np.ndarray, np.ndarray | None, int]:
    docs: list[list[tuple[str, int]]] = []
    for number, row in batch:
        if fmt == "chat":
            docs.append(chat_pieces(tok, row, answer_only=answer_only, where=f"{where} row {number}"))
        elif isinstance(row, str):
            docs.append([(row, 1)] if row else [])
        elif row is None:
            docs.append([])  # a missing text is an empty document
        else:
            raise ValueError(f"data.text_field: {where} row {number} holds a {type(row).__name__}, not text; "
                             "point data.text_field at a text column (or data.format=chat for conversations)")
    flat = [text for pieces in docs for text, _ in pieces]
    ids = tok(flat, add_special_tokens=False)["input_ids"] if flat else []
    out_ids: list[int] = []
    out_mask: list[int] = []
    k, documents = 0, 0
    for pieces in docs:
        if not pieces:
            continue
        documents += 1
        for _, mark in pieces:
            out_ids += ids[k]
            out_mask += [mark] * len(ids[k])
            k += 1
        if not out_ids or out_ids[-1] != eos:
            out_ids.append(eos)
            out_mask.append(0)
    return (np.asarray(out_ids, dtype=np.int64),
            np.asarray(out_mask, dtype=np.int8) if answer_only else None, documents)
