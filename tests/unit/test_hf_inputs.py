"""data=hf's inputs as a user meets them going wrong, on the driver before anything starts: a
document too long to hold whole, a damaged or cut-short file, a data.split the dataset does not
have. Each refusal is one line naming the field, the file, the line and the fix; a refusal
leaves nothing in data.cache_dir (test_hf_cache.py: the cache itself).

Called in-process through the driver's own functions (data.hf_corpus.prepare_hf, which the
preflight's check_data calls); tests/integration/test_hf_data_cli.py runs a few through the CLI."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from hf_data_support import data_cfg, make_demo, refused, stream
from trainlab.config import compose_run_config
from trainlab.config.convert import config_hash
from trainlab.data import hf_corpus, hf_files, hf_source, hf_tokenize
from trainlab.data.hf_corpus import prepare_hf
from trainlab.data.hf_demo import demo_documents


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return make_demo(tmp_path_factory.mktemp("hfinputs"))


@pytest.fixture(scope="module")
def tok(demo):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(demo["tokenizer"], local_files_only=True)





# ---------------------------------------------------------------------------- long documents
class _CallSizes:
    """The tokenizer, recording how many characters each call is given."""

    def __init__(self, tok):
        self._tok, self.calls = tok, []

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def __len__(self):
        return len(self._tok)

    def __call__(self, texts, **kw):
        self.calls.append(sum(map(len, texts)))
        return self._tok(texts, **kw)


def test_a_long_document_is_tokenized_in_bounded_calls_into_the_tokens_of_the_whole(demo, tok, tmp_path,
                                                                                   monkeypatch):
    """One document on one JSON line (and as a .txt file, read a chunk at a time) 50 times the
    tokenizer's per-call bound: no call passes the bound, and the tokens are those of the whole
    document in one call (pieces are cut before blanks, chunks mid-word and mid-character)."""
    monkeypatch.setattr(hf_tokenize, "PIECE_CHARS", 2048)
    monkeypatch.setattr(hf_tokenize, "BATCH_CHARS", 8192)
    monkeypatch.setattr(hf_files, "TEXT_CHUNK_BYTES", 1001)  # chunk ends fall inside words and 'é'
    text = "\n\n".join(demo_documents()).replace("the ", "thé ")
    doc = (text * (8192 * 50 // len(text) + 1))[:8192 * 50]
    (tmp_path / "one.jsonl").write_text(json.dumps({"text": doc}) + "\n")
    (tmp_path / "one.txt").write_text(doc)
    want = tok(doc, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    real = hf_corpus.load_tokenizer
    for name in ("one.jsonl", "one.txt"):
        spy = _CallSizes(real(demo["tokenizer"]))
        monkeypatch.setattr(hf_corpus, "load_tokenizer", lambda path, spy=spy: spy)
        cached = prepare_hf(data_cfg(demo, tmp_path / f"cache_{name}", path=str(tmp_path / name)))
        assert len(spy.calls) >= 50 and max(spy.calls) <= 8192, (name, spy.calls[:5])
        assert stream(cached).tolist() == want, name
        assert cached.meta["documents"] == 1


def test_a_row_past_the_row_bound_is_refused_with_the_fix(demo, tmp_path, monkeypatch):
    monkeypatch.setattr(hf_files, "ROW_MAX_BYTES", 4000)
    monkeypatch.setattr(hf_source, "ROW_MAX_BYTES", 4000)
    rows = [{"text": "short"}, {"text": "x" * 5000}]
    (tmp_path / "long.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "long.json").write_text(json.dumps(rows))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": [r["text"] for r in rows]}), tmp_path / "long.parquet")
    fix = "a row is read whole, so it may be 3.91 KiB at most: split long documents into several rows"
    for name, says in [("long.jsonl", "long.jsonl' line 2 is more than 3.91 KiB long"),
                       ("long.json", "long.json' element 1 (line 1) is more than 3.91 KiB long"),
                       ("long.parquet", "data.text_field='text': data.path='{p}' row 1 holds 4.88 KiB of text")]:
        path = str(tmp_path / name)
        msg = refused(data_cfg(demo, tmp_path / "cache", path=path))
        assert says.format(p=path) in msg and msg.endswith(fix), msg


# ---------------------------------------------------------------------------- damaged files
GOOD = [json.dumps({"text": t}).encode() + b"\n" for t in demo_documents()[:3]]
DAMAGED = {  # file name: (its bytes, what the one line says after data.path='<file>')
    "latin1.jsonl": (GOOD[0] + GOOD[1] + b'{"text": "caf\xae"}\n',
                     ["' line 3 is not UTF-8 text (byte 0xae)", "iconv -f LATIN1 -t UTF-8 FILE > NEW"]),
    "cut.jsonl": (GOOD[0] + GOOD[1] + GOOD[2][:40], ["' line 3, the last, ends in the middle of a row",
                                                     "the file looks cut short", "copy or write it again"]),
    "cut_char.jsonl": (GOOD[0] + b'{"text": "caf\xc3', ["' line 2 ends in the middle of a UTF-8 character",
                                                        "cut short"]),
    "quotes.jsonl": (GOOD[0] + b"{'text': 'x'}\n" + GOOD[1],
                     ["' line 2 is not JSON (Expecting property name enclosed in double quotes at column 2)",
                      "write one JSON object per line"]),
    "list.jsonl": (GOOD[0] + b'["x"]\n', ["' line 2 is a JSON list, not an object", "write one object per row"]),
    "number.jsonl": (GOOD[0] + b'{"text": 42}\n', ["data.text_field='text': data.path=", "' line 2 holds an int "
                                                   "(42), not text", "or fix that row"]),
    "missing.jsonl": (GOOD[0] + b'{"body": "x"}\n', ["data.text_field='text' is not a key of data.path=",
                                                     "' line 2 (its keys: body)", "set data.text_field to"]),
    "cut.json": (b"[" + GOOD[0].strip() + b",\n" + GOOD[1][:30], ["' ends inside element 1 of its JSON array "
                                                                  "(line 2)", "cut short"]),
    "latin1.json": (b'[{"text": "a"},\n {"text": "caf\xae"}]', ["' line 2 is not UTF-8 text (byte 0xae)"]),
    "comma.json": (b'[{"text": "a"}\n {"text": "b"}]', ["' line 2 is not valid JSON (expecting ',' or ']'",
                                                        "one JSON array of objects"]),
    "latin1.txt": (b"first line\ncaf\xae\n", ["' line 2 is not UTF-8 text (byte 0xae)", "iconv"]),
    "object.json": (b'{\n "text": "a"\n}\n', ["' line 1 is not JSON (Expecting property name enclosed in double "
                                                 "quotes", "; a .json file holds one JSON array of objects"]),
    "cut.parquet": (None, ["' is not a readable parquet file", "write it again (pyarrow.parquet.write_table)"]),
}


@pytest.mark.parametrize("name", sorted(DAMAGED))
def test_a_damaged_file_is_refused_naming_the_file_the_line_and_the_fix(name, demo, tmp_path):
    data, says = DAMAGED[name]
    if data is None:  # a parquet file cut short
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": demo_documents()}), tmp_path / "whole.parquet")
        data = (tmp_path / "whole.parquet").read_bytes()[:-100]
    (tmp_path / "cache").mkdir()
    (tmp_path / name).write_bytes(data)
    msg = refused(data_cfg(demo, tmp_path / "cache", path=str(tmp_path / name)))
    assert f"data.path={str(tmp_path / name)!r}" in msg, msg
    for part in says:
        assert part in msg, msg
    if name.endswith(".jsonl"):  # in a folder of files, the file is named under data.path
        folder = tmp_path / "folder"
        folder.mkdir()
        (folder / "a.jsonl").write_bytes(b"".join(GOOD))
        os.rename(tmp_path / name, folder / "b.jsonl")
        msg = refused(data_cfg(demo, tmp_path / "cache", path=str(folder)))
        assert f"data.path={str(folder)!r}: 'b.jsonl' line " in msg, msg


def test_a_damaged_saved_dataset_is_refused_naming_it(demo, tmp_path):
    import datasets

    datasets.Dataset.from_dict({"text": demo_documents()[:20]}).save_to_disk(str(tmp_path / "saved"))
    (tmp_path / "saved" / "state.json").write_text('{"_data_files": [')
    msg = refused(data_cfg(demo, tmp_path / "cache", path=str(tmp_path / "saved")))
    assert msg.startswith(f"data.path={str(tmp_path / 'saved')!r} could not be read by datasets.load_from_disk")
    assert msg.endswith("save the dataset again with save_to_disk, or point data.path at a whole copy")


# ---------------------------------------------------------------------------- data.split
def test_data_split_is_refused_where_the_dataset_has_no_such_split(demo, tmp_path):
    import datasets

    docs = demo_documents()[:40]
    datasets.Dataset.from_dict({"text": docs}).save_to_disk(str(tmp_path / "one"))
    datasets.DatasetDict({"a": datasets.Dataset.from_dict({"text": docs}),
                          "b": datasets.Dataset.from_dict({"text": docs})}).save_to_disk(str(tmp_path / "ab"))
    one, ab, cache = str(tmp_path / "one"), str(tmp_path / "ab"), tmp_path / "cache"
    assert refused(data_cfg(demo, cache, path=one, split="validation")) == (
        f"data.split='validation': data.path={one!r} holds one saved Dataset, with no splits (save_to_disk of a "
        "Dataset, not a DatasetDict); set data.split='' to read all of it (to train on one part, point "
        "data.path at that part's files)")
    assert refused(data_cfg(demo, cache, split="train")).startswith(
        f"data.split='train': data.path={demo['docs']!r} holds json rows, with no splits; set data.split=''")
    assert refused(data_cfg(demo, cache, path=ab)) == (
        f"data.split='' reads the train split, and there is none in data.path={ab!r} (its splits: a, b); set "
        "data.split to one of them")
    # the fixes, followed: the whole Dataset, and a DatasetDict's split, tokenize alike
    assert np.array_equal(stream(prepare_hf(data_cfg(demo, cache, path=one))),
                          stream(prepare_hf(data_cfg(demo, cache, path=ab, split="b"))))
    # empty is what `train`, the default it replaced, read: a run's identity stays
    base = ["data=hf", "data.path=x.jsonl", "data.tokenizer=t"]
    assert config_hash(compose_run_config(base)) == config_hash(compose_run_config([*base, "data.split=train"]))


def test_rows_without_text_are_left_out_and_the_summary_says_so(demo, tmp_path, capsys):
    docs = [json.loads(line) for line in open(demo["docs"])][:40]
    rows = docs[:10] + [{"text": None}] + docs[10:] + [{"text": ""}]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cached = prepare_hf(data_cfg(demo, tmp_path / "cache", path=str(path)))
    said = capsys.readouterr().out
    assert f"{len(docs)} documents (2 rows with no text left out)" in said, said
    assert len(stream(cached)) == len(stream(prepare_hf(data_cfg(demo, tmp_path / "cache2", path=str(
        _jsonl(tmp_path / "all.jsonl", docs))))))


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
