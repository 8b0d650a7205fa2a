"""The :class:`Corpus` record and the helpers every source uses to make one.

A corpus is a 1-D stream of integer token ids split once, at its end, into train and val.
Sources (text, markov, tokens, hf) only produce the stream (hf: and a loss mask); splitting, fingerprinting and the
unigram entropy are computed here so every source gets them the same way.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

# Elements per chunk when scanning a stream (hashing, counting, range checks): bounds the
# temporary memory of a scan over a memory-mapped file to ~100 MiB whatever its size.
SCAN_CHUNK = 1 << 24


def iter_chunks(tokens: np.ndarray, chunk: int = SCAN_CHUNK):
    """Yield consecutive contiguous slices of a 1-D array, at most ``chunk`` elements each."""
    for start in range(0, len(tokens), chunk):
        yield tokens[start:start + chunk]


# eq=False: the fields hold arrays, so generated __eq__/__hash__ would raise; compare
# corpora by `fingerprint` instead.
@dataclass(frozen=True, eq=False)
class Corpus:
    """A tokenized corpus, split into train and val.

    ``train`` and ``val`` may be slices of one ``np.memmap`` (never copied into RAM).
    """

    train: np.ndarray = field(repr=False)
    """1-D integer token ids for training (the first 1 - data.val_fraction of the stream)."""
    val: np.ndarray = field(repr=False)
    """1-D integer token ids held out for validation (the last data.val_fraction)."""
    vocab_size: int
    """Every token id is < vocab_size."""
    name: str
    """The source kind (data.name): text, markov, tokens or hf."""
    fingerprint: str
    """16 hex chars of sha256 over name, vocab size, dtype, split point and all token bytes."""
    unigram_entropy: float
    """Empirical entropy of the token frequencies of the train split, nats/token."""
    true_entropy: float | None
    """Exact entropy rate of the source in nats/token (markov only; None otherwise)."""
    description: str
    """One line for humans."""
    train_mask: np.ndarray | None = field(default=None, repr=False)
    """data.loss_on=answer: 1 where the train token at that position is a target, 0 where it is
    masked (batches give it target -100); None: every token is a target."""
    val_mask: np.ndarray | None = field(default=None, repr=False)
    """The val split's mask, as train_mask."""

    def __post_init__(self) -> None:
        for split in (self.train, self.val):
            assert split.ndim == 1 and np.issubdtype(split.dtype, np.integer), split.dtype
        for split, mask in ((self.train, self.train_mask), (self.val, self.val_mask)):
            assert mask is None or mask.shape == split.shape, (None if mask is None else mask.shape, split.shape)

    @property
    def num_tokens(self) -> int:
        """Tokens in both splits together."""
        return len(self.train) + len(self.val)


def split_point(*, num_tokens: int, val_fraction: float, source: str) -> int:
    """Index where val starts: the last ``val_fraction`` of the stream is val.

    Both splits must keep at least 2 tokens (one input/target pair); ``source`` names where
    the stream came from in the error message.
    """
    n_val = int(round(num_tokens * val_fraction))
    n_train = num_tokens - n_val
    if n_val < 2 or n_train < 2:
        raise ValueError(
            f"{source} holds {num_tokens} tokens; data.val_fraction={val_fraction} splits it "
            f"into {n_train} train / {n_val} val tokens, and each split needs at least 2; "
            "use a longer corpus or adjust data.val_fraction"
        )
    return n_train


def fingerprint(*, name: str, vocab_size: int, train: np.ndarray, val: np.ndarray,
                mask: np.ndarray | None = None) -> str:
    """16 hex chars identifying the corpus: two corpora differing in any token, the dtype,
    the split point, the vocabulary, the name or the loss mask never share it (up to sha256
    collisions). A corpus without a mask hashes as it did before masks existed."""
    h = hashlib.sha256()
    # The header fixes how the token bytes are read, so equal bytes under another dtype or
    # split point hash differently.
    h.update(f"{name}|{vocab_size}|{train.dtype.str}|{len(train)}|{len(val)}|".encode())
    for split in (train, val):
        for chunk in iter_chunks(split):
            h.update(np.ascontiguousarray(chunk).data)
    if mask is not None:
        h.update(b"mask|")
        for chunk in iter_chunks(mask):
            h.update(np.ascontiguousarray(chunk).data)
    return h.hexdigest()[:16]


def unigram_entropy(tokens: np.ndarray, *, vocab_size: int) -> float:
    """Empirical entropy of the token frequencies, nats/token (0 for an empty array)."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for chunk in iter_chunks(tokens):
        counts += np.bincount(chunk, minlength=vocab_size)[:vocab_size]
    total = counts.sum()
    if total == 0:
        return 0.0
    p = counts[counts > 0] / total
    return float(-(p * np.log(p)).sum())


def make_corpus(
    stream: np.ndarray,
    *,
    name: str,
    vocab_size: int,
    val_fraction: float,
    source: str,
    description: str,
    true_entropy: float | None = None,
    mask: np.ndarray | None = None,
) -> Corpus:
    """Split ``stream`` (and its loss ``mask``, 1 = a target, if any) and compute the derived
    fields of a :class:`Corpus`.

    ``stream`` is not copied (a memmap stays a memmap); ``description`` gets the split sizes
    appended.
    """
    assert stream.ndim == 1 and np.issubdtype(stream.dtype, np.integer), stream.dtype
    assert mask is None or mask.shape == stream.shape, (mask.shape, stream.shape)
    cut = split_point(num_tokens=len(stream), val_fraction=val_fraction, source=source)
    train, val = stream[:cut], stream[cut:]
    return Corpus(
        train=train,
        val=val,
        train_mask=None if mask is None else mask[:cut],
        val_mask=None if mask is None else mask[cut:],
        vocab_size=vocab_size,
        name=name,
        fingerprint=fingerprint(name=name, vocab_size=vocab_size, train=train, val=val, mask=mask),
        unigram_entropy=unigram_entropy(train, vocab_size=vocab_size),
        true_entropy=true_entropy,
        description=f"{description}; {len(train):,} train / {len(val):,} val tokens",
    )
