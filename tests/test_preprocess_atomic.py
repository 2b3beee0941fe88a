"""Atomic writes, determinism (identical bytes, whatever the batch size) and errors that name their culprit."""

from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from confluence.errors import DataError, MetadataError, StoreError
from confluence.outputs import OutputError
from confluence.preprocess import pipeline, preprocess
from confluence.schema.metadata import parse_metadata
from confluence.sources import open_source
from confluence.store import Store
from tests.fixtures.bookstore import BOOKSTORE_METADATA, HashEncoder, bookstore_files


def digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def run(src, meta, out, **kw) -> Path:
    return preprocess(src, meta, out, encoder=HashEncoder(), progress=False, **kw)


def test_two_runs_identical_bytes(tmp_path):
    src, meta = bookstore_files(tmp_path)
    a, b = run(src, meta, tmp_path / "a"), run(src, meta, tmp_path / "b")
    da, db = digest(a), digest(b)
    assert da == db and len(da) > 40


def _wide_source(d: Path, n: int = 2000) -> tuple[Path, dict]:
    rng = np.random.default_rng(1)
    src = d / "wide"
    src.mkdir()
    words = np.array(["alpha", "beta", "gamma", "delta", "eps"])
    pq.write_table(pa.table({
        "id": pa.array(np.arange(n)),
        "x": pa.array(rng.normal(size=n)),
        "flag": pa.array(rng.random(n) > 0.5),
        "cat": pa.array(words[rng.integers(0, 5, n)]),
        "txt": pa.array([f"t{i % 97}" for i in range(n)]),
        "when": pa.array(rng.integers(0, 10**15, n), pa.timestamp("us")),
        "parent": pa.array(rng.integers(0, n + 10, n)),
    }), src / "items.parquet")
    meta = {"name": "wide", "tables": {"items": {"primary_key": "id", "temporal_column": "when", "columns": {
        "id": {"stype": "identifier"}, "x": {"stype": "numerical"}, "flag": {"stype": "boolean"},
        "cat": {"stype": "categorical"}, "txt": {"stype": "text"}, "when": {"stype": "timestamp"},
        "parent": {"stype": "identifier", "foreign_key": "items.id"}}}},
        "tasks": {"x": {"query": "SELECT id, x FROM items", "anchor_table": "items", "anchor_key": "id",
                        "target_column": "x", "target_stype": "numerical"}}}
    return src, meta


def test_streaming_batches_give_identical_bytes(tmp_path, monkeypatch):
    src, meta = _wide_source(tmp_path)
    db = parse_metadata(meta)
    one = run(src, db, tmp_path / "one")
    monkeypatch.setattr(pipeline, "batch_rows_for", lambda _mb: 24)  # 84 batches per column
    many = run(src, db, tmp_path / "many")
    assert digest(one) == digest(many)
    s = Store.open(many)
    assert s.meta["graph"]["dangling"]["items.parent"] > 0


def test_interrupted_run_leaves_nothing_that_loads(tmp_path, monkeypatch):
    src, meta = bookstore_files(tmp_path)
    out = tmp_path / "store"

    def boom(*a, **k):
        raise KeyboardInterrupt  # a crash after every table and graph file was written

    monkeypatch.setattr(pipeline, "embed_into", boom)
    with pytest.raises(KeyboardInterrupt):
        run(src, meta, out)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []
    with pytest.raises(StoreError, match="not a processed store"):
        Store.open(out)


def test_interrupted_run_keeps_the_old_store(tmp_path, monkeypatch):
    src, meta = bookstore_files(tmp_path)
    out = run(src, meta, tmp_path / "store")
    before = digest(out)
    monkeypatch.setattr(pipeline, "build_graph", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("crash")))
    with pytest.raises(RuntimeError, match="crash"):
        run(src, meta, out)
    assert digest(out) == before
    Store.open(out)


