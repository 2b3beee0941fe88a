"""A small synthetic bookstore database written in every source format, plus its reviewed metadata.

Reusable by every area's tests::

    from tests.conftest_data import bookstore_metadata, bookstore_tables, write_bookstore
    src = write_bookstore(tmp_path, "parquet")   # or csv, sqlite, duckdb, relbench
    meta = bookstore_metadata()                  # dict in the metadata-file shape

Deterministic: the same bytes of data for every call (numpy generator with a fixed seed). The store tests use a
different, hand-written bookstore (`tests/conftest_store.py`) whose every value they assert.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import sqlite3
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from confluence.fsutil import sqlite_type

BOOKSTORE_KINDS = ("parquet", "csv", "sqlite", "duckdb", "relbench")
NUM_CUSTOMERS, NUM_BOOKS, NUM_ORDERS = 60, 25, 500
_EPOCH = dt.datetime(2024, 1, 1)
_COUNTRIES = ["DE", "FR", "JP", "US", "BR"]
_GENRES = ["fantasy", "history", "poetry", "science", "thriller"]
_WORDS = ["reads", "mostly", "novels", "at", "night", "and", "loves", "old", "maps", "of", "the", "sea"]

_RELBENCH = {  # RelBench Table.save metadata: pkey_col, fkey_col_to_pkey_table, time_col
    "customers": ("customer_id", {}, "signed_up_at"),
    "books": ("book_id", {}, None),
    "orders": ("order_id", {"customer_id": "customers", "book_id": "books"}, "ordered_at"),
}


def bookstore_tables() -> dict[str, pa.Table]:
    """The three bookstore tables as Arrow tables (customers, books, orders), deterministic."""
    rng = np.random.default_rng(20240101)
    signed_up = [_EPOCH + dt.timedelta(days=int(d), hours=int(h))
                 for d, h in zip(rng.integers(0, 200, NUM_CUSTOMERS), rng.integers(0, 24, NUM_CUSTOMERS), strict=True)]
    ages = [None if rng.random() < 0.1 else int(a) for a in rng.integers(18, 80, NUM_CUSTOMERS)]
    customers = pa.table({
        "customer_id": pa.array(np.arange(1, NUM_CUSTOMERS + 1), pa.int64()),
        "name": [f"customer {i:03d}" for i in range(1, NUM_CUSTOMERS + 1)],
        "country": [_COUNTRIES[i] for i in rng.integers(0, len(_COUNTRIES), NUM_CUSTOMERS)],
        "age": pa.array(ages, pa.int64()),
        "is_premium": pa.array(rng.random(NUM_CUSTOMERS) < 0.3),
        "bio": [" ".join(rng.choice(_WORDS, size=int(rng.integers(4, 12)))) for _ in range(NUM_CUSTOMERS)],
        "signed_up_at": pa.array(signed_up, pa.timestamp("us")),
    })
    books = pa.table({
        "book_id": pa.array(np.arange(101, 101 + NUM_BOOKS), pa.int64()),
        "title": [f"Book number {i}" for i in range(NUM_BOOKS)],
        "genre": [_GENRES[i] for i in rng.integers(0, len(_GENRES), NUM_BOOKS)],
        "price": pa.array(np.round(rng.uniform(5, 40, NUM_BOOKS), 2), pa.float64()),
        "published_on": pa.array([dt.date(2000 + int(y), 1 + int(m), 1)
                                  for y, m in zip(rng.integers(0, 24, NUM_BOOKS), rng.integers(0, 12, NUM_BOOKS),
                                                  strict=True)], pa.date32()),
    })
    cust = rng.integers(0, NUM_CUSTOMERS, NUM_ORDERS)
    ordered = [signed_up[c] + dt.timedelta(days=int(d), minutes=int(m))
               for c, d, m in zip(cust, rng.integers(0, 120, NUM_ORDERS), rng.integers(0, 1440, NUM_ORDERS),
                                  strict=True)]
    ratings = [None if rng.random() < 0.25 else float(r) for r in rng.integers(1, 6, NUM_ORDERS)]
    orders = pa.table({
        "order_id": pa.array(np.arange(1000, 1000 + NUM_ORDERS), pa.int64()),
        "customer_id": pa.array(cust + 1, pa.int64()),
        "book_id": pa.array(rng.integers(101, 101 + NUM_BOOKS, NUM_ORDERS), pa.int64()),
        "quantity": pa.array(rng.integers(1, 4, NUM_ORDERS), pa.int64()),
        "rating": pa.array(ratings, pa.float64()),
        "ordered_at": pa.array(ordered, pa.timestamp("us")),
    })
    return {"customers": customers, "books": books, "orders": orders}


def bookstore_metadata() -> dict:
    """The reviewed metadata of the bookstore (a fresh dict each call, safe to mutate in a test)."""
    return copy.deepcopy(_METADATA)


_METADATA = {
    "name": "bookstore",
    "tables": {
        "books": {
            "primary_key": "book_id",
            "columns": {
                "book_id": {"stype": "identifier"},
                "title": {"stype": "text"},
                "genre": {"stype": "categorical"},
                "price": {"stype": "numerical"},
                "published_on": {"stype": "timestamp"},
            },
        },
        "customers": {
            "primary_key": "customer_id",
            "temporal_column": "signed_up_at",
            "columns": {
                "customer_id": {"stype": "identifier"},
                "name": {"stype": "identifier"},
                "country": {"stype": "categorical"},
                "age": {"stype": "numerical"},
                "is_premium": {"stype": "boolean"},
                "bio": {"stype": "text", "description": "free-form biography"},
                "signed_up_at": {"stype": "timestamp"},
            },
        },
        "orders": {
            "primary_key": "order_id",
            "temporal_column": "ordered_at",
            "columns": {
                "order_id": {"stype": "identifier"},
                "customer_id": {"stype": "identifier", "foreign_key": "customers.customer_id"},
                "book_id": {"stype": "identifier", "foreign_key": "books.book_id"},
                "quantity": {"stype": "categorical"},
                "rating": {"stype": "numerical", "description": "1-5 stars, null if not reviewed"},
                "ordered_at": {"stype": "timestamp"},
            },
        },
    },
    "tasks": {
        "order_rating": {
            "query": "SELECT order_id, rating FROM orders WHERE rating IS NOT NULL",
            "anchor_table": "orders", "anchor_key": "order_id",
            "target_column": "rating", "target_stype": "numerical",
        },
        "book_genre": {
            "query": "SELECT book_id, genre FROM books",
            "anchor_table": "books", "anchor_key": "book_id",
            "target_column": "genre", "target_stype": "categorical",
            "exclude_columns": ["title"],
        },
        "customer_premium": {
            "query": "SELECT customer_id, is_premium FROM customers",
            "anchor_table": "customers", "anchor_key": "customer_id",
            "target_column": "is_premium", "target_stype": "boolean",
        },
        "order_time": {
            "query": "SELECT order_id, ordered_at FROM orders",
            "anchor_table": "orders", "anchor_key": "order_id",
            "target_column": "ordered_at", "target_stype": "timestamp",
        },
        "orders_next_30d": {
            "query": (
                "SELECT c.customer_id, c.signed_up_at + INTERVAL 30 DAY AS obs_time, count(o.order_id) AS n"
                " FROM customers c LEFT JOIN orders o ON o.customer_id = c.customer_id"
                " AND o.ordered_at > c.signed_up_at + INTERVAL 30 DAY"
                " AND o.ordered_at <= c.signed_up_at + INTERVAL 60 DAY GROUP BY ALL"
            ),
            "anchor_table": "customers", "anchor_key": "customer_id",
            "target_column": "n", "target_stype": "numerical",
            "observation_time_column": "obs_time",
            "description": "orders placed in the 30 days after the observation time",
        },
    },
}


def write_bookstore(directory: str | Path, kind: str = "parquet", tables: dict[str, pa.Table] | None = None) -> Path:
    """Write the bookstore (or the given `tables`) under `directory` in one source format; returns the source path.

    parquet / csv / relbench -> a directory (`bookstore_<kind>/`), sqlite / duckdb -> a file.
    """
    directory = Path(directory)
    tables = bookstore_tables() if tables is None else tables
    if kind == "parquet":
        out = directory / "bookstore_parquet"
        out.mkdir(parents=True, exist_ok=True)
        for name, t in tables.items():
            pq.write_table(t, out / f"{name}.parquet")
    elif kind == "relbench":
        out = directory / "bookstore_relbench"
        (out / "db").mkdir(parents=True, exist_ok=True)
        for name, t in tables.items():
            pkey, fkeys, tcol = _RELBENCH.get(name, (None, {}, None))
            meta = dict(t.schema.metadata or {})
            meta.update({b"fkey_col_to_pkey_table": json.dumps(fkeys).encode(), b"pkey_col": json.dumps(pkey).encode(),
                         b"time_col": json.dumps(tcol).encode()})
            pq.write_table(t.replace_schema_metadata(meta), out / "db" / f"{name}.parquet")
    elif kind == "csv":
        out = directory / "bookstore_csv"
        out.mkdir(parents=True, exist_ok=True)
        for name, t in tables.items():
            pacsv.write_csv(t, out / f"{name}.csv")
    elif kind == "sqlite":
        out = directory / "bookstore.sqlite"
        out.unlink(missing_ok=True)
        con = sqlite3.connect(out)
        for name, t in tables.items():
            decl = ", ".join(f'"{f.name}" {sqlite_type(f.type)}' for f in t.schema)
            con.execute(f'CREATE TABLE "{name}" ({decl})')
            rows = [tuple(_sqlite_value(v) for v in row.values()) for row in t.to_pylist()]
            con.executemany(f'INSERT INTO "{name}" VALUES ({", ".join("?" * t.num_columns)})', rows)
        con.commit()
        con.close()
    elif kind == "duckdb":
        out = directory / "bookstore.duckdb"
        out.unlink(missing_ok=True)
        con = duckdb.connect(str(out))
        for name, t in tables.items():
            con.register("__t", t)
            con.execute(f'CREATE TABLE "{name}" AS SELECT * FROM __t')
            con.unregister("__t")
        con.close()
    else:
        raise ValueError(f"unknown bookstore kind {kind!r} (expected one of {BOOKSTORE_KINDS})")
    return out


def _sqlite_value(v: object) -> object:
    if isinstance(v, dt.datetime | dt.date):
        return v.isoformat(sep=" ") if isinstance(v, dt.datetime) else v.isoformat()
    return v
