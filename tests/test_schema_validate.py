"""Metadata validation: every kind of bad metadata or data gives a message naming its culprit, all at once."""

from __future__ import annotations

import json
from collections.abc import Callable

import pyarrow as pa
import pytest

from confluence.errors import MetadataError
from confluence.schema.metadata import parse_metadata
from confluence.schema.validate import load_and_validate, validate_against_data
from confluence.sources import open_source
from tests.fixtures.bookstore import bookstore_metadata, bookstore_tables, write_bookstore


def _set(table: str, column: str, value: pa.Array | list) -> Callable[[dict], None]:
    def edit(tables: dict[str, pa.Table]) -> None:
        t = tables[table]
        arr = pa.array(value) if isinstance(value, list) else value
        tables[table] = t.set_column(t.schema.get_field_index(column), column, arr)
    return edit


def _dup_pk(tables):
    ids = tables["customers"].column("customer_id").to_pylist()
    ids[5] = ids[4]
    _set("customers", "customer_id", pa.array(ids, pa.int64()))(tables)


def _null_pk(tables):
    ids = tables["books"].column("book_id").to_pylist()
    ids[0] = ids[3] = None
    _set("books", "book_id", pa.array(ids, pa.string()))(tables)


def _str_ts(tables):
    vals = [str(v) for v in tables["orders"].column("ordered_at").to_pylist()]
    _set("orders", "ordered_at", vals)(tables)


def _str_col(tables):
    _set("books", "price", [f"${i}" for i in range(tables["books"].num_rows)])(tables)


def _extra_col(tables):
    tables["books"] = tables["books"].append_column("isbn", pa.array([str(i) for i in range(tables["books"].num_rows)]))


def _drop_col(tables):
    tables["customers"] = tables["customers"].drop_columns(["age"])


def _bool_ints(tables):
    _set("customers", "is_premium", pa.array([i % 3 for i in range(tables["customers"].num_rows)], pa.int64()))(tables)


def _str_fk(tables):
    _set("orders", "customer_id", [f"c{v}" for v in tables["orders"].column("customer_id").to_pylist()])(tables)


def _extra_table(tables):
    tables["audit_log"] = pa.table({"x": [1, 2]})


def _m(path: list, value) -> Callable[[dict], None]:
    def edit(meta: dict) -> None:
        node = meta
        for key in path[:-1]:
            node = node[key]
        if value is _DELETE:
            del node[path[-1]]
        else:
            node[path[-1]] = value
    return edit


_DELETE = object()
_TASK = ["tasks", "order_rating"]

# (case id, data edit, metadata edit, substrings the message must contain)
DATA_CASES = [
    ("duplicate_pk", _dup_pk, None, ["table 'customers': primary key 'customer_id' is not unique", "e.g. 5"]),
    ("null_pk", _null_pk, None, ["table 'books': primary key 'book_id' is NULL in 2 row(s)"]),
    ("temporal_not_timestamp", _str_ts, None,
     ["column 'orders.ordered_at': is the temporal_column of 'orders' but holds string data"]),
    ("numerical_on_strings", _str_col, None, ["column 'books.price': declared numerical but holds non-numeric"]),
    ("column_missing_from_metadata", _extra_col, None, ["column 'books.isbn': in the data but not in the metadata"]),
    ("column_missing_from_data", _drop_col, None, ["column 'customers.age': in the metadata but not in the data"]),
    ("boolean_not_01", _bool_ints, None,
     ["column 'customers.is_premium': declared boolean but", "integers other than 0/1 (e.g. 2)"]),
    ("fk_type_mismatch", _str_fk, None,
     ["column 'orders.customer_id': foreign key holds string values but 'customers.customer_id' holds integer"]),
    ("table_missing_from_metadata", _extra_table, None, ["table 'audit_log': in the data but not in the metadata"]),
    ("timestamp_on_numbers", None, _m(["tables", "books", "columns", "price", "stype"], "timestamp"),
     ["column 'books.price': declared timestamp but holds double data"]),
    ("query_fails", None, _m(_TASK + ["query"], "SELECT order_id, rating FROM orderz"),
     ["task 'order_rating': its query fails", "orderz"]),
    ("missing_target_column", None, _m(_TASK + ["target_column"], "stars"),
     ["task 'order_rating': target_column 'stars' is not a column of its query result"]),
    ("missing_anchor_key", None, _m(_TASK + ["anchor_key"], "id"),
     ["task 'order_rating': anchor_key 'id' is not a column of its query result"]),
    ("missing_obs_time_column", None, _m(_TASK + ["observation_time_column"], "obs"),
     ["task 'order_rating': observation_time_column 'obs' is not a column"]),
    ("obs_time_not_timestamp", None, _m(["tasks", "orders_next_30d", "query"],
                                        "SELECT customer_id, 7 AS obs_time, 1.0 AS n FROM customers"),
     ["task 'orders_next_30d': observation_time_column 'obs_time' holds int32 data, not a timestamp"]),
    ("obs_time_null", None, _m(["tasks", "orders_next_30d", "query"],
                               "SELECT customer_id, CASE WHEN customer_id = 7 THEN NULL ELSE signed_up_at END"
                               " AS obs_time, 1.0 AS n FROM customers"),
     ["task 'orders_next_30d': observation_time_column 'obs_time' is NULL in 1 row(s) (e.g. anchor_key 7)"]),
    ("anchor_matches_nothing", None, _m(_TASK + ["query"], "SELECT order_id + 100000 AS order_id, rating FROM orders"),
     ["task 'order_rating': 500 of 500 row(s) have an anchor_key 'order_id' that matches no 'orders' row",
      "e.g. 101000"]),
    ("target_type_mismatch", None, _m(_TASK + ["target_stype"], "timestamp"),
     ["task 'order_rating': target_column 'rating' holds double data, which cannot be a timestamp target"]),
    ("empty_task", None, _m(_TASK + ["query"], "SELECT order_id, rating FROM orders WHERE false"),
     ["task 'order_rating': its query returns no rows"]),
    ("boolean_target_not_01", None, _m(_TASK + ["target_stype"], "boolean"),
     ["task 'order_rating': target_column 'rating' holds double data, which cannot be a boolean target"]),
    ("boolean_int_target_not_01", None, _m(["tasks", "orders_next_30d", "target_stype"], "boolean"),
     ["task 'orders_next_30d': boolean target_column 'n' holds integers other than 0/1"]),
    ("query_trailing_semicolon", None, _m(_TASK + ["query"], "SELECT order_id, rating FROM orders;"),
     ["task 'order_rating': its query ends with ';'"]),
    ("table_missing_from_data", None, _m(["tables", "wishlists"], {"columns": {"id": {"stype": "identifier"}}}),
     ["table 'wishlists': in the metadata but not in the data"]),
]

