"""Edge cases: an empty table, all-NULL columns of every stype, tasks whose targets are all NULL."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from confluence.preprocess import preprocess
from confluence.schema.metadata import parse_metadata
from confluence.store import Store, unpack_bits
from confluence.store.format import INT64_MAX
from tests.fixtures.bookstore import HashEncoder


def test_empty_table_and_all_null_columns(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({"id": pa.array([], pa.int64()), "x": pa.array([], pa.float64())}),
                   src / "empty.parquet")
    nulls = {"e": pa.int64(), "c": pa.string(), "t": pa.timestamp("us"), "s": pa.string(), "b": pa.bool_(),
             "n": pa.float64()}
    pq.write_table(pa.table({"id": pa.array([1, 2, 3]), **{k: pa.array([None] * 3, t) for k, t in nulls.items()}}),
                   src / "nulls.parquet")
    meta = parse_metadata({"name": "edge", "tables": {
        "empty": {"primary_key": "id", "columns": {"id": {"stype": "identifier"}, "x": {"stype": "numerical"}}},
        "nulls": {"primary_key": "id", "temporal_column": "t", "columns": {
            "id": {"stype": "identifier"}, "e": {"stype": "identifier", "foreign_key": "empty.id"},
            "c": {"stype": "categorical"}, "t": {"stype": "timestamp"}, "s": {"stype": "text"},
            "b": {"stype": "boolean"}, "n": {"stype": "numerical"}}}},
        "tasks": {
            "n": {"query": "SELECT id, n FROM nulls", "anchor_table": "nulls", "anchor_key": "id",
                  "target_column": "n", "target_stype": "numerical"},
            "c": {"query": "SELECT id, c FROM nulls", "anchor_table": "nulls", "anchor_key": "id",
                  "target_column": "c", "target_stype": "categorical"}}})
    s = Store.open(preprocess(src, meta, tmp_path / "store", encoder=HashEncoder(), progress=False))
    assert s.table("empty").num_rows == 0 and s.values("empty", "x").shape == (0,)
    assert s.meta["timestamp_stats"] == {"count": 0, "mean": 0.0, "std": 1.0}
    assert s.row_time.tolist() == [INT64_MAX] * 3 and s.table("nulls").null_time_rows == 3
    assert s.table("nulls").column("c").stats["k"] == 0
    assert s.meta["graph"]["num_parent_edges"] == 0 and s.meta["graph"]["dangling"] == {"nulls.e": 0}
    for name in ("c", "t", "s", "b", "n"):
        assert not unpack_bits(s.validity("nulls", name), 3).any()
    assert s.text_embeddings.shape == (0, 16) and s.max_k == 0
    c = s.task_arrays("c")
    assert c.target_values.tolist() == [0, 0, 0] and s.task("c").cat_count == 0
    assert s.task("n").stats["count"] == 0


def test_extreme_finite_values_and_far_dates_keep_the_rest_of_the_column(tmp_path):
    """±1e308 (which overflowed the statistics: "Out of range float values are not JSON compliant") and the
    years 1 and 9999 (sentinel dates) are read; the column's other values are scaled as if they were absent."""
    import datetime as dt
    import warnings

    import numpy as np

    src = tmp_path / "src"
    src.mkdir()
    x = [1.0, 2.0, 3.0, 1e308, -1e308, 4.0]
    days = [dt.date(2020, 1, d) for d in (1, 2, 3, 4)] + [dt.date(1, 1, 1), dt.date(9999, 12, 31)]
    pq.write_table(pa.table({"id": pa.array(range(6)), "x": pa.array(x), "d": pa.array(days, pa.date32())}),
                   src / "t.parquet")
    meta = parse_metadata({"name": "extreme", "tables": {"t": {"primary_key": "id", "columns": {
        "id": {"stype": "identifier"}, "x": {"stype": "numerical"}, "d": {"stype": "timestamp"}}}},
        "tasks": {"x": {"query": "SELECT id, x FROM t", "anchor_table": "t", "anchor_key": "id",
                        "target_column": "x", "target_stype": "numerical"}}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = Store.open(preprocess(src, meta, tmp_path / "store", encoder=HashEncoder(), progress=False))
    said = " ".join(str(w.message) for w in caught)
    assert "column 't.x': 2 of 6 rows hold numbers beyond ±1e18" in said
    assert "column 't.d': 2 of 6 rows hold dates before 1700 or after 2300" in said
    stats = s.table("t").column("x").stats
    ordinary = np.array([1.0, 2.0, 3.0, 4.0])
    assert stats["mean"] == ordinary.mean() and stats["std"] == ordinary.std() and stats["outliers"] == 2
    z = np.asarray(s.values("t", "x"))
    assert np.isfinite(z).all()
    np.testing.assert_allclose(z[[0, 1, 2, 5]], (ordinary - ordinary.mean()) / ordinary.std(), rtol=1e-6)
    assert z[3] == 1e6 and z[4] == -1e6  # far out, finite
    epoch = np.asarray(s.values("t", "d"))[:, 14]
    assert np.isfinite(epoch).all() and np.abs(epoch[:4]).max() < 2  # four days in 2020 keep their own scale
    target = np.asarray(s.task_arrays("x").target_values)
    assert np.isfinite(target).all() and sorted(target.tolist())[-1] == 1e6  # the task's target: the same rule
