"""How preprocessing reaches a raw database: `confluence.sources.RawDatabase` (a DuckDB connection with one
view per table), plus the two DuckDB -> Arrow helpers the passes use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from confluence.sources import RawDatabase, open_source
from confluence.sources.raw import quote_ident


def open_raw(source: str | Path | RawDatabase | Any, memory_limit_mb: int | None = None,
             threads: int | None = None) -> RawDatabase:
    """Return `source` itself when it is already opened (anything with `.con` and `.tables`), else open it with
    DuckDB's `memory_limit_mb` and `threads` (its connection is then locked: no later SET)."""
    if hasattr(source, "con") and hasattr(source, "tables"):
        return source
    return open_source(source, memory_limit_mb=memory_limit_mb, threads=threads)


def quote(name: str) -> str:
    """Quote an SQL identifier for DuckDB."""
    return quote_ident(name)


def arrow_reader(con: duckdb.DuckDBPyConnection, sql: str, batch_rows: int) -> pa.RecordBatchReader:
    """Run `sql` and stream the result as Arrow record batches (DuckDB 1.x and 2.x spellings)."""
    rel = con.sql(sql)
    if hasattr(rel, "to_arrow_reader"):
        return rel.to_arrow_reader(batch_rows)
    return rel.fetch_record_batch(batch_rows)


def arrow_table(con: duckdb.DuckDBPyConnection, sql: str) -> pa.Table:
    """Run `sql` and fetch the whole result as an Arrow table."""
    rel = con.sql(sql)
    if hasattr(rel, "to_arrow_table"):
        return rel.to_arrow_table()
    return rel.arrow()
