"""Deterministic, resumable, data-parallel batching of a token stream.

A *window* is seq_len + 1 consecutive tokens starting at a multiple of seq_len (so windows
overlap by the one token that is a target in one and an input in the next); input is
window[:-1], target window[1:]. Windows are the samples.

Training order is one global stream of window indices, independent of the data-parallel
layout: epoch e is a permutation seeded by (seed, e), and epochs follow each other. Each
optimizer step takes the next global_batch_size indices; rank r of dp_size takes the
contiguous slice [r*L, (r+1)*L), L = global_batch_size // dp_size, as L // micro_batch_size
micro-batches. So ranks 0..dp_size-1 concatenated see exactly what one process sees, which
is what makes an N-rank data-parallel run equal a one-process run with gradient
accumulation.

Uneven shares (parallel.dp_balance, trainlab.engine.balance): after set_shares(n_0..n_{dp-1})
rank r takes the slice [n_0 + ... + n_{r-1}, n_0 + ... + n_r) of the same global batch, cut
into a given number of near-equal micro-batches. The global order does not change.
"""

from __future__ import annotations

import numpy as np
import torch

Batch = tuple[torch.Tensor, torch.Tensor]
"""(input, target), each (micro_batch_size, seq_len) int64."""

IGNORE_INDEX = -100
"""The target of a masked token (data.loss_on=answer): F.cross_entropy's default ignore_index."""

_STATE_VERSION = 1


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value <= 0:
            raise ValueError(f"{name}={value} must be a positive integer; set {name} above 0")


def _check_rank(dp_rank: int, dp_size: int) -> None:
    if not 0 <= dp_rank < dp_size:
        raise ValueError(f"dp_rank={dp_rank} must lie in [0, dp_size={dp_size})")


