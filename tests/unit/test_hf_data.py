"""data=hf: a local dataset tokenized once by a local tokenizer (data.hf_*), packed with EOS between
documents, cached, batched like every corpus, with chat answers as the only targets on request.

The tokenizer and the dataset are made here from the embedded corpus (data.hf_demo); nothing is
downloaded (HF_HUB_OFFLINE=1, local_files_only)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hf_data_support import data_cfg, make_demo
from trainlab.config import ConfigError, compose_run_config
from trainlab.config.convert import config_hash
from trainlab.config.schema import DataConfig
from trainlab.data import TokenBatches, build_corpus, val_batches
from trainlab.data.batches import IGNORE_INDEX
from trainlab.data.build_corpus import corpus_vocab_size
from trainlab.data.hf_demo import demo_conversations, demo_documents
from trainlab.engine.loss import token_loss


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return make_demo(tmp_path_factory.mktemp("hfdemo"))


@pytest.fixture(scope="module")
def tok(demo):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(demo["tokenizer"], local_files_only=True)


def _chat(demo, cache) -> DataConfig:
    return data_cfg(demo, cache, path=demo["chat"], format="chat", loss_on="answer")


def _loader(tokens, mask=None, **kw) -> TokenBatches:
    base = dict(seq_len=32, global_batch_size=8, micro_batch_size=2, dp_rank=0, dp_size=1, seed=5)
    return TokenBatches(tokens, mask=mask, **{**base, **kw})


def _steps(loader, n):
    return [[(x.clone(), y.clone()) for x, y in loader.next_step()] for _ in range(n)]


def _same(a, b) -> bool:
    return all(torch.equal(x1, x2) and torch.equal(y1, y2) for s1, s2 in zip(a, b, strict=True)
               for (x1, y1), (x2, y2) in zip(s1, s2, strict=True))


# ---------------------------------------------------------------------------- the stream
def test_documents_are_packed_with_eos_after_each(demo, tok, tmp_path):
    c = build_corpus(data_cfg(demo, tmp_path))
    stream = np.concatenate([c.train, c.val])
    docs = demo_documents()
    assert c.name == "hf" and c.vocab_size == len(tok) == corpus_vocab_size(data_cfg(demo, tmp_path))
    ends = np.flatnonzero(stream == tok.eos_token_id)
    assert len(ends) == len(docs) and ends[-1] == len(stream) - 1
    starts = np.concatenate([[0], ends[:-1] + 1])
    for i in (0, 1, len(docs) // 2, len(docs) - 1):
        assert tok.decode(stream[starts[i]:ends[i]].tolist()) == docs[i]


def test_every_input_kind_gives_the_stream_of_the_same_documents(demo, tmp_path):
    """A save_to_disk folder (Dataset, DatasetDict's split), a parquet file, a JSON array and a
    folder of .txt files (one document each) holding the demo documents tokenize alike."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = demo_documents()[:40]
    datasets.Dataset.from_dict({"text": docs}).save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"body": ["x"] * 3}),
                          "extra": datasets.Dataset.from_dict({"body": docs})}).save_to_disk(str(tmp_path / "dict"))
    pq.write_table(pa.table({"id": list(range(len(docs))), "text": docs}), tmp_path / "docs.parquet")
    (tmp_path / "array.json").write_text(json.dumps([{"text": d} for d in docs]))
    (tmp_path / "txt").mkdir()
    for i, d in enumerate(docs):
        (tmp_path / "txt" / f"{i:03d}.txt").write_text(d)
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))

    def stream(path, **kw):
        c = build_corpus(data_cfg(demo, tmp_path / "cache", path=str(tmp_path / path), **kw))
        return np.concatenate([c.train, c.val])

    want = stream("docs.jsonl")
    for path, kw in [("saved", {}), ("dict", {"split": "extra", "text_field": "body"}), ("docs.parquet", {}),
                     ("array.json", {}), ("txt", {})]:
        assert np.array_equal(stream(path, **kw), want), path
    with pytest.raises(ValueError, match=r"data.split='test' is not a split of .* \(its splits: extra, train\)"):
        stream("dict", split="test", text_field="body")


def test_the_same_config_gives_the_same_batches_twice(demo, tmp_path):
    a = build_corpus(data_cfg(demo, tmp_path / "one"))
    b = build_corpus(data_cfg(demo, tmp_path / "two"))  # tokenized again, into another cache
    assert a.fingerprint == b.fingerprint
    assert _same(_steps(_loader(a.train), 4), _steps(_loader(b.train), 4))


