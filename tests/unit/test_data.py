"""trainlab.data: corpora, token files, training and validation batches."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from trainlab.config.schema import DataConfig
from trainlab.data import TokenBatches, build_corpus, val_batches, write_token_file


def _markov(**kw) -> DataConfig:
    base = dict(name="markov", vocab_size=16, num_tokens=200_000, concentration=0.5, seed=7)
    return DataConfig(**{**base, **kw})


def _cond_entropy(tokens: np.ndarray, vocab_size: int) -> float:
    """Plug-in H(X_t+1 | X_t) of a sample, nats."""
    t = tokens.astype(np.int64)
    counts = np.bincount(t[:-1] * vocab_size + t[1:], minlength=vocab_size**2).reshape(vocab_size, -1)
    joint = counts / counts.sum()
    cond = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    mask = counts > 0
    return float(-(joint[mask] * np.log(cond[mask])).sum())


def _loader(tokens, **kw) -> TokenBatches:
    base = dict(seq_len=8, global_batch_size=8, micro_batch_size=2, dp_rank=0, dp_size=1, seed=3)
    return TokenBatches(tokens, **{**base, **kw})


def _stack(batches) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])


# ---------------------------------------------------------------------------- corpora
def test_text_corpus_is_the_python_reference_bytes():
    c = build_corpus(DataConfig(name="text"))
    assert c.vocab_size == 256 and c.true_entropy is None
    text = bytes(np.concatenate([c.train, c.val])).decode("utf-8")
    assert "Assert statements are a convenient way" in text
    assert len(c.val) == pytest.approx(0.05 * (len(c.train) + len(c.val)), abs=1)
    # English bytes: far from uniform (8 bits = 5.55 nats), far from constant.
    assert 2.5 < c.unigram_entropy < 4.5
    assert len(c.fingerprint) == 16 and int(c.fingerprint, 16) >= 0


def test_fingerprints_are_stable_and_tell_corpora_apart():
    text = build_corpus(DataConfig(name="text"))
    assert text.fingerprint == build_corpus(DataConfig(name="text")).fingerprint
    other_split = build_corpus(DataConfig(name="text", val_fraction=0.1))
    prints = {
        text.fingerprint,
        other_split.fingerprint,
        build_corpus(_markov()).fingerprint,
        build_corpus(_markov(seed=8)).fingerprint,
        build_corpus(_markov(vocab_size=17)).fingerprint,
    }
    assert len(prints) == 5


def test_markov_true_entropy_matches_a_sample():
    c = build_corpus(_markov())
    stream = np.concatenate([c.train, c.val])
    assert len(stream) == 200_000 and stream.max() < 16
    assert c.true_entropy is not None
    assert _cond_entropy(stream, 16) == pytest.approx(c.true_entropy, abs=0.02)
    # Knowing the previous token helps: the source is not i.i.d.
    assert c.true_entropy < c.unigram_entropy - 0.1


def test_markov_is_deterministic_per_seed():
    # Bypass the cache: the same seed must regenerate the same stream, not just return it.
    from trainlab.data.markov import markov_corpus

    a = build_corpus(_markov())
    markov_corpus.cache_clear()
    b = build_corpus(_markov())
    assert a is not b and np.array_equal(a.train, b.train) and a.fingerprint == b.fingerprint
    c = build_corpus(_markov(seed=8))
    assert not np.array_equal(a.train, c.train)
    assert a.true_entropy != c.true_entropy


def test_markov_corpus_is_read_only():
    c = build_corpus(_markov())
    with pytest.raises(ValueError):
        c.train[0] = 1  # would corrupt the per-process cache


# ---------------------------------------------------------------------------- token files
def test_token_file_round_trip_is_memory_mapped(tmp_path):
    tokens = np.random.default_rng(0).integers(0, 1000, size=5000)
    path = write_token_file(tmp_path / "t.bin", tokens, "uint16")
    c = build_corpus(DataConfig(name="tokens", path=str(path), token_dtype="uint16", vocab_size=1000))
    assert isinstance(c.train, np.memmap)  # mapped, not read into RAM
    assert np.array_equal(np.concatenate([c.train, c.val]), tokens)
    assert len(c.val) == 250 and c.vocab_size == 1000
    again = build_corpus(DataConfig(name="tokens", path=str(path), token_dtype="uint16", vocab_size=1000))
    assert again.fingerprint == c.fingerprint
    tokens[0] += 1
    write_token_file(path, tokens, "uint16")
    changed = build_corpus(DataConfig(name="tokens", path=str(path), token_dtype="uint16", vocab_size=1000))
    assert changed.fingerprint != c.fingerprint


def _tokens_cfg(path, **kw) -> DataConfig:
    return DataConfig(**{**dict(name="tokens", path=str(path), token_dtype="uint16", vocab_size=1000), **kw})


def test_token_file_missing_path(tmp_path):
    with pytest.raises(ValueError, match=r"data\.path=.*does not exist"):
        build_corpus(_tokens_cfg(tmp_path / "nope.bin"))


def test_token_file_size_not_a_multiple_of_the_dtype(tmp_path):
    path = tmp_path / "t.bin"
    path.write_bytes(b"\x01" * 4001)
    with pytest.raises(ValueError, match=r"dtype is probably wrong") as err:
        build_corpus(_tokens_cfg(path))
    assert "data.token_dtype=uint16" in str(err.value)


def test_token_file_too_short(tmp_path):
    path = write_token_file(tmp_path / "t.bin", np.array([1, 2]), "uint16")
    with pytest.raises(ValueError, match=r"data\.path=.*holds 2 tokens"):
        build_corpus(_tokens_cfg(path))


def test_token_ids_above_vocab(tmp_path):
    tokens = np.arange(3000) % 700
    tokens[1234] = 4242
    path = write_token_file(tmp_path / "t.bin", tokens, "uint16")
    with pytest.raises(ValueError, match=r"token id 4242.*data\.vocab_size=4243"):
        build_corpus(_tokens_cfg(path, vocab_size=700))


def test_write_token_file_refuses_overflow(tmp_path):
    with pytest.raises(ValueError, match="uint8"):
        write_token_file(tmp_path / "t.bin", np.array([1, 300]), "uint8")


# ---------------------------------------------------------------------------- training batches
def test_batches_are_shifted_windows_of_the_stream():
    tokens = np.arange(1000, dtype=np.uint16)
    loader = _loader(tokens)
    batches = loader.next_step()
    assert len(batches) == 4 and loader.tokens_per_step == 64
    for x, y in batches:
        assert x.shape == y.shape == (2, 8) and x.dtype == y.dtype == torch.int64
        assert torch.equal(y[:, :-1], x[:, 1:])
        assert torch.equal(y[:, -1], x[:, -1] + 1)
        assert (x[:, 0] % 8 == 0).all()  # windows start at multiples of seq_len


def test_an_epoch_visits_every_window_once():
    tokens = np.arange(8 * 32 + 1, dtype=np.int32)  # 32 windows, 4 steps of 8
    loader = _loader(tokens)
    starts = torch.cat([_stack(loader.next_step())[0][:, 0] for _ in range(4)])
    assert sorted(starts.tolist()) == list(range(0, 256, 8))
    second = torch.cat([_stack(loader.next_step())[0][:, 0] for _ in range(4)])
    assert sorted(second.tolist()) == sorted(starts.tolist())
    assert not torch.equal(second, starts)  # a fresh order each epoch


@pytest.mark.parametrize("dp_size", [2, 4])
def test_ranks_together_equal_one_process(dp_size):
    tokens = build_corpus(DataConfig(name="text")).train
    kw = dict(seq_len=16, global_batch_size=16, micro_batch_size=2, seed=11)
    single = TokenBatches(tokens, dp_rank=0, dp_size=1, **kw)
    ranks = [TokenBatches(tokens, dp_rank=r, dp_size=dp_size, **kw) for r in range(dp_size)]
    for _ in range(5):
        ref_x, ref_y = _stack(single.next_step())
        per_rank = [_stack(r.next_step()) for r in ranks]
        assert torch.equal(torch.cat([x for x, _ in per_rank]), ref_x)
        assert torch.equal(torch.cat([y for _, y in per_rank]), ref_y)


def test_ranks_see_disjoint_windows():
    tokens = np.arange(8 * 64 + 1, dtype=np.int64)
    ranks = [_loader(tokens, dp_rank=r, dp_size=4) for r in range(4)]
    seen = [set(_stack(r.next_step())[0][:, 0].tolist()) for r in ranks]
    assert all(len(s) == 2 for s in seen)
    assert len(set().union(*seen)) == 8


def test_seed_changes_the_order():
    tokens = np.arange(1000, dtype=np.int64)
    assert not torch.equal(_stack(_loader(tokens, seed=1).next_step())[0],
                           _stack(_loader(tokens, seed=2).next_step())[0])


def test_resume_across_an_epoch_boundary_matches_uninterrupted():
    tokens = np.arange(8 * 10 + 1, dtype=np.int64)  # 10 windows: epochs end mid-step
    kw = dict(global_batch_size=4, micro_batch_size=2, dp_size=2, dp_rank=1)
    straight = _loader(tokens, **kw)
    expected = [_stack(straight.next_step()) for _ in range(8)]

    first = _loader(tokens, **kw)
    got = [_stack(first.next_step()) for _ in range(2)]
    state = first.state_dict()
    assert state["epoch"] == 0 and state["offset"] == 8
    resumed = _loader(tokens, **kw)
    resumed.load_state_dict(dict(state))
    got += [_stack(resumed.next_step()) for _ in range(6)]
    assert resumed.state_dict()["epoch"] == 3 and resumed.step == 8
    for (ex, ey), (gx, gy) in zip(expected, got):
        assert torch.equal(ex, gx) and torch.equal(ey, gy)


def test_resume_refuses_another_seed():
    tokens = np.arange(1000, dtype=np.int64)
    state = _loader(tokens, seed=1).state_dict()
    with pytest.raises(ValueError, match="seed"):
        _loader(tokens, seed=2).load_state_dict(state)


def test_global_batch_not_divisible_names_the_field():
    with pytest.raises(ValueError, match=r"train\.global_batch_size=10 .*multiple of 4 \(e\.g\. 8 or 12\)"):
        _loader(np.arange(1000), global_batch_size=10, micro_batch_size=2, dp_size=2)


def test_corpus_too_short_names_seq_len():
    with pytest.raises(ValueError, match=r"train\.seq_len"):
        _loader(np.arange(5), seq_len=8)
    with pytest.raises(ValueError, match=r"train\.global_batch_size=8"):
        _loader(np.arange(8 * 5 + 1), seq_len=8)  # 5 windows < 8


# ---------------------------------------------------------------------------- validation batches
def test_val_batches_are_disjoint_and_cover_the_set():
    tokens = np.arange(8 * 100 + 1, dtype=np.int64)
    kw = dict(seq_len=8, micro_batch_size=2, num_batches=3)
    full = _stack(val_batches(tokens, dp_rank=0, dp_size=1, **kw))[0][:, 0].tolist()
    assert full == list(range(0, 48, 8))  # the first 6 windows, in order
    per_rank = [val_batches(tokens, dp_rank=r, dp_size=2, **kw) for r in range(2)]
    starts = [set(_stack(b)[0][:, 0].tolist()) for b in per_rank]
    assert all(len(b) == 3 for b in per_rank)
    assert not starts[0] & starts[1]
    assert starts[0] | starts[1] == set(range(0, 96, 8))
    # Deterministic: the same held-out set every call.
    again = val_batches(tokens, dp_rank=1, dp_size=2, **kw)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(again, per_rank[1]))


def test_short_val_split_gives_fewer_batches_then_an_error():
    tokens = np.arange(8 * 5 + 1, dtype=np.int64)  # 5 windows
    batches = val_batches(tokens, seq_len=8, micro_batch_size=2, num_batches=8, dp_rank=0, dp_size=2)
    assert len(batches) == 1  # one whole round of 2 x 2 windows
    with pytest.raises(ValueError, match=r"data\.val_fraction"):
        val_batches(tokens, seq_len=8, micro_batch_size=4, num_batches=8, dp_rank=0, dp_size=2)


@pytest.mark.parametrize("cfg", [DataConfig(name="text"), DataConfig(name="markov", vocab_size=64, num_tokens=5000)])
def test_corpus_vocab_size_is_what_build_corpus_gives(cfg):
    """Estimates size the embedding without building the corpus: the same vocabulary."""
    from trainlab.data.build_corpus import build_corpus, corpus_vocab_size

    assert corpus_vocab_size(cfg) == build_corpus(cfg).vocab_size


def test_a_token_file_is_scanned_once_while_unchanged_and_again_once_changed(tmp_path, monkeypatch):
    """A sweep's driver checks every trial's data, then plans each: one scan per file version."""
    from trainlab.data import token_file
    from trainlab.data.corpus import iter_chunks

    path = write_token_file(tmp_path / "ids.bin", np.arange(1000) % 50, "uint16")
    scans = []
    monkeypatch.setattr(token_file, "iter_chunks", lambda t: scans.append(1) or iter_chunks(t))
    for _ in range(3):
        token_file.open_token_file(str(path), dtype="uint16", vocab_size=50)
    assert len(scans) == 1
    write_token_file(path, np.arange(1000) % 60, "uint16")  # rewritten: ids up to 59 now
    os.utime(path, ns=(0, 10**9))  # a new mtime even where the clock's grain would hide the rewrite
    with pytest.raises(ValueError, match="data.vocab_size=60"):
        token_file.open_token_file(str(path), dtype="uint16", vocab_size=50)
    assert len(scans) == 2
