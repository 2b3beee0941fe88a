"""Fixtures of the preprocessing / store tests: a deterministic hashing text encoder and a tiny bookstore.

Import explicitly: `from tests.conftest_store import HashEncoder, write_bookstore`.

Two bookstores exist on purpose: this one is hand-written (four customers, a dangling foreign key, duplicate
texts) so the store tests can assert every encoded value and byte; `tests/conftest_data.py` generates a larger one
(60 / 25 / 500 rows) in every source format for the source, schema and end-to-end tests.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


class HashEncoder:
    """A deterministic TextEncoder for tests: each string maps to a fixed pseudo-random unit vector."""

    kind = "hash"

    def __init__(self, dim: int = 16):
        self._dim = dim
        self.calls: list[int] = []

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def fingerprint(self) -> str:
        return f"hash-{self._dim}"

    def encode(self, texts: Sequence[str], batch_size: int = 4096) -> np.ndarray:
        self.calls.append(len(texts))
        out = np.empty((len(texts), self._dim), dtype=np.float32)
        for i, t in enumerate(texts):
            seed = int.from_bytes(hashlib.sha256(t.encode("utf-8")).digest()[:8], "little")
            v = np.random.default_rng(seed).standard_normal(self._dim)
            out[i] = v / np.linalg.norm(v)
        return out


def ts(*args: int) -> dt.datetime:
    return dt.datetime(*args)


def bookstore_tables() -> dict[str, pa.Table]:
    """Three tables with nulls, a dangling FK, duplicate texts, integer categories and a static table."""
    customers = pa.table({
        "customer_id": pa.array([1, 2, 3, 4], pa.int64()),
        "country": pa.array(["fr", "de", "fr", None]),
        "age": pa.array([30.0, None, 50.0, 40.0]),
        "is_premium": pa.array([True, False, None, True]),
        "bio": pa.array(["likes books", None, "reads a lot", "likes books"]),
        "notes": pa.array(["x", "y", "z", "w"]),
        "signed_up_at": pa.array([ts(2020, 1, 1), ts(2020, 2, 1), ts(2020, 3, 1), ts(2020, 4, 1)],
                                 pa.timestamp("us")),
    })
    books = pa.table({
        "book_id": pa.array(["b1", "b2", "b3"]),
        "title": pa.array(["Dune", "Emma", "reads a lot"]),
        "price": pa.array([10.0, 20.0, 30.0]),
        "published": pa.array([dt.date(1965, 8, 1), dt.date(1815, 12, 23), None], pa.date32()),
    })
    orders = pa.table({
        "order_id": pa.array([100, 101, 102, 103, 104, 105], pa.int64()),
        "customer_id": pa.array([1, 1, 2, 99, None, 1], pa.int64()),
        "book_id": pa.array(["b1", "b2", "b1", "b3", "b2", "b3"]),
        "rating": pa.array([5.0, None, 3.0, 4.0, float("nan"), 1.0]),
        "status": pa.array([10, 2, 1, 2, None, 10], pa.int32()),
        "gift": pa.array([1, 0, 0, 1, 0, None], pa.int8()),
        "ordered_at": pa.array([ts(2020, 1, 5, 10, 30, 15), ts(2020, 1, 3), ts(2020, 2, 10), ts(2020, 3, 1),
                                None, ts(2020, 1, 3)], pa.timestamp("us")),
    })
    return {"customers": customers, "books": books, "orders": orders}


BOOKSTORE_METADATA = {
    "name": "bookstore",
    "tables": {
        "customers": {
            "primary_key": "customer_id", "temporal_column": "signed_up_at",
            "columns": {
                "customer_id": {"stype": "identifier"},
                "country": {"stype": "categorical"},
                "age": {"stype": "numerical"},
                "is_premium": {"stype": "boolean"},
                "bio": {"stype": "text", "description": "free-form biography"},
                "notes": {"stype": "ignored"},
                "signed_up_at": {"stype": "timestamp"},
            },
        },
        "books": {
            "primary_key": "book_id",
            "columns": {
                "book_id": {"stype": "identifier"},
                "title": {"stype": "text"},
                "price": {"stype": "numerical"},
                "published": {"stype": "timestamp"},
            },
        },
        "orders": {
            "primary_key": "order_id", "temporal_column": "ordered_at",
            "columns": {
                "order_id": {"stype": "identifier"},
                "customer_id": {"stype": "identifier", "foreign_key": "customers.customer_id"},
                "book_id": {"stype": "identifier", "foreign_key": "books.book_id"},
                "rating": {"stype": "numerical", "description": "1-5 stars"},
                "status": {"stype": "categorical"},
                "gift": {"stype": "boolean"},
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
        "order_status": {
            "query": "SELECT order_id, status FROM orders",
            "anchor_table": "orders", "anchor_key": "order_id",
            "target_column": "status", "target_stype": "categorical", "exclude_columns": ["rating", "book_id"],
        },
        "orders_next_30d": {
            "query": "SELECT c.customer_id, c.signed_up_at + INTERVAL 30 DAY AS obs_time, count(o.order_id) AS n"
                     " FROM customers c LEFT JOIN orders o ON o.customer_id = c.customer_id"
                     " AND o.ordered_at <= c.signed_up_at + INTERVAL 30 DAY GROUP BY ALL",
            "anchor_table": "customers", "anchor_key": "customer_id",
            "target_column": "n", "target_stype": "numerical", "observation_time_column": "obs_time",
            "description": "orders in the first 30 days",
        },
        "country_upper": {
            "query": "SELECT customer_id, upper(country) AS country_uc FROM customers",
            "anchor_table": "customers", "anchor_key": "customer_id",
            "target_column": "country_uc", "target_stype": "categorical",
        },
        "book_expensive": {
            "query": "SELECT book_id, price > 15 AS expensive FROM books",
            "anchor_table": "books", "anchor_key": "book_id",
            "target_column": "expensive", "target_stype": "boolean",
        },
    },
}


def write_bookstore(directory: Path) -> tuple[Path, Path]:
    """Write the bookstore as Parquet files plus its metadata file; returns (source dir, metadata path)."""
    src = Path(directory) / "bookstore"
    src.mkdir(parents=True, exist_ok=True)
    for name, table in bookstore_tables().items():
        pq.write_table(table, src / f"{name}.parquet")
    meta = Path(directory) / "bookstore.metadata.json"
    meta.write_text(json.dumps(BOOKSTORE_METADATA, indent=2))
    return src, meta