def test_a_second_build_reuses_the_cache_and_a_changed_file_is_tokenized_again(demo, tmp_path, monkeypatch):
    from trainlab.data import hf_corpus

    calls = []
    real = hf_corpus.load_tokenizer
    monkeypatch.setattr(hf_corpus, "load_tokenizer", lambda path: calls.append(path) or real(path))
    data = tmp_path / "docs.jsonl"
    data.write_text(open(demo["docs"]).read())
    cfg = data_cfg(demo, tmp_path / "cache", path=str(data))
    first = build_corpus(cfg)
    second = build_corpus(cfg)
    assert len(calls) == 1, "the second build tokenized again"
    assert first.fingerprint == second.fingerprint
    entries = list((tmp_path / "cache").iterdir())
    assert len(entries) == 1 and entries[0].is_dir(), f"no lock file or temporary may be left: {entries}"
    data.write_text(json.dumps({"text": "a different corpus " * 200}) + "\n")
    third = build_corpus(cfg)
    assert len(calls) == 2 and third.fingerprint != first.fingerprint


def test_builders_racing_for_one_cache_tokenize_once(demo, tmp_path, monkeypatch):
    """Two builders at once (threads here; processes lock the same way): the second waits on the
    lock and opens the first one's folder."""
    import threading
    import time

    from trainlab.data import hf_corpus

    calls = []
    real = hf_corpus.load_tokenizer

    def slow_load(path):
        calls.append(path)
        time.sleep(0.5)  # the other builder arrives meanwhile
        return real(path)

    monkeypatch.setattr(hf_corpus, "load_tokenizer", slow_load)
    cfg = data_cfg(demo, tmp_path)
    prints = []
    threads = [threading.Thread(target=lambda: prints.append(build_corpus(cfg).fingerprint)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(prints) == 2 and prints[0] == prints[1]
    assert len(calls) == 1, "both builders tokenized"


def test_resume_mid_epoch_is_bit_exact(demo, tmp_path):
    c = build_corpus(_chat(demo, tmp_path))
    whole = _loader(c.train, c.train_mask, seq_len=16)
    first = _steps(whole, 3)
    state = json.loads(json.dumps(whole.state_dict()))  # as a checkpoint stores it
    rest = _steps(whole, 5)
    resumed = _loader(c.train, c.train_mask, seq_len=16)
    resumed.load_state_dict(state)
    assert 0 < resumed.epoch < 1
    assert _same(_steps(resumed, 5), rest) and not _same(first[:1], rest[:1])


def test_data_parallel_ranks_take_disjoint_shares_of_one_process_batch(demo, tmp_path):
    c = build_corpus(data_cfg(demo, tmp_path))
    one = torch.cat([x for x, _ in _loader(c.train).next_step()])
    shares = [torch.cat([x for x, _ in _loader(c.train, dp_rank=r, dp_size=2).next_step()]) for r in range(2)]
    assert torch.equal(torch.cat(shares), one)
    rows = [{tuple(r.tolist()) for r in s} for s in shares]
    assert not rows[0] & rows[1]
    vals = [torch.cat([x for x, _ in val_batches(c.val, seq_len=32, micro_batch_size=2, num_batches=2,
                                                 dp_rank=r, dp_size=2)]) for r in range(2)]
    assert not {tuple(r.tolist()) for r in vals[0]} & {tuple(r.tolist()) for r in vals[1]}


# ---------------------------------------------------------------------------- chat
def test_with_loss_on_answer_only_assistant_tokens_are_targets(demo, tok, tmp_path):
    c = build_corpus(_chat(demo, tmp_path))
    stream, mask = np.concatenate([c.train, c.val]), np.concatenate([c.train_mask, c.val_mask])
    answers = "".join(m["content"] + tok.eos_token for conv in demo_conversations()
                      for m in conv if m["role"] == "assistant")
    assert tok.decode(stream[mask == 1].tolist()) == answers
    assert "<|user|>" in tok.decode(stream[mask == 0].tolist())
    # batches: a target is -100 exactly where the mask says its token is not an answer
    loader = _loader(c.train, c.train_mask, seq_len=16)
    plain = _loader(c.train, seq_len=16)
    seen = torch.cat([torch.stack([y, py]) for _ in range(4) for (x, y), (px, py) in
                      zip(loader.next_step(), plain.next_step(), strict=True) if torch.equal(x, px)], dim=1)
    assert seen.shape[1] == 4 * 8, "the inputs (and the order) differ with a mask"
    y, py = seen
    assert torch.equal(y[y != IGNORE_INDEX], py[y != IGNORE_INDEX])
    assert (y == IGNORE_INDEX).any() and (y != IGNORE_INDEX).any()
    full = build_corpus(data_cfg(demo, tmp_path, path=demo["chat"], format="chat"))
    assert full.train_mask is None and np.array_equal(np.concatenate([full.train, full.val]), stream)


def test_a_micro_batch_with_every_target_masked_has_loss_zero_not_nan():
    logits = torch.randn(2, 4, 10, requires_grad=True)
    targets = torch.randint(0, 10, (2, 4))
    assert torch.equal(token_loss(logits, targets), F.cross_entropy(logits.flatten(0, 1), targets.flatten()))
    masked = torch.full((2, 4), IGNORE_INDEX)
    assert torch.isnan(F.cross_entropy(logits.flatten(0, 1), masked.flatten()))  # what the engine avoids
    loss = token_loss(logits, masked)
    loss.backward()
    assert loss.item() == 0.0 and torch.isfinite(logits.grad).all() and not logits.grad.any()
    half = masked.clone()
    half[0] = targets[0]
    assert torch.allclose(token_loss(logits, half), F.cross_entropy(logits[0], targets[0]))


# ---------------------------------------------------------------------------- refusals
def refused(run_overrides, demo) -> str:
    from trainlab.launch.preflight import check_data

    run = compose_run_config(["data=hf", f"data.path={demo['docs']}", f"data.tokenizer={demo['tokenizer']}",
                              "model=tiny", *run_overrides])
    with pytest.raises(ValueError) as e:
        check_data(run)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_hub_name_is_refused_naming_the_cached_snapshot_or_how_to_copy(demo, tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    msg = refused(["data.path=HuggingFaceFW/fineweb", f"data.cache_dir={tmp_path}"], demo)
    assert msg.startswith("data.path='HuggingFaceFW/fineweb' is not a path on this machine")
    assert "hf download HuggingFaceFW/fineweb --repo-type dataset --local-dir fineweb" in msg
    snap = tmp_path / "hub" / "models--meta-llama--Llama-3.1-8B" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text("abc123")
    msg = refused(["data.tokenizer=meta-llama/Llama-3.1-8B", f"data.cache_dir={tmp_path}"], demo)
    assert msg.startswith("data.tokenizer='meta-llama/Llama-3.1-8B' is not a path on this machine")
    assert msg.endswith(f"use the copy in the Hugging Face cache: data.tokenizer={snap}")


def test_wrong_kinds_of_path_are_refused_before_reading(demo, tmp_path):
    fifo = tmp_path / "data.jsonl"
    os.mkfifo(fifo)
    assert "is a FIFO" in refused([f"data.path={fifo}", f"data.cache_dir={tmp_path}"], demo)
    raw = tmp_path / "tokens.bin"
    raw.write_bytes(b"\0" * 64)
    assert "a raw token file is data=tokens" in refused([f"data.path={raw}", f"data.cache_dir={tmp_path}"], demo)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "is a folder holding no .jsonl" in refused([f"data.path={empty}", f"data.cache_dir={tmp_path}"], demo)
    tok_file = os.path.join(demo["tokenizer"], "tokenizer.json")
    msg = refused([f"data.tokenizer={tok_file}", f"data.cache_dir={tmp_path}"], demo)
    assert "is a file, not a tokenizer folder" in msg and f"({demo['tokenizer']})" in msg
    assert f"data.text_field='body' is not a key of data.path={demo['docs']!r} line 1 (its keys: text)" in refused(
        ["data.text_field=body", f"data.cache_dir={tmp_path}"], demo)


def test_config_refusals_and_the_hash_of_other_corpora():
    with pytest.raises(ConfigError, match="data.loss_on=answer needs data.format=chat"):
        compose_run_config(["data=hf", "data.path=x.jsonl", "data.tokenizer=t", "data.loss_on=answer"])
    with pytest.raises(ConfigError, match="data.tokenizer is empty"):
        compose_run_config(["data=hf", "data.path=x.jsonl", "data.tokenizer="])
    # data=hf's fields do not enter the identity of a run on another corpus
    assert config_hash(compose_run_config([])) == config_hash(compose_run_config(["data.text_field=body"]))
