"""Corpus -> shards: text files, Parquet, a processed store (+ its raw source); dataset, shuffling, EOS stripping."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from confluence.errors import ConfluenceError, DataError
from confluence.textmodel.data import (
    MMapTokenDataset,
    iter_corpus,
    iter_text_batches,
    load_tokenizer,
    num_batches,
    prepare_corpus,
    read_meta,
    split_for_devices,
    strip_eos,
)
from tests.fixtures.text import tiny_sentences, write_tiny_corpus


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("prep")
    corpus = write_tiny_corpus(root / "corpus", n=300)
    prepare_corpus(corpus, root / "data", max_seq_len=16, vocab_size=300, shard_size=100)
    return root / "data"


def test_prepare_writes_shards_and_metadata(prepared: Path) -> None:
    meta = read_meta(prepared)
    assert meta.max_seq_len == 16 and meta.vocab_size <= 300
    assert (meta.pad_id, meta.eos_id, meta.mask_id, meta.bos_id) == (0, 3, 4, 2)
    assert meta.num_documents == 300 and len(meta.shards) == -(-meta.num_samples // 100)
    ds = MMapTokenDataset(prepared)
    assert len(ds) == meta.num_samples
    rows = ds.rows(np.arange(len(ds)))
    assert rows.dtype == np.int32 and rows.shape == (len(ds), 16)
    n_tok = 0
    for r in rows:
        eos = np.nonzero(r == meta.eos_id)[0]
        assert len(eos) == 1, "exactly one EOS per row"
        assert (r[: eos[0]] != meta.pad_id).all() and (r[eos[0] + 1 :] == meta.pad_id).all()
        n_tok += eos[0]
    assert n_tok == meta.num_tokens
    # round trip: the first document's tokens decode back to its text
    tok = load_tokenizer(prepared / "tokenizer.json")
    first = tiny_sentences(300)[0]
    ids = tok.encode(first, add_special_tokens=False).ids
    assert list(rows[0][: min(len(ids), 15)]) == ids[:15]
    assert tok.decode(ids).strip() == first


def test_long_documents_are_split_into_chunks(tmp_path: Path) -> None:
    words = " ".join(f"word{i}" for i in range(200))
    (tmp_path / "c.txt").write_text(words, encoding="utf-8")
    meta = prepare_corpus(tmp_path / "c.txt", tmp_path / "d", max_seq_len=16, vocab_size=280)
    assert meta.num_documents == 1 and meta.num_samples > 5
    ds = MMapTokenDataset(tmp_path / "d")
    assert all((ds[i] == meta.eos_id).sum() == 1 for i in range(len(ds)))


def test_parquet_corpus_and_errors(tmp_path: Path) -> None:
    pq.write_table(pa.table({"body": tiny_sentences(50) + [None], "n": list(range(51))}), tmp_path / "t.parquet")
    assert len(list(iter_corpus(tmp_path / "t.parquet", "body"))) == 50
    with pytest.raises(DataError, match="needs --column"):
        list(iter_corpus(tmp_path / "t.parquet"))
    with pytest.raises(DataError, match="no column 'nope'"):
        list(iter_corpus(tmp_path / "t.parquet", "nope"))
    with pytest.raises(DataError, match="column 'n' has type int64"):
        list(iter_corpus(tmp_path / "t.parquet", "n"))
    with pytest.raises(DataError, match="no such file"):
        list(iter_corpus(tmp_path / "missing.txt"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no text files"):
        list(iter_corpus(tmp_path / "empty"))


def test_existing_output_and_bad_tokenizer_are_rejected(prepared: Path, tmp_path: Path) -> None:
    corpus = write_tiny_corpus(tmp_path / "c", n=20)
    with pytest.raises(ConfluenceError, match="already exists"):
        prepare_corpus(corpus, prepared)
    from tokenizers import Tokenizer, models

    bare = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    bare.save(str(tmp_path / "bare.json"))
    with pytest.raises(ConfluenceError, match="lacks special tokens"):
        prepare_corpus(corpus, tmp_path / "out", tokenizer=tmp_path / "bare.json")
    assert not (tmp_path / "out").exists()
    # a given tokenizer is reused as is
    meta = prepare_corpus(corpus, tmp_path / "out2", tokenizer=prepared / "tokenizer.json", max_seq_len=16)
    assert meta.vocab_size == read_meta(prepared).vocab_size


def test_store_corpus_reads_column_and_category_texts_and_raw_text_cells(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    meta = {
        "columns": [{"column_idx": 0, "text": "title of books"}, {"column_idx": 1, "text": "genre of books"}],
        "tables": [{"name": "books", "columns": [
            {"name": "genre", "stype": "categorical", "stats": {"categories": ["fantasy", "poetry"]}},
            {"name": "blurb", "stype": "text", "stats": {"distinct": 2}}]}],
        "tasks": [],
    }
    (store / "metadata.json").write_text(json.dumps(meta), encoding="utf-8")
    raw = tmp_path / "raw"
    raw.mkdir()
    pq.write_table(pa.table({"genre": ["fantasy", "poetry", "poetry"], "blurb": ["A dragon tale.", None, "Odes."]}),
                   raw / "books.parquet")
    docs = list(iter_corpus(store))
    assert docs == ["title of books", "genre of books", "genre is fantasy", "genre is poetry"]
    docs = list(iter_corpus(store, source=raw))
    assert docs[4:] == ["A dragon tale.", "Odes."]


def test_batches_shuffle_cover_epoch_and_resume(prepared: Path) -> None:
    ds = MMapTokenDataset(prepared)
    bs = 8
    a = list(iter_text_batches(ds, bs, seed=1, buffer_size=32))
    assert len(a) == num_batches(ds, bs) and all(b.shape == (bs, 16) for b in a)
    allrows = np.concatenate(a)
    ref = ds.rows(np.arange(len(ds)))
    # every row at most once (drop_last drops < bs rows), and the order is shuffled
    keys = {r.tobytes() for r in ref}
    assert all(r.tobytes() in keys for r in allrows)
    assert not np.array_equal(allrows, ref[: len(allrows)])
    b = list(iter_text_batches(ds, bs, seed=1, buffer_size=32))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    c = list(iter_text_batches(ds, bs, seed=1, buffer_size=32, start_batch=3))
    assert all(np.array_equal(x, y) for x, y in zip(a[3:], c, strict=True)) and len(c) == len(a) - 3
    full = list(iter_text_batches(ds, bs, seed=2, buffer_size=32, drop_last=False))
    assert sum(len(x) for x in full) == len(ds)


def test_eos_stripping_and_device_split() -> None:
    t = np.array([[7, 8, 3, 0], [9, 3, 0, 0]], np.int32)
    np.testing.assert_array_equal(strip_eos(t, 3, 0), [[7, 8, 0, 0], [9, 0, 0, 0]])
    x = np.arange(24).reshape(8, 3)
    assert split_for_devices(x, 4).shape == (4, 2, 3)
    with pytest.raises(ConfluenceError, match="not divisible"):
        split_for_devices(x, 3)


def test_corrupt_data_dir_is_reported(prepared: Path, tmp_path: Path) -> None:
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(prepared, bad)
    np.save(bad / read_meta(bad).shards[0], np.zeros((3, 5), np.int32))
    with pytest.raises(ConfluenceError, match="shape"):
        MMapTokenDataset(bad)
    with pytest.raises(ConfluenceError, match="text prepare"):
        MMapTokenDataset(tmp_path)