def test_half_written_directory_does_not_load(tmp_path, monkeypatch):
    """Even a tmp directory left by a killed process (no cleanup ran) is not a store."""
    src, meta = bookstore_files(tmp_path)
    monkeypatch.setattr(pipeline.StoreWriter, "abort", lambda self: None)
    monkeypatch.setattr(pipeline, "embed_into", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("kill")))
    with pytest.raises(RuntimeError):
        run(src, meta, tmp_path / "store")
    (tmp,) = [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    assert (tmp / "graph" / "row_time.npy").exists()
    with pytest.raises(StoreError, match="no metadata.json"):
        Store.open(tmp)


def test_rerun_replaces_existing_store(tmp_path):
    src, meta = bookstore_files(tmp_path)
    out = run(src, meta, tmp_path / "store")
    m = copy.deepcopy(BOOKSTORE_METADATA)
    m["tasks"] = {}
    out2 = run(src, parse_metadata(m), out)
    assert Store.open(out2).tasks == [] and not (out2 / "tasks").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bookstore", "bookstore.metadata.json", "store"]


def _with_table(tmp_path: Path, table: str, data: pa.Table) -> tuple[Path, Path]:
    src, meta = bookstore_files(tmp_path)
    pq.write_table(data, src / f"{table}.parquet")
    return src, meta


def test_duplicate_and_nan_primary_keys(tmp_path):
    from tests.fixtures.bookstore import bookstore_tables

    books = bookstore_tables()["books"]
    src, meta = _with_table(tmp_path, "books", books.set_column(0, "book_id", pa.array(["b1", "b1", "b3"])))
    with pytest.raises(DataError, match="table 'books', column 'book_id': primary key value 'b1' occurs more"):
        run(src, meta, tmp_path / "s", validate=False)
    with pytest.raises(MetadataError, match="primary key 'book_id' is not unique"):
        run(src, meta, tmp_path / "s")
    cust = bookstore_tables()["customers"]
    src, meta = _with_table(tmp_path, "customers",
                            cust.set_column(0, "customer_id", pa.array([1.0, float("nan"), 3.0, 4.0])))
    with pytest.raises(DataError, match="table 'customers', column 'customer_id', row 1: primary key is nan"):
        run(src, meta, tmp_path / "s", validate=False)
    assert not (tmp_path / "s").exists()


def test_numerical_column_with_strings(tmp_path):
    from tests.fixtures.bookstore import bookstore_tables

    books = bookstore_tables()["books"]
    src, meta = _with_table(tmp_path, "books", books.set_column(2, "price", pa.array(["10", "cheap", "30"])))
    with pytest.raises(DataError, match="table 'books', column 'price', row 1: numerical column holds the non-number"):
        run(src, meta, tmp_path / "s", validate=False)


def test_task_errors_name_the_task(tmp_path):
    src, meta_path = bookstore_files(tmp_path)
    m = copy.deepcopy(BOOKSTORE_METADATA)
    m["tasks"] = {"bad": {"query": "SELECT order_id, 'x' || status AS s FROM orders", "anchor_table": "orders",
                          "anchor_key": "order_id", "target_column": "s", "target_stype": "numerical"}}
    with pytest.raises(DataError, match="task 'bad', result column 's', row 0: numerical column holds the non-number 'x10'"):
        run(src, parse_metadata(m), tmp_path / "s", validate=False)
    m["tasks"] = {"bad": {"query": "SELECT order_id FROM orders", "anchor_table": "orders",
                          "anchor_key": "order_id", "target_column": "rating", "target_stype": "numerical"}}
    with pytest.raises(DataError, match="task 'bad': query failed or lacks the columns"):
        run(src, parse_metadata(m), tmp_path / "s", validate=False)


def test_unmatched_anchor_keys_reported(tmp_path):
    src, _ = bookstore_files(tmp_path)
    m = copy.deepcopy(BOOKSTORE_METADATA)
    m["tasks"] = {"t": {"query": "SELECT order_id + 1 AS order_id, rating FROM orders", "anchor_table": "orders",
                        "anchor_key": "order_id", "target_column": "rating", "target_stype": "numerical"}}
    s = Store.open(run(src, parse_metadata(m), tmp_path / "s", validate=False))
    assert s.meta["tasks"][0]["unmatched_anchor_keys"] == 1  # 106 matches no order
    assert s.task("t").num_seeds == 5


def test_metadata_json_is_stable(tmp_path):
    src, meta = bookstore_files(tmp_path)
    out = run(src, meta, tmp_path / "s")
    m = json.loads((out / "metadata.json").read_text())
    assert list(m["files"]) == sorted(m["files"])
    assert "time" not in json.dumps(m["text_encoder"])


def test_refuses_to_replace_a_directory_that_is_not_a_store(tmp_path):
    src, meta = bookstore_files(tmp_path)
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("do not delete")
    with pytest.raises(OutputError, match="is not empty \\(it holds 'thesis.tex'\\) and was not written by "
                                          "confluence; nothing was changed"):
        run(src, meta, precious)
    assert (precious / "thesis.tex").read_text() == "do not delete"
    (tmp_path / "empty").mkdir()
    Store.open(run(src, meta, tmp_path / "empty"))


def test_timestamp_out_of_range_names_the_row(tmp_path):
    from tests.fixtures.bookstore import bookstore_tables

    cust = bookstore_tables()["customers"]
    far = pa.array([0, 86_400, 400_000_000_000, 0], pa.timestamp("s"))  # row 2 is in the year 14645
    src, meta = _with_table(tmp_path, "customers", cust.set_column(6, "signed_up_at", far))
    with pytest.raises(DataError, match="table 'customers', column 'signed_up_at', row 2: timestamp out of range"):
        run(src, meta, tmp_path / "s", validate=False)
    assert not (tmp_path / "s").exists()


def test_cell_masking_value_outside_the_column_categories(tmp_path):
    src, _ = bookstore_files(tmp_path)
    m = copy.deepcopy(BOOKSTORE_METADATA)
    m["tasks"] = {"shifted": {"query": "SELECT order_id, status * 3 AS status FROM orders", "anchor_table": "orders",
                              "anchor_key": "order_id", "target_column": "status", "target_stype": "categorical"}}
    with pytest.raises(DataError, match="task 'shifted', result column 'status', row 0: target value 30 is not a"
                                        " category of column 'orders.status'"):
        run(src, parse_metadata(m), tmp_path / "s")


def _dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_leftovers_of_a_killed_run_are_cleaned(tmp_path):
    from confluence.preprocess.writer import recover_leftovers

    src, meta = bookstore_files(tmp_path)
    out = run(src, meta, tmp_path / "store")
    before = digest(out)
    pid = _dead_pid()
    # killed between the two renames of a swap: the old store sits at .old-<pid>, no store at out
    (tmp_path / f"store.tmp-{pid}").mkdir()
    (tmp_path / f"store.tmp-{pid}" / "junk.npy").write_bytes(b"x")
    out.rename(tmp_path / f"store.old-{pid}")
    alive = tmp_path / f"store.tmp-{os.getpid()}"
    alive.mkdir()  # a live process's directory is left alone
    recover_leftovers(out)
    assert digest(out) == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("store")) == [
        "store", f"store.tmp-{os.getpid()}"]
    alive.rmdir()


def test_unreadable_column_is_a_data_error(tmp_path):
    src, meta = bookstore_files(tmp_path)
    raw = open_source(src)
    # a view whose column fails at read time (a cast that fails on one row only)
    sql = (
        "CREATE OR REPLACE VIEW books AS SELECT book_id, title,"
        " CAST(CASE WHEN book_id = 'b3' THEN 'oops' ELSE '1.5' END AS DOUBLE) AS price, published"
        f" FROM read_parquet('{src / 'books.parquet'}')"
    )
    raw.con.execute(sql)
    with pytest.raises(DataError, match="table 'books', column 'price': cannot read it: Conversion Error"):
        run(raw, meta, tmp_path / "s", validate=False)
