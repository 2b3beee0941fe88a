"""open_source on every source kind: same tables, rows and values; hints; clear errors naming the file."""

from __future__ import annotations

import sqlite3

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from confluence.errors import DataError
from confluence.sources import SOURCE_KINDS, open_source
from tests.fixtures.bookstore import BOOKSTORE_KINDS, bookstore_tables, write_bookstore


@pytest.fixture(scope="module")
def expected() -> dict[str, pa.Table]:
    return bookstore_tables("small")


@pytest.mark.parametrize("kind", BOOKSTORE_KINDS)
def test_every_kind_reads_the_bookstore(tmp_path, kind, expected):
    path = write_bookstore(tmp_path, kind, size="small")
    with open_source(path) as raw:
        assert raw.kind == kind
        assert raw.tables == ["books", "customers", "orders"]
        for name, table in expected.items():
            assert raw.num_rows(name) == table.num_rows
            schema = raw.schema(name)
            assert schema.names == table.column_names
            got = pa.Table.from_batches(list(raw.scan(name, batch_rows=64)), schema=schema)
            for col in table.column_names:
                want = table.column(col)
                have = got.column(col)
                if pa.types.is_floating(want.type) and pa.types.is_integer(have.type):
                    have = have.cast(want.type)  # CSV writes 3.0 as "3", which DuckDB sniffs as an integer
                assert have.cast(want.type).to_pylist() == want.to_pylist(), f"{kind}: {name}.{col}"
            temporal = {"customers": "signed_up_at", "orders": "ordered_at"}.get(name)
            assert temporal is None or pa.types.is_timestamp(schema.field(temporal).type)


@pytest.mark.parametrize("kind", SOURCE_KINDS)
def test_explicit_kind_matches_detection(tmp_path, kind):
    path = write_bookstore(tmp_path, kind, size="small")
    with open_source(path, kind=kind) as raw:
        assert raw.kind == kind


def test_relbench_hints_come_from_parquet_metadata(tmp_path):
    with open_source(write_bookstore(tmp_path, "relbench", size="small")) as raw:
        assert raw.hints["orders"].primary_key == "order_id"
        assert raw.hints["orders"].foreign_keys == {"book_id": "books", "customer_id": "customers"}
        assert raw.hints["orders"].temporal_column == "ordered_at"
        assert raw.hints["books"].temporal_column is None
    with open_source(write_bookstore(tmp_path, "parquet", size="small")) as raw:
        assert raw.hints == {}


def test_scan_streams_in_batches_and_selects_columns(tmp_path):
    with open_source(write_bookstore(tmp_path, "parquet", size="small")) as raw:
        batches = list(raw.scan("orders", ["rating", "order_id"], batch_rows=128))
        assert [b.num_rows for b in batches] == [128, 128, 128, 116]
        assert batches[0].schema.names == ["rating", "order_id"]
        with pytest.raises(DataError, match="table 'orders'.*'nope'"):
            list(raw.scan("orders", ["nope"]))
        with pytest.raises(DataError, match="no table 'nope'"):
            raw.num_rows("nope")


def test_identifiers_are_quoted(tmp_path):
    d = tmp_path / "odd"
    d.mkdir()
    pq.write_table(pa.table({"select": [1, 2], 'we"ird col': ["a", "b"]}), d / "order items.parquet")
    with open_source(d) as raw:
        assert raw.tables == ["order items"]
        assert raw.schema("order items").names == ["select", 'we"ird col']
        assert next(raw.scan("order items", ['we"ird col'])).column(0).to_pylist() == ["a", "b"]


def test_csv_na_strings_are_null(tmp_path):
    d = tmp_path / "csv"
    d.mkdir()
    (d / "t.csv").write_text("id,speed,when\n1,NA,2013-01-01T06:00:00Z\n2,12,NA\n")
    with open_source(d) as raw:
        t = pa.Table.from_batches(list(raw.scan("t")))
        assert t.column("speed").to_pylist() == [None, 12]
        assert t.column("when").null_count == 1
        assert pa.types.is_timestamp(t.schema.field("when").type)
        assert t.schema.field("when").type.tz in ("UTC", "Etc/UTC")


def test_broken_parquet_names_the_file(tmp_path):
    d = tmp_path / "broken"
    d.mkdir()
    pq.write_table(pa.table({"a": [1]}), d / "good.parquet")
    (d / "bad.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(DataError, match=r"bad\.parquet"):
        open_source(d)


def test_unknown_format_and_missing_path(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("hello")
    with pytest.raises(DataError, match=r"notes\.txt: not a SQLite or DuckDB"):
        open_source(f)
    with pytest.raises(DataError, match=r"nowhere: no such file"):
        open_source(tmp_path / "nowhere")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match=r"empty: no \.parquet or \.csv files"):
        open_source(empty)
    with pytest.raises(DataError, match="unknown source kind 'xls'"):
        open_source(empty, kind="xls")
    with pytest.raises(DataError, match="a sqlite source must be a database file"):
        open_source(empty, kind="sqlite")


def test_sqlite_value_of_wrong_type_names_table_column_row(tmp_path):
    path = tmp_path / "bad.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (id INTEGER, amount INTEGER)")
    con.executemany("INSERT INTO t VALUES (?, ?)", [(1, 5), (2, "lots")])
    con.commit()
    con.close()
    with pytest.raises(DataError, match=r"table 't', column 'amount' is declared BIGINT but row 1 holds 'lots'"):
        open_source(path)


@pytest.mark.parametrize("eol", ["\n", "\r\n"], ids=["lf", "crlf"])
def test_csv_bad_row_names_the_file(tmp_path, eol):
    d = tmp_path / "csv"
    d.mkdir()
    (d / "t.csv").write_bytes(eol.join(["id,x", "1,2", "3,4,5,6", ""]).encode())
    with pytest.raises(DataError, match=r"t\.csv: line 3: 4 fields where the header has 2: '3,4,5,6'$"):
        raw = open_source(d)
        list(raw.scan("t"))


def test_corrupt_duckdb_file_names_the_file(tmp_path):
    path = tmp_path / "x.duckdb"
    path.write_bytes(b"\0" * 8 + b"DUCK" + b"\0" * 4000)
    with pytest.raises(DataError, match=r"x\.duckdb"):
        open_source(path)
