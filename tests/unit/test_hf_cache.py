"""data=hf's token cache (data.hf_cache) as a user meets it going wrong: a cache folder damaged
(meta.json cut short or edited, a token file cut) is tokenized again and swapped in, unless it
holds files trainlab did not write (then it is named and kept); a data.cache_dir that cannot be
used is one line naming it; the lock leaves no file behind."""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import pytest

from conftest import read_only_dir
from hf_data_support import data_cfg, make_demo, refused, stream
from trainlab.data import hf_corpus
from trainlab.data.hf_corpus import prepare_hf
from trainlab.vocab.file_lock import held


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return make_demo(tmp_path_factory.mktemp("hfcache"))





def _count_loads(monkeypatch) -> list:
    calls = []
    real = hf_corpus.load_tokenizer
    monkeypatch.setattr(hf_corpus, "load_tokenizer", lambda path: calls.append(path) or real(path))
    return calls


@pytest.mark.parametrize("damage", ["meta_cut", "meta_gone", "meta_edited", "tokens_cut", "mask_gone"])
def test_a_damaged_cache_folder_is_tokenized_again_and_replaced(damage, demo, tmp_path, monkeypatch):
    calls = _count_loads(monkeypatch)
    cfg = data_cfg(demo, tmp_path / "cache", path=demo["chat"], format="chat", loss_on="answer")
    first = prepare_hf(cfg)
    want, want_mask, folder = stream(first).copy(), np.asarray(first.mask).copy(), first.folder
    del first
    meta, tokens = folder / "meta.json", folder / "tokens.bin"
    {"meta_cut": lambda: meta.write_text(meta.read_text()[:30]),
     "meta_gone": meta.unlink,
     "meta_edited": lambda: meta.write_text(json.dumps({**json.loads(meta.read_text()), "num_tokens": "many"})),
     "tokens_cut": lambda: os.truncate(tokens, tokens.stat().st_size - 2),
     "mask_gone": (folder / "mask.bin").unlink}[damage]()
    again = prepare_hf(cfg)
    assert len(calls) == 2, "the damaged folder was not tokenized again"
    assert np.array_equal(stream(again), want) and np.array_equal(again.mask, want_mask)
    assert again.folder == folder and os.listdir(tmp_path / "cache") == [folder.name], "something was left"


def test_a_damaged_cache_folder_holding_other_files_is_kept_and_named(demo, tmp_path):
    cfg = data_cfg(demo, tmp_path / "cache")
    folder = prepare_hf(cfg).folder
    (folder / "meta.json").write_text("{")
    (folder / "notes.txt").write_text("mine")
    msg = refused(cfg)
    assert msg.startswith(f"data.cache_dir: {folder} is a damaged token cache (meta.json: ")
    assert msg.endswith(f"holds notes.txt, which trainlab does not write there, so trainlab leaves it; move it "
                        f"away to tokenize again (mv {folder} {folder}.damaged)")
    assert (folder / "notes.txt").read_text() == "mine"
    os.rename(folder, f"{folder}.damaged")  # the fix, followed
    assert len(prepare_hf(cfg).tokens) > 0 and (tmp_path / "cache" / f"{folder.name}.damaged" / "notes.txt").exists()


def test_a_cache_dir_that_cannot_be_used_is_refused_in_one_line(demo, tmp_path):
    fix = "set data.cache_dir to a folder you can write (empty: ~/.cache/trainlab/tokens)"
    (tmp_path / "file").write_text("mine")
    msg = refused(data_cfg(demo, tmp_path / "file"))
    assert msg == f"data.cache_dir={str(tmp_path / 'file')!r} is a file, not a folder; {fix}"
    assert (tmp_path / "file").read_text() == "mine"
    msg = refused(data_cfg(demo, "/proc/nope"))
    assert msg.startswith("data.cache_dir='/proc/nope' cannot be made (") and msg.endswith(fix)
    # one that cannot be written: refused before tokenizing; a complete folder in it still serves
    made = prepare_hf(data_cfg(demo, tmp_path / "ro"))
    with read_only_dir(tmp_path / "ro") as locked:
        if not locked:
            pytest.skip("this machine cannot make a folder its user cannot write")
        assert np.array_equal(stream(prepare_hf(data_cfg(demo, tmp_path / "ro"))), stream(made))
        msg = refused(data_cfg(demo, tmp_path / "ro", path=demo["chat"], format="chat"))
        assert msg.startswith(f"data.cache_dir={str(tmp_path / 'ro')!r} cannot be written (") and msg.endswith(fix)


def test_the_lock_file_goes_with_the_lock_and_still_excludes(tmp_path):
    """Threads (processes lock alike) taking a lock that removes its file on release: never two
    inside at once, every one gets in, and no file is left."""
    lock, inside, seen, entered = tmp_path / "x.lock", [], [], []

    def work():
        for _ in range(5):
            with held(lock, remove=True):
                inside.append(1)
                seen.append(len(inside))
                time.sleep(0.002)
                inside.pop()
            entered.append(1)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(entered) == 20 and max(seen) == 1 and not lock.exists()


