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
