"""The ``hf`` corpus: a local dataset tokenized once by a local tokenizer, then read like data=tokens.

    prepare_hf(cfg)     find and check the dataset and tokenizer, tokenize into the cache unless it
                        holds them already (the driver's preflight calls it, so a gang of N
                        workers finds the tokens made and does not tokenize N times)
    hf_corpus(cfg)      the Corpus over the cached token file (memory-mapped) and its loss mask
    hf_vocab_size(cfg)  len(tokenizer), without tokenizing (for estimates)

Documents are packed into one stream with EOS after each; train.seq_len windows are cut from it
at run time (data.batches), so one cache serves every seq_len, and the last data.val_fraction of
the stream is the validation split, as for every corpus.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from pathlib import Path

from trainlab.config.schema import DataConfig
from trainlab.console import console
from trainlab.data.corpus import Corpus, make_corpus
from trainlab.data.hf_cache import (
    CachedTokens,
    DamagedCache,
    TokenWriter,
    build_cached,
    cache_dir,
    cache_key,
    open_cached,
    read_meta,
    token_dtype,
)
from trainlab.data.hf_source import Source, find_source, iter_rows
from trainlab.data.hf_tokenize import encode, load_tokenizer, tokenizer_files
from trainlab.data.token_file import MIN_TOKENS

PROGRESS_EVERY_S = 10.0
"""In a log (not a terminal), a progress line this often while tokenizing."""


def _fields(cfg: DataConfig, source: Source) -> dict:
    """The fields that change the tokens (with the input files' identities, the cache key). The
    split of a source without splits is `train`, as data.split's default was: the keys of folders
    tokenized then stay the same."""
    column = cfg.text_field if cfg.format == "text" else cfg.messages_field
    return {"format": cfg.format, "column": column, "loss_on": cfg.loss_on, "split": source.split or "train"}


def _identity_of_files(files: list[str]) -> list:
    out = []
    for f in files:
        st = os.stat(f)
        out.append((os.path.basename(f), st.st_size, st.st_mtime_ns))
    return out


def cache_folder(cfg: DataConfig) -> tuple[Path, Source]:
    """Where cfg's tokens are (or will be) cached, and its checked source: no tokenizer is loaded."""
    path, tokenizer = os.path.expanduser(cfg.path), os.path.expanduser(cfg.tokenizer)
    source = find_source(path, split=cfg.split)
    tok_id = [os.path.realpath(tokenizer), _identity_of_files(tokenizer_files(tokenizer))]
    return cache_dir(cfg.cache_dir) / cache_key(source.identity(), tok_id, _fields(cfg, source)), source


def prepare_hf(cfg: DataConfig) -> CachedTokens:
    """cfg's tokens, from the cache or tokenized into it now (once, whoever else asks meanwhile)."""
    folder, source = cache_folder(cfg)
    with contextlib.suppress(DamagedCache):  # rebuilt under the lock (build_cached)
        cached = open_cached(folder)
        if cached is not None:
            return cached
    return build_cached(folder, lambda tmp: _tokenize(cfg, source, tmp))


def _tokenize(cfg: DataConfig, source: Source, tmp: Path) -> dict:
    """Tokenize `source` into folder `tmp` (data.hf_cache's files); returns meta.json's fields."""
    tok = load_tokenizer(os.path.expanduser(cfg.tokenizer))
    vocab_size = len(tok)
    dtype = token_dtype(vocab_size)
    column = cfg.text_field if cfg.format == "text" else cfg.messages_field
    field = "data.text_field" if cfg.format == "text" else "data.messages_field"
    read = [0]  # rows read: those holding no text (null, "") are no document, and the summary says so

    def counted(rows):
        for row in rows:
            read[0] += 1
            yield row

    rows = counted(iter_rows(source, column=column, field=field))
    writer = TokenWriter(tmp, dtype=dtype, masked=cfg.loss_on == "answer")
    progress, documents = _Progress(f"tokenizing data.path={cfg.path}"), 0
    try:
        for ids, mask, docs in encode(tok, rows, fmt=cfg.format, loss_on=cfg.loss_on, field=f"{field}={column!r}"):
            writer.append(ids, mask)
            documents += docs
            progress.update(documents, writer.num_tokens)
    finally:
        writer.close()
        progress.stop()
    if writer.num_tokens < MIN_TOKENS:
        raise ValueError(f"data.path={cfg.path!r} tokenizes to {writer.num_tokens} tokens ({documents} documents); "
                         f"at least {MIN_TOKENS} are needed: check {field} and the dataset")
    if cfg.loss_on == "answer" and not writer.num_targets:
        raise ValueError(f"data.loss_on=answer: data.path={cfg.path!r} holds no assistant turn, so no token "
                         "would be trained on; use data.loss_on=all or a dataset with assistant messages")
    progress.done(documents, writer.num_tokens, empty=read[0] - documents)
    return {"num_tokens": writer.num_tokens, "num_targets": writer.num_targets, "documents": documents,
            "dtype": dtype, "vocab_size": vocab_size, "eos_id": int(tok.eos_token_id),
            "masked": cfg.loss_on == "answer", "source": cfg.path, "tokenizer": cfg.tokenizer,
            **_fields(cfg, source)}


class _Progress:
    """Tokenizing's progress: a live rich line on a terminal, else a line every PROGRESS_EVERY_S."""

    def __init__(self, what: str):
        self.what, self._t0, self._last = what, time.perf_counter(), time.perf_counter()
        self._live = None
        if console.is_terminal:
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._live = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                  console=console, transient=True)
            self._task = self._live.add_task(what)
            self._live.start()

    def update(self, documents: int, tokens: int) -> None:
        text = f"{self.what}: {documents:,} documents, {tokens:,} tokens"
        if self._live is not None:
            self._live.update(self._task, description=text)
        elif time.perf_counter() - self._last >= PROGRESS_EVERY_S:
            self._last = time.perf_counter()
            console.print(text)

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def done(self, documents: int, tokens: int, *, empty: int = 0) -> None:
        """The summary line; `empty`: rows that held no text (null or ""), left out."""
        skipped = f" ({empty:,} row{'s' * (empty != 1)} with no text left out)" if empty > 0 else ""
        console.print(f"{self.what}: {documents:,} documents{skipped}, {tokens:,} tokens in "
                      f"{time.perf_counter() - self._t0:.1f} s (cached for the next run)")


