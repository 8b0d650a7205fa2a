"""The ``text`` corpus: the Python language reference that ships inside CPython.

``pydoc_data.topics.topics`` (the text behind ``help("assert")`` etc.) is real English prose
with code, ~466 KB, present on every machine that runs Python, so nothing is downloaded.
Tokens are its UTF-8 bytes (vocabulary 256). The exact text, and so the fingerprint,
follows the Python version.
"""

from __future__ import annotations

import functools
import platform

import numpy as np

from trainlab.config.validate import TEXT_VOCAB_SIZE
from trainlab.data.corpus import Corpus, make_corpus

VOCAB_SIZE = TEXT_VOCAB_SIZE
"""Byte-level tokens."""


def reference_text() -> str:
    """The language reference: the topic texts joined in sorted-key order by blank lines."""
    from pydoc_data.topics import topics  # imported late: a 0.5 MB module few runs need

    return "\n\n".join(topics[key] for key in sorted(topics))


@functools.lru_cache(maxsize=4)
def text_corpus(*, val_fraction: float) -> Corpus:
    """Build (once per process and val_fraction) the byte-level text corpus."""
    data = reference_text().encode("utf-8")
    # frombuffer over immutable bytes gives a read-only array, which keeps the cached
    # corpus safe from callers writing into it.
    stream = np.frombuffer(data, dtype=np.uint8)
    return make_corpus(
        stream,
        name="text",
        vocab_size=VOCAB_SIZE,
        val_fraction=val_fraction,
        source="the text corpus",
        description=(
            f"Python {platform.python_version()} language reference (pydoc_data), "
            f"{len(data):,} UTF-8 bytes, byte-level vocab {VOCAB_SIZE}"
        ),
    )