# Structural problems found by parse_metadata before any data is read.
STRUCT_CASES = [
    ("unknown_stype", _m(["tables", "books", "columns", "genre", "stype"], "colour"),
     ["column 'books.genre': unknown stype 'colour'"]),
    ("fk_to_non_pk", _m(["tables", "orders", "columns", "book_id", "foreign_key"], "books.title"),
     ["column 'orders.book_id': foreign_key 'books.title' must point at the primary key of 'books'"]),
    ("fk_to_unknown_table", _m(["tables", "orders", "columns", "book_id", "foreign_key"], "tomes.book_id"),
     ["column 'orders.book_id': foreign_key 'tomes.book_id' names unknown table 'tomes'"]),
    ("target_cannot_be_target", _m(_TASK + ["target_stype"], "text"),
     ["task 'order_rating': target_stype 'text' cannot be a target"]),
    ("temporal_wrong_stype", _m(["tables", "orders", "temporal_column"], "rating"),
     ["table 'orders': temporal_column 'rating' must have stype 'timestamp'"]),
]


def _validate(tmp_path, data_edit=None, meta_edit=None, kind="parquet"):
    tables = bookstore_tables("small")
    if data_edit:
        data_edit(tables)
    meta = bookstore_metadata()
    if meta_edit:
        meta_edit(meta)
    with open_source(write_bookstore(tmp_path, kind, tables=tables)) as raw:
        validate_against_data(parse_metadata(meta), raw)


@pytest.mark.parametrize("kind", ["parquet", "csv", "sqlite", "duckdb", "relbench"])
def test_reviewed_bookstore_metadata_validates(tmp_path, kind):
    _validate(tmp_path, kind=kind)


@pytest.mark.parametrize(("case", "data_edit", "meta_edit", "expected"), DATA_CASES, ids=[c[0] for c in DATA_CASES])
def test_bad_data_or_metadata_names_the_culprit(tmp_path, case, data_edit, meta_edit, expected):
    with pytest.raises(MetadataError) as info:
        _validate(tmp_path, data_edit, meta_edit)
    message = str(info.value)
    for text in expected:
        assert text in message, f"{case}: {text!r} not in\n{message}"
    # Consequences may add problems (a NULL PK also orphans task rows), but the culprit's comes first.
    assert expected[0] in info.value.problems[0], message


@pytest.mark.parametrize(("case", "meta_edit", "expected"), STRUCT_CASES, ids=[c[0] for c in STRUCT_CASES])
def test_structural_problems_name_the_culprit(case, meta_edit, expected):
    meta = bookstore_metadata()
    meta_edit(meta)
    with pytest.raises(MetadataError) as info:
        parse_metadata(meta)
    for text in expected:
        assert text in str(info.value), f"{case}: {text!r} not in\n{info.value}"


def test_all_problems_are_reported_at_once(tmp_path):
    def data_edit(tables):
        _dup_pk(tables)
        _extra_col(tables)

    def meta_edit(meta):
        _m(_TASK + ["query"], "SELECT nope FROM orders")(meta)
        _m(["tables", "books", "columns", "genre", "stype"], "numerical")(meta)

    with pytest.raises(MetadataError) as info:
        _validate(tmp_path, data_edit, meta_edit)
    problems = info.value.problems
    assert len(problems) == 4, problems
    assert any("customers" in p and "not unique" in p for p in problems)
    assert any("books.isbn" in p for p in problems)
    assert any("task 'order_rating'" in p for p in problems)
    assert any("books.genre" in p and "numerical" in p for p in problems)


def test_load_and_validate_reads_the_file(tmp_path):
    path = tmp_path / "meta.json"
    path.write_text(json.dumps(bookstore_metadata()))
    with open_source(write_bookstore(tmp_path, "duckdb", size="small")) as raw:
        meta = load_and_validate(path, raw)
        assert list(meta.tables) == ["customers", "books", "orders"]
        path.write_text("{ not json")
        with pytest.raises(MetadataError, match=r"meta\.json: not valid JSON at line 1"):
            load_and_validate(path, raw)


def test_unreadable_table_is_a_problem_not_a_traceback(tmp_path):
    path = write_bookstore(tmp_path, "csv", size="small")
    with open_source(path) as raw:
        # a row appended after opening no longer fits the pinned column types
        with (path / "orders.csv").open("a") as fh:
            fh.write('"o-1",1,"b101",3.0,1,0,2024-01-01 00:00:00,1\n')
        with pytest.raises(MetadataError) as info:
            validate_against_data(parse_metadata(bookstore_metadata()), raw)
    assert any(p.startswith("table 'orders': its data cannot be read") for p in info.value.problems), info.value