def hf_corpus(cfg: DataConfig) -> Corpus:
    """The Corpus of cfg's cached tokens (tokenized first if not cached yet)."""
    cached = prepare_hf(cfg)
    m = cached.meta
    targets = f", loss on {m['num_targets']:,} answer tokens" if m["masked"] else ""
    return make_corpus(
        cached.tokens,
        mask=cached.mask,
        name="hf",
        vocab_size=cached.vocab_size,
        val_fraction=float(cfg.val_fraction),
        source=f"data.path={cfg.path!r}",
        description=(f"{cfg.path} tokenized by {cfg.tokenizer} ({m['documents']:,} documents, format {m['format']}, "
                     f"vocab {cached.vocab_size}{targets})"),
    )


def hf_vocab_size(cfg: DataConfig) -> int:
    """The tokenizer's vocabulary: from the cache when it holds cfg's tokens, else the tokenizer
    loaded (not run)."""
    folder, _ = cache_folder(cfg)
    with contextlib.suppress(DamagedCache):  # then the tokenizer says
        meta = read_meta(folder)
        if meta is not None:
            return int(meta["vocab_size"])
    return _tokenizer_len(os.path.realpath(os.path.expanduser(cfg.tokenizer)))


@functools.lru_cache(maxsize=8)
def _tokenizer_len(path: str) -> int:
    return len(load_tokenizer(path))
