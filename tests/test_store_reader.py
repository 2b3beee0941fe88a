"""The Store reader: read-only maps, version and size checks, typed access, bit helpers."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from confluence.errors import StoreError
from confluence.preprocess import preprocess
from confluence.store import Store, get_bit, pack_bits, unpack_bits
from confluence.stypes import SemanticType
from tests.fixtures.bookstore import HashEncoder, bookstore_files


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("reader")
    src, meta = bookstore_files(d)
    return preprocess(src, meta, d / "store", encoder=HashEncoder(), progress=False)


@pytest.fixture
def copy(built, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(built, dst)
    return dst


def test_bits_roundtrip_little_endian():
    mask = np.array([1, 0, 1, 1, 0, 0, 0, 0, 1], dtype=bool)
    packed = pack_bits(mask)
    assert packed.tolist() == [0b00001101, 0b1]
    assert unpack_bits(packed, 9).tolist() == mask.tolist()
    assert [get_bit(packed, i) for i in range(9)] == mask.tolist()
    with pytest.raises(ValueError):
        unpack_bits(packed, 17)


def test_open_is_read_only_and_typed(built):
    s = Store.open(built)
    assert not s.row_time.flags.writeable
    with pytest.raises(ValueError):
        s.row_time[0] = 1
    assert s.row_time.dtype == np.int64 and s.parent_column.dtype == np.int32
    assert s.column_embeddings.dtype == np.float16 and s.column_embeddings.shape == (s.num_columns, s.d_t)
    assert s.values("orders", "ordered_at").dtype == np.float32
    assert s.values("orders", "status").dtype == np.uint32
    t = s.table("orders")
    assert t.column("rating").stype is SemanticType.NUMERICAL and t.column("rating").column_idx == 15
    assert s.columns[15] is t.column("rating")
    assert s.task("order_status").target_stype is SemanticType.CATEGORICAL
    assert s.table_of_row(np.array([0, 3, 4, 6, 7, 12])).tolist() == [0, 0, 1, 1, 2, 2]


def test_unknown_names(built):
    s = Store.open(built)
    with pytest.raises(StoreError, match="no table 'nope'"):
        s.table("nope")
    with pytest.raises(StoreError, match="no task 'nope'"):
        s.task("nope")
    with pytest.raises(StoreError, match="table 'customers' has no stored column 'notes'"):
        s.values("customers", "notes")


def test_truncated_file(copy):
    f = copy / "tables" / "orders" / "rating.values.npy"
    f.write_bytes(f.read_bytes()[:-3])
    with pytest.raises(StoreError, match=r"file 'tables/orders/rating.values.npy' is truncated"):
        Store.open(copy)


def test_missing_file(copy):
    (copy / "graph" / "child_time.npy").unlink()
    with pytest.raises(StoreError, match="missing file 'graph/child_time.npy'"):
        Store.open(copy)


def test_wrong_shape_or_dtype(copy):
    np.save(copy / "graph" / "row_time.npy", np.zeros(13, dtype=np.int32))
    with pytest.raises(StoreError, match="'graph/row_time.npy' holds int32\\[13\\], metadata says int64\\[13\\]"):
        Store.open(copy)


def test_format_version(copy):
    meta = json.loads((copy / "metadata.json").read_text())
    meta["format_version"] = 99
    (copy / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(StoreError, match="format version 99"):
        Store.open(copy)


def test_timestamp_stats(copy):
    s = Store.open(copy)
    assert s.timestamp_stats == (s.meta["timestamp_stats"]["mean"], s.meta["timestamp_stats"]["std"] or 1.0)
    meta = json.loads((copy / "metadata.json").read_text())
    del meta["timestamp_stats"]
    (copy / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(StoreError, match="lacks timestamp_stats"):
        Store.open(copy).timestamp_stats  # noqa: B018


def test_not_a_store(tmp_path):
    with pytest.raises(StoreError, match="not a processed store"):
        Store.open(tmp_path)
    (tmp_path / "metadata.json").write_text("{")
    with pytest.raises(StoreError, match="unreadable store metadata"):
        Store.open(tmp_path)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_small_arrays_hold_no_file_descriptor_and_large_ones_are_mapped(built, monkeypatch):
    """A corpus opens hundreds of stores in one process: small arrays are read, not mapped (a map holds a descriptor
    while it lives), so opening many stores does not exhaust the process's descriptors; large arrays stay mapped."""
    import confluence.store.reader as reader

    before = _open_fds()
    stores = [Store.open(built) for _ in range(20)]
    assert _open_fds() - before == 0
    assert not isinstance(stores[0].row_time, np.memmap) and not stores[0].row_time.flags.writeable
    monkeypatch.setattr(reader, "MMAP_MIN_BYTES", 1)
    mapped = Store.open(built)
    assert isinstance(mapped.row_time, np.memmap) and not mapped.row_time.flags.writeable
    assert _open_fds() > before
    assert np.array_equal(mapped.row_time, stores[0].row_time)
    assert np.array_equal(mapped.values("orders", "ordered_at"), stores[0].values("orders", "ordered_at"),
                          equal_nan=True)