def num_windows(num_tokens: int, seq_len: int) -> int:
    """Windows of seq_len + 1 tokens starting at multiples of seq_len."""
    return max(0, (num_tokens - 1) // seq_len)


def _gather(tokens: np.ndarray, windows: np.ndarray, *, seq_len: int,
            mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) as contiguous int64 arrays, (len(windows), seq_len) each; a target whose
    `mask` entry is 0 is IGNORE_INDEX.

    One fancy-indexing read for all windows: cheap enough to run every micro-step, and on a
    memmap it touches only the pages the windows live on.
    """
    index = windows[:, None] * seq_len + np.arange(seq_len + 1)
    rows = tokens[index]
    rows = rows.astype(np.int64, copy=False)
    # Contiguous copies: losses commonly call target.view(-1), which a strided slice refuses.
    inputs, targets = np.ascontiguousarray(rows[:, :-1]), np.ascontiguousarray(rows[:, 1:])
    if mask is not None:
        targets[mask[index[:, 1:]] == 0] = IGNORE_INDEX
    return inputs, targets


def _as_mask(mask: np.ndarray | None, tokens: np.ndarray) -> np.ndarray | None:
    if mask is None:
        return None
    mask = np.asarray(mask)
    if mask.shape != tokens.shape:
        raise ValueError(f"the loss mask has {mask.shape} entries but the token stream {tokens.shape}; "
                         "they must be the same length (one entry per token)")
    return mask


def _as_batches(inputs: np.ndarray, targets: np.ndarray, micro_batch_size: int | list[int]) -> list[Batch]:
    """Micro-batches of `micro_batch_size` rows each (or of the listed sizes, as torch.split)."""
    x, y = torch.from_numpy(inputs), torch.from_numpy(targets)
    return list(zip(x.split(micro_batch_size), y.split(micro_batch_size)))


class TokenBatches:
    """This rank's training micro-batches, one optimizer step at a time.

    ``tokens`` is the train split (may be a memmap; it is never copied whole). Sizes count
    sequences; ``seed`` fixes the order (use the run seed). ``mask`` (same length, 0 = not a
    target) makes the targets at its zeros IGNORE_INDEX; the order and the inputs are the same
    with or without it.
    """

    def __init__(
        self,
        tokens: np.ndarray,
        *,
        seq_len: int,
        global_batch_size: int,
        micro_batch_size: int,
        dp_rank: int,
        dp_size: int,
        seed: int,
        mask: np.ndarray | None = None,
    ) -> None:
        # np.asarray drops the memmap subclass but keeps the mapping (no copy), so fancy
        # indexing returns plain ndarrays.
        self._tokens = np.asarray(tokens)
        assert self._tokens.ndim == 1 and np.issubdtype(self._tokens.dtype, np.integer)
        self._mask = _as_mask(mask, self._tokens)
        _check_positive(**{
            "train.seq_len": seq_len,
            "train.global_batch_size": global_batch_size,
            "train.micro_batch_size": micro_batch_size,
            "dp_size": dp_size,
        })
        _check_rank(dp_rank, dp_size)
        if seed < 0:
            raise ValueError(f"seed={seed} must be >= 0 to seed the data order")
        per_step = micro_batch_size * dp_size
        if global_batch_size % per_step:
            below = global_batch_size // per_step * per_step
            nearest = " or ".join(str(m) for m in (below, below + per_step) if m > 0)
            raise ValueError(
                f"train.global_batch_size={global_batch_size} is not divisible by "
                f"train.micro_batch_size x data-parallel size = {micro_batch_size} x {dp_size} "
                f"= {per_step}; set train.global_batch_size to a multiple of {per_step} "
                f"(e.g. {nearest}) or change train.micro_batch_size"
            )
        n = num_windows(len(self._tokens), seq_len)
        if n < 1:
            raise ValueError(
                f"the train split holds {len(self._tokens)} tokens, fewer than one sequence of "
                f"train.seq_len+1={seq_len + 1}; lower train.seq_len or use a longer corpus"
            )
        if n < global_batch_size:
            raise ValueError(
                f"the train split holds {n} sequences of train.seq_len={seq_len} tokens, fewer "
                f"than train.global_batch_size={global_batch_size}; lower "
                "train.global_batch_size or train.seq_len, or use a longer corpus"
            )
        self.seq_len = seq_len
        self.global_batch_size = global_batch_size
        self.micro_batch_size = micro_batch_size
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.seed = seed
        self.num_windows = n
        """Samples per epoch."""
        self.per_rank = global_batch_size // dp_size
        """Sequences this rank handles per optimizer step."""
        self.accum_steps = self.per_rank // micro_batch_size
        """Micro-batches per optimizer step on this rank (gradient accumulation)."""
        # Position in the global stream: permutation `epoch`, next index `offset` in it.
        self._epoch = 0
        self._offset = 0
        self._step = 0
        self._perm: np.ndarray | None = None
        self._perm_epoch = -1
        self._start: int | None = None  # set_shares: where this rank's slice of the batch begins

    @property
    def balanced(self) -> bool:
        """True once set_shares was called: micro-batch sizes then vary across ranks."""
        return self._start is not None

    def set_shares(self, shares: list[int], *, num_micro_batches: int) -> None:
        """From the next step on, rank r takes shares[r] sequences of each global batch (the
        ranks' slices in rank order), as `num_micro_batches` near-equal micro-batches."""
        if len(shares) != self.dp_size or sum(shares) != self.global_batch_size:
            raise ValueError(f"shares {list(shares)} must be {self.dp_size} numbers (one per data-"
                             f"parallel rank) summing to train.global_batch_size={self.global_batch_size}")
        mine = shares[self.dp_rank]
        if not 1 <= num_micro_batches <= mine:
            raise ValueError(f"rank {self.dp_rank}'s share of {mine} sequences cannot be cut into "
                             f"{num_micro_batches} micro-batches of at least one sequence")
        lo = sum(shares[:self.dp_rank])
        self._start = lo
        self.per_rank = mine
        self.accum_steps = num_micro_batches

    @property
    def tokens_per_step(self) -> int:
        """Target tokens per optimizer step, summed over all ranks."""
        return self.global_batch_size * self.seq_len

    @property
    def step(self) -> int:
        """Optimizer steps served so far."""
        return self._step

    @property
    def epoch(self) -> float:
        """Passes over the train split so far (fractional)."""
        return self._epoch + self._offset / self.num_windows

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._perm_epoch:
            # Seeded by (seed, epoch) alone, so any position can be rebuilt on resume.
            rng = np.random.default_rng([self.seed, epoch])
            self._perm = rng.permutation(self.num_windows)
            self._perm_epoch = epoch
        assert self._perm is not None
        return self._perm

    def _take(self, count: int) -> np.ndarray:
        """The next ``count`` window indices of the global stream, crossing epochs."""
        parts = []
        while count:
            perm = self._permutation(self._epoch)
            part = perm[self._offset:self._offset + count]
            parts.append(part)
            count -= len(part)
            self._offset += len(part)
            if self._offset == self.num_windows:
                self._epoch, self._offset = self._epoch + 1, 0
        return np.concatenate(parts)

    def next_step(self) -> list[Batch]:
        """This rank's ``accum_steps`` micro-batches for one optimizer step."""
        # Every rank walks the whole global stream, so all ranks hold the same state.
        global_batch = self._take(self.global_batch_size)
        self._step += 1
        if self._start is None:  # equal shares of micro_batch_size-sequence micro-batches
            lo, sizes = self.dp_rank * self.per_rank, self.micro_batch_size
        else:  # set_shares: accum_steps near-equal micro-batches of this rank's slice
            lo = self._start
            k, extra = divmod(self.per_rank, self.accum_steps)
            sizes = [k + (i < extra) for i in range(self.accum_steps)]
        inputs, targets = _gather(self._tokens, global_batch[lo:lo + self.per_rank], seq_len=self.seq_len,
                                  mask=self._mask)
        return _as_batches(inputs, targets, sizes)

    def state_dict(self) -> dict:
        """Position in the stream as plain ints (JSON-safe). The position is counted in
        global windows, so it is the same on every rank and survives a change of dp_size."""
        return {
            "version": _STATE_VERSION,
            "epoch": self._epoch,
            "offset": self._offset,
            "step": self._step,
            "seed": self.seed,
            "num_windows": self.num_windows,
            "seq_len": self.seq_len,
        }

    def load_state_dict(self, state: dict) -> None:
        """Resume at ``state``; refuses a state from another seed, corpus or seq_len, which
        would silently replay a different order."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(
                f"data loader state version {state.get('version')!r} is not "
                f"{_STATE_VERSION}; this checkpoint was written by another trainlab version"
            )
        for key in ("seed", "num_windows", "seq_len"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"data loader state has {key}={state[key]} but this loader has "
                    f"{key}={getattr(self, key)}; resume with the seed, corpus and "
                    "train.seq_len of the checkpointed run"
                )
        if not 0 <= state["offset"] < self.num_windows or state["epoch"] < 0:
            raise ValueError(f"data loader state position {state['epoch']}:{state['offset']} is invalid")
        self._epoch = int(state["epoch"])
        self._offset = int(state["offset"])
        self._step = int(state["step"])


def val_batches(
    tokens: np.ndarray,
    *,
    seq_len: int,
    micro_batch_size: int,
    num_batches: int,
    dp_rank: int,
    dp_size: int,
    mask: np.ndarray | None = None,
) -> list[Batch]:
    """A fixed held-out set: this rank's share of the first windows of the val split (targets
    IGNORE_INDEX where `mask` is 0, as TokenBatches).

    The set is the first num_batches * micro_batch_size * dp_size windows (fewer, in whole
    rounds of micro_batch_size * dp_size, if the split is short); rank r takes windows
    r, r + dp_size, ..., so ranks are disjoint, cover the set together and get equally many
    full batches (a collective per batch then never waits on a rank that has run out).
    """
    tokens = np.asarray(tokens)
    assert tokens.ndim == 1 and np.issubdtype(tokens.dtype, np.integer)
    _check_positive(**{
        "train.seq_len": seq_len,
        "train.micro_batch_size": micro_batch_size,
        "train.eval_batches": num_batches,
        "dp_size": dp_size,
    })
    _check_rank(dp_rank, dp_size)
    per_round = micro_batch_size * dp_size
    available = num_windows(len(tokens), seq_len)
    rounds = min(num_batches, available // per_round)
    if rounds < 1:
        raise ValueError(
            f"the val split holds {len(tokens)} tokens = {available} sequences of "
            f"train.seq_len={seq_len}, fewer than one batch on every rank "
            f"(train.micro_batch_size x dp size = {per_round}); raise data.val_fraction, "
            "or lower train.seq_len or train.micro_batch_size"
        )
    windows = np.arange(dp_rank, rounds * per_round, dp_size)
    inputs, targets = _gather(tokens, windows, seq_len=seq_len, mask=_as_mask(mask, tokens))
    return _as_batches(inputs, targets, micro_batch_size)
