"""Acceptance tests on the bookstore: every stype's encoding, categorical blocks, both CSR directions with
time-sorted children, the observation-time cascade, dangling keys, exclude_columns, derived targets."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from confluence.preprocess import preprocess
from confluence.store import Store, unpack_bits
from confluence.store.format import COUNT_WINDOWS_DAYS, INT64_MAX, INT64_MIN
from tests.fixtures.bookstore import HashEncoder, bookstore_files, bookstore_tables

UTC = dt.UTC


def us(*args: int) -> int:
    return (dt.datetime(*args, tzinfo=UTC) - dt.datetime(1970, 1, 1, tzinfo=UTC)) // dt.timedelta(microseconds=1)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Store:
    d = tmp_path_factory.mktemp("bookstore")
    src, meta = bookstore_files(d)
    return Store.open(preprocess(src, meta, d / "store", encoder=HashEncoder(), progress=False))


def bits(store: Store, table: str, column: str) -> list[int]:
    n = store.table(table).num_rows
    return unpack_bits(store.validity(table, column), n).astype(int).tolist()


def test_layout_rows_and_columns(store):
    assert [(t.name, t.num_rows, t.row_offset) for t in store.tables] == [
        ("customers", 4, 0), ("books", 3, 4), ("orders", 6, 7)]
    assert store.num_rows == 13
    # non-ignored table columns in metadata order (customers.notes is ignored), then derived targets
    names = [(c.table or c.task, c.name) for c in store.columns]
    assert names[:6] == [("customers", "customer_id"), ("customers", "country"), ("customers", "age"),
                         ("customers", "is_premium"), ("customers", "bio"), ("customers", "signed_up_at")]
    assert names[6] == ("customers", "name") and names[11] == ("books", "genre") and names[19] == ("orders", "quantity")
    assert names[20:24] == [("orders_next_30d", "n"), ("country_upper", "country_uc"),
                            ("book_expensive", "expensive"), ("orders_next_30d", "observation time")]
    # + orders_next_30d's observation-time column, then one child-count column per foreign key, then one per
    # window for each (both foreign keys are of the temporal orders table), then one children's-mean column per
    # (foreign key, numerical or boolean column of orders): rating and gift by customer_id and by book_id, then one
    # "days since the latest child" column per foreign key of orders
    assert store.num_columns == 26 + 2 * len(COUNT_WINDOWS_DAYS) + 4 + 2 and store.d_t == 16
    means = [(c.mean_of["column"], c.mean_of["value_column"]) for c in store.columns if c.mean_of]
    assert sorted(means) == sorted((fk, v) for fk in ("customer_id", "book_id") for v in ("rating", "gift"))
    assert store.values("orders", "order_id") is None  # identifier: presence only
    assert bits(store, "orders", "customer_id") == [1, 1, 1, 1, 0, 1]


def test_numerical_zscore(store):
    std = np.std([30.0, 50.0, 40.0])
    np.testing.assert_allclose(store.values("customers", "age"), [-10 / std, 0, 10 / std, 0], rtol=1e-6)
    assert bits(store, "customers", "age") == [1, 0, 1, 1]
    stats = store.table("customers").column("age").stats
    assert stats["mean"] == 40.0 and stats["null_count"] == 1 and stats["count"] == 3
    # NaN counts as null
    assert bits(store, "orders", "rating") == [1, 0, 1, 1, 0, 1]


def test_boolean_bits(store):
    assert unpack_bits(store.values("customers", "is_premium"), 4).tolist() == [True, False, False, True]
    assert bits(store, "customers", "is_premium") == [1, 1, 0, 1]
    assert store.table("customers").column("is_premium").stats == {"null_count": 1, "true_count": 2,
                                                                   "false_count": 1}
    assert unpack_bits(store.values("orders", "gift"), 6).tolist() == [True, False, False, True, False, False]


def test_categorical_blocks_contiguous_and_sorted(store):
    country = store.table("customers").column("country").stats
    genre = store.table("books").column("genre").stats
    status = store.table("orders").column("status").stats
    quantity = store.table("orders").column("quantity").stats
    # one block per categorical column in global column order: country 0-1, genre 2-3, status 4-6, quantity 7-9
    assert country["categories"] == ["de", "fr"] and country["cat_emb_start"] == 0
    assert genre["categories"] == ["novel", "scifi"] and genre["cat_emb_start"] == 2
    assert status["categories"] == ["1", "2", "10"] and status["cat_emb_start"] == 4  # numeric order
    assert quantity["categories"] == ["1", "2", "3"] and quantity["cat_emb_start"] == 7
    assert store.values("customers", "country").tolist() == [1, 0, 1, 0]
    assert bits(store, "customers", "country") == [1, 1, 1, 0]
    assert store.values("orders", "status").tolist() == [6, 5, 4, 5, 0, 6]
    upper = store.task("country_upper")
    assert (upper.cat_block_start, upper.cat_count) == (10, 2)  # derived target: own block after the columns
    assert upper.stats["categories"] == ["DE", "FR"]
    assert store.max_k == 3 and store.meta["num_categories"] == 12
    enc = HashEncoder()
    want = ["country is de", "country is fr", "genre is novel", "genre is scifi", "status is 1", "status is 2",
            "status is 10", "quantity is 1", "quantity is 2", "quantity is 3", "country_uc is DE", "country_uc is FR"]
    np.testing.assert_array_equal(store.categorical_embeddings, enc.encode(want).astype(np.float16))


def test_text_first_seen_order(store):
    assert store.values("customers", "bio").tolist() == [0, 0, 1, 0]
    assert store.values("books", "title").tolist() == [2, 3, 1]  # "reads a lot" interned once
    enc = HashEncoder()
    np.testing.assert_array_equal(store.text_embeddings,
                                  enc.encode(["likes books", "reads a lot", "Dune", "Emma"]).astype(np.float16))
    assert store.table("customers").column("bio").stats == {"null_count": 1, "distinct": 2}


def test_column_name_embeddings(store):
    assert store.columns[4].text == "bio of customers: free-form biography"
    assert store.columns[20].text == "n of orders_next_30d: orders in the first 30 days"
    enc = HashEncoder()
    np.testing.assert_array_equal(store.column_embeddings,
                                  enc.encode([c.text for c in store.columns]).astype(np.float16))


def test_timestamps_and_database_wide_zscore(store):
    raw = [us(2020, 1, 1), us(2020, 2, 1), us(2020, 3, 1), us(2020, 4, 1),
           us(1965, 8, 1), us(1815, 12, 23),
           us(2020, 1, 5, 10, 30, 15), us(2020, 1, 3), us(2020, 2, 10), us(2020, 3, 1), us(2020, 1, 3)]
    mean, std = np.mean(np.array(raw, dtype=np.float64)), np.std(np.array(raw, dtype=np.float64))
    assert store.meta["timestamp_stats"]["mean"] == pytest.approx(mean, rel=1e-12)
    assert store.meta["timestamp_stats"]["std"] == pytest.approx(std, rel=1e-9)
    v = store.values("orders", "ordered_at")
    assert v.shape == (6, 15)
    np.testing.assert_allclose(v[0, 14], (us(2020, 1, 5, 10, 30, 15) - mean) / std, rtol=1e-6)
    np.testing.assert_allclose(v[0, 0:4], [1.0, 0.0, 0.0, -1.0], atol=1e-6)  # second 15, minute 30
    assert not v[4].any() and bits(store, "orders", "ordered_at") == [1, 1, 1, 1, 0, 1]
    pub = store.values("books", "published")
    np.testing.assert_allclose(pub[1, 14], (us(1815, 12, 23) - mean) / std, rtol=1e-6)
    sat = dt.date(1815, 12, 23).weekday()
    np.testing.assert_allclose(pub[1, 6:8], [np.sin(2 * np.pi * sat / 7), np.cos(2 * np.pi * sat / 7)], atol=1e-6)


def test_row_time(store):
    assert store.row_time.tolist() == [
        us(2020, 1, 1), us(2020, 2, 1), us(2020, 3, 1), us(2020, 4, 1),
        INT64_MIN, INT64_MIN, INT64_MIN,  # books: static table
        us(2020, 1, 5, 10, 30, 15), us(2020, 1, 3), us(2020, 2, 10), us(2020, 3, 1), INT64_MAX, us(2020, 1, 3)]
    assert store.table("orders").null_time_rows == 1


def test_parent_csr(store):
    assert store.parent_indptr.tolist() == [0] * 8 + [2, 4, 6, 7, 8, 10]
    assert store.parent_indices.tolist() == [0, 4, 0, 5, 1, 4, 6, 5, 0, 6]
    assert store.parent_column.tolist() == [13, 14, 13, 14, 13, 14, 14, 14, 13, 14]


def test_child_csr_sorted_by_time(store):
    indptr = store.child_indptr.tolist()
    children = {r: store.child_indices[indptr[r]:indptr[r + 1]].tolist() for r in range(13)}
    assert children[0] == [8, 12, 7]  # 01-03 (row 8), 01-03 (row 12), 01-05
    assert children[1] == [9]
    assert children[2] == [] and children[3] == []
    assert children[4] == [7, 9]
    assert children[5] == [8, 11]  # row 11 has a NULL time: last
    assert children[6] == [12, 10]
    assert all(children[r] == [] for r in range(7, 13))
    np.testing.assert_array_equal(store.child_time, store.row_time[store.child_indices])
    for r in range(13):
        t = store.child_time[indptr[r]:indptr[r + 1]]
        assert (np.diff(t) >= 0).all()
    assert store.child_column[indptr[0]:indptr[1]].tolist() == [13, 13, 13]
    # every parent edge appears once as a child edge
    pe = sorted(zip(np.repeat(np.arange(13), np.diff(store.parent_indptr)), store.parent_indices, strict=True))
    ce = sorted(zip(store.child_indices, np.repeat(np.arange(13), np.diff(store.child_indptr)), strict=True))
    assert pe == ce


def test_dangling_counted(store):
    assert store.meta["graph"]["dangling"] == {"orders.customer_id": 1, "orders.book_id": 0}
    assert store.meta["graph"]["num_parent_edges"] == 10


def test_cell_masking_task(store):
    info = store.task("order_rating")
    arr = store.task_arrays("order_rating")
    assert not info.is_derived and info.target_column_idx == 15
    assert arr.anchor_row.tolist() == [7, 9, 10, 11, 12]  # NaN passes "IS NOT NULL" but is a null target
    assert arr.obs_time.tolist() == [us(2020, 1, 5, 10, 30, 15), us(2020, 2, 10), us(2020, 3, 1), INT64_MAX,
                                     us(2020, 1, 3)]  # cascade step 2: the anchor's temporal column
    assert unpack_bits(arr.target_valid, 5).tolist() == [True, True, True, False, True]
    col = store.table("orders").column("rating").stats
    z = (np.array([5.0, 3.0, 4.0, 1.0]) - col["mean"]) / col["std"]  # the column's statistics
    np.testing.assert_allclose(arr.target_values, [z[0], z[1], z[2], 0.0, z[3]], rtol=1e-6)
    assert info.num_seeds == 5 and info.observation_time == "anchor_temporal_column"


def test_exclude_columns_and_categorical_cell_masking(store):
    info = store.task("order_status")
    assert info.exclude_column_idxs == [14, 15]
    assert (info.cat_block_start, info.cat_count, info.target_column_idx) == (4, 3, 16)
    arr = store.task_arrays("order_status")
    assert arr.target_values.tolist() == [6, 5, 4, 5, 0, 6]


def test_child_count_columns_one_per_foreign_key(store):
    """Each foreign-key column gets a numerical column naming the count of referencing rows (the sampler's
    `child_counts` cells); its text is embedded like any column name."""
    counts = [c for c in store.columns if c.count_of and "window_days" not in c.count_of
              and "latest" not in c.count_of]
    fks = [c for c in store.columns if c.foreign_key]
    assert [c.count_of["column_idx"] for c in counts] == [c.column_idx for c in fks] and len(fks) == 2
    assert [c.column_idx for c in counts] == [24, 25]
    temporal = {t.name for t in store.tables if t.temporal_column}
    for c, fk in zip(counts, fks, strict=True):
        assert c.table is None and c.task is None and c.stype.label == "numerical"
        windows = list(COUNT_WINDOWS_DAYS) if fk.table in temporal else []
        assert c.count_of == {"parent_table": fk.foreign_key.split(".")[0], "child_table": fk.table,
                              "column": fk.name, "column_idx": fk.column_idx, "windows": windows}
        assert c.name == f"number of {fk.table} rows by {fk.name}" and fk.name in c.text
    # then, after every all-time count (whose indices stay as before), one per window of each temporal foreign key
    windowed = [c for c in store.columns if c.count_of and "window_days" in c.count_of]
    want = [(fk.column_idx, w) for fk in fks if fk.table in temporal for w in COUNT_WINDOWS_DAYS]
    assert want and [(c.count_of["column_idx"], c.count_of["window_days"]) for c in windowed] == want
    assert [c.column_idx for c in windowed] == list(range(26, 26 + len(want)))
    assert windowed[0].name.endswith("in the last day") and windowed[2].name.endswith("in the last 30 days")
    # last, after the children's means: the days since the latest referencing row, per temporal foreign key
    latest = [c for c in store.columns if c.count_of and c.count_of.get("latest")]
    assert [c.count_of["column_idx"] for c in latest] == [fk.column_idx for fk in fks if fk.table in temporal]
    assert [c.column_idx for c in latest] == [store.num_columns - 2, store.num_columns - 1]
    assert latest[0].name == f"days since the latest orders row by {fks[0].name}" and latest[0].stype.label == "numerical"


def test_derived_numerical_with_observation_column(store):
    info = store.task("orders_next_30d")
    arr = store.task_arrays("orders_next_30d")
    assert info.is_derived and info.target_column_idx == 20 and info.observation_time == "observation_time_column"
    assert arr.anchor_row.tolist() == [0, 1, 2, 3]
    assert arr.obs_time.tolist() == [us(2020, 1, 31), us(2020, 3, 2), us(2020, 3, 31), us(2020, 5, 1)]
    counts = np.array([3.0, 1.0, 0.0, 0.0])  # c1: orders 100, 101, 105 within 30 days; c2: 102
    assert info.stats["mean"] == 1.0 and info.stats["std"] == pytest.approx(np.sqrt(1.5))
    np.testing.assert_allclose(arr.target_values, (counts - 1.0) / np.sqrt(1.5), rtol=1e-6)
    assert store.columns[20].stats == info.stats


def test_derived_categorical_and_no_cutoff(store):
    arr = store.task_arrays("country_upper")
    assert arr.target_values.tolist() == [11, 10, 11, 0]
    assert unpack_bits(arr.target_valid, 4).tolist() == [True, True, True, False]
    book = store.task_arrays("book_expensive")
    assert book.anchor_row.tolist() == [4, 5, 6]
    assert book.obs_time.tolist() == [INT64_MAX] * 3  # static anchor table: no cut-off
    assert store.task("book_expensive").observation_time == "none"
    assert unpack_bits(book.target_values, 3).tolist() == [False, True, True]


def test_database_metadata_embedded(store):
    assert store.meta["database"]["name"] == "bookstore"
    assert list(store.meta)[:3] == ["format_version", "confluence_version", "name"]
    assert set(bookstore_tables()) == {t.name for t in store.tables}


def test_dangling_keys_kept_as_key_only_rows(tmp_path, store):
    """`dangling_keys="keep"`: the order of customer 99 (no such customer) gets a key-only customers row after the
    four real ones (always visible, every cell NULL) instead of losing its edge; every other table, edge and task
    seed is the one of the default store, and the warning says what happened."""
    import warnings

    src, meta = bookstore_files(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kept = Store.open(preprocess(src, meta, tmp_path / "kept", encoder=HashEncoder(), progress=False,
                                     dangling_keys="keep"))
    assert [(t.name, t.num_rows) for t in kept.tables] == [("customers", 5), ("books", 3), ("orders", 6)]
    assert [t.key_only_rows for t in kept.tables] == [1, 0, 0] and store.table("customers").key_only_rows == 0
    assert kept.meta["graph"]["dangling"] == {"orders.customer_id": 0, "orders.book_id": 0}
    assert kept.meta["graph"]["num_key_only_rows"] == 1 and kept.meta["graph"]["num_parent_edges"] == 11
    assert kept.keys("customers").to_pylist() == [1, 2, 3, 4, 99]
    assert kept.row_time[4] == INT64_MIN and kept.row_time[:4].tolist() == store.row_time[:4].tolist()
    assert kept.table("customers").null_time_rows == 0
    for col in ("country", "age", "is_premium", "bio", "signed_up_at", "name"):
        assert bits(kept, "customers", col)[4] == 0, col
    # order 103 (row 11 here, 10 before) now has its customer: row 4, the key-only one
    assert kept.parent_indices[kept.parent_indptr[11]:kept.parent_indptr[12]].tolist() == [4, 7]  # and book b3
    for t in store.tasks:  # tasks read the tables as they are: the same anchors (one row later after customers)
        shift = 1 if t.anchor_table != "customers" else 0
        a, b = kept.task_arrays(t.name), store.task_arrays(t.name)
        assert (a.anchor_row == b.anchor_row + shift).all() and (a.obs_time == b.obs_time).all(), t.name
    texts = [str(w.message) for w in caught]
    assert any("orders.customer_id" in m and "key-only row" in m for m in texts), texts
    assert not any("edges are dropped" in m for m in texts)
    assert not any(getattr(w.message, "code", "") == "key_only_rows" for w in caught)  # the column said it
    # without validation nothing names the columns: the table says how many key-only rows it got
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        preprocess(src, meta, tmp_path / "kept2", encoder=HashEncoder(), progress=False, dangling_keys="keep",
                   validate=False)
    said = [w.message for w in caught if getattr(w.message, "code", "") == "key_only_rows"]
    assert [(w.table, w.rows) for w in said] == [("customers", 1)], [str(w.message) for w in caught]
    assert "table 'customers': 1 key-only rows added" in str(said[0])


def test_dangling_keys_setting_is_checked(tmp_path):
    from confluence.errors import ConfigError

    src, meta = bookstore_files(tmp_path)
    with pytest.raises(ConfigError, match="dangling_keys"):
        preprocess(src, meta, tmp_path / "bad", encoder=HashEncoder(), progress=False, dangling_keys="ignore")
    assert not (tmp_path / "bad").exists()
    from confluence.bench.learnability import run_learnability

    with pytest.raises(ConfigError, match="dangling_keys"):  # refused before the planted database is written
        run_learnability(tmp_path / "bench", dangling_keys="ignore", progress=False)
    assert not (tmp_path / "bench").exists()
