"""Raw sources: open a Parquet / CSV directory, a SQLite or DuckDB file, or a RelBench folder as a DuckDB
connection with one view per table (`open_source`)."""

from __future__ import annotations

from pathlib import Path

from confluence.errors import DataError
from confluence.sources import readers
from confluence.sources.data_warnings import DataWarning, StrictDataError
from confluence.sources.raw import SOURCE_KINDS, RawDatabase, TableHints, quote_ident, quote_literal

__all__ = ["SOURCE_KINDS", "DataWarning", "RawDatabase", "StrictDataError", "TableHints", "open_source",
           "quote_ident", "quote_literal"]


def open_source(path: str | Path, kind: str | None = None) -> RawDatabase:
    """Open a raw database; `kind` (parquet, csv, sqlite, duckdb, relbench) is detected when not given.

    Raises `DataError` naming the file for a missing path, an unknown format or an unreadable file, and for a
    CSV file the malformed line (extra fields, an unterminated quote; see `confluence.sources.csv_check`).
    """
    path = Path(path)
    if kind is None:
        kind = readers.detect_kind(path)
    elif kind not in SOURCE_KINDS:
        raise DataError(f"{path}: unknown source kind {kind!r} (expected one of: {', '.join(SOURCE_KINDS)})")
    elif not path.exists():
        raise DataError(f"{path}: no such file or directory")
    directory = kind in ("parquet", "csv", "relbench")
    if directory != path.is_dir():
        what = "a directory" if directory else "a database file"
        raise DataError(f"{path}: a {kind} source must be {what}")
    if kind in ("parquet", "relbench"):
        return readers.open_parquet(path, relbench=kind == "relbench")
    if kind == "csv":
        return readers.open_csv(path)
    if kind == "duckdb":
        return readers.open_duckdb(path)
    return readers.open_sqlite(path)
