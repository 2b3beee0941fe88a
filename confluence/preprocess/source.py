"""How preprocessing reaches a raw database: a DuckDB connection with one view per table.

`open_raw` uses `confluence.sources.open_source` when that package is present (every supported source kind);
otherwise it opens a directory of Parquet / CSV files (one file per table, named after the table) itself.
Anything with a `.con` (DuckDB connection) and `.tables` (table names) attribute is accepted as is.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import duckdb
import pyarrow as pa

from confluence.errors import DataError


class RawLike(Protocol):
    """The part of `confluence.sources.RawDatabase` preprocessing uses."""

    con: duckdb.DuckDBPyConnection
    tables: list[str]


@dataclass
class FileDirSource:
    """A directory of `<table>.parquet` / `<table>.csv` files opened as DuckDB views."""

    path: Path
    con: duckdb.DuckDBPyConnection
    tables: list[str]


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def open_file_dir(path: str | Path) -> FileDirSource:
    """Open a directory of Parquet / CSV files, one view per file named after the file's stem."""
    path = Path(path)
    if not path.is_dir():
        raise DataError(f"{path}: source is not a directory of Parquet / CSV files")
    con = duckdb.connect()
    tables: list[str] = []
    for f in sorted(path.iterdir()):
        if f.suffix == ".parquet":
            reader = f"read_parquet('{_sql_str(f)}')"
        elif f.suffix == ".csv":
            reader = f"read_csv('{_sql_str(f)}', header = true)"
        else:
            continue
        con.execute(f"CREATE VIEW {_quote(f.stem)} AS SELECT * FROM {reader}")
        tables.append(f.stem)
    if not tables:
        raise DataError(f"{path}: no .parquet or .csv files found")
    return FileDirSource(path=path, con=con, tables=tables)


def _sql_str(p: Path) -> str:
    return str(p.absolute()).replace("'", "''")


def open_raw(source: Any) -> RawLike:
    """Return `source` itself when it is already opened, else open the path."""
    if hasattr(source, "con") and hasattr(source, "tables"):
        return source
    try:
        sources = importlib.import_module("confluence.sources")
    except ModuleNotFoundError as exc:
        if exc.name not in ("confluence.sources",):
            raise
        return open_file_dir(source)
    return sources.open_source(source)


def quote(name: str) -> str:
    """Quote an SQL identifier for DuckDB."""
    return _quote(name)


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
