"""Raw sources: open a Parquet / CSV directory, a SQLite or DuckDB file, a RelBench folder or a PostgreSQL schema
(`postgresql://` URL) as a DuckDB connection with one view or table per table (`open_source`)."""

from __future__ import annotations

from pathlib import Path

from confluence.errors import DataError
from confluence.sources import readers, relbench_tasks
from confluence.sources.data_warnings import DataWarning, StrictDataError
from confluence.sources.pg_url import is_postgres_url, looks_like_postgres_url, redact_url
from confluence.sources.raw import (
    SERVER_KINDS,
    SOURCE_KINDS,
    RawDatabase,
    TableHints,
    quote_ident,
    quote_literal,
)
from confluence.sources.sandbox import lock_down

__all__ = ["SERVER_KINDS", "SOURCE_KINDS", "DataWarning", "RawDatabase", "StrictDataError", "TableHints",
           "is_postgres_url", "open_source", "quote_ident", "quote_literal", "redact_url"]


def open_source(path: str | Path, kind: str | None = None, *, memory_limit_mb: int | None = None,
                threads: int | None = None) -> RawDatabase:
    """Open a raw database; `kind` (parquet, csv, sqlite, duckdb, relbench, postgresql) is detected when not given.

    A `postgresql://` (or `postgres://`) URL reads that server's schema (`?schema=NAME`, default `public`) into
    DuckDB (see `confluence.sources.postgres`). DuckDB's `memory_limit_mb` and `threads` apply when given: they
    are set here because the connection is then locked (`confluence.sources.sandbox.lock_down`: it reads only the
    source's files, writes nothing, and its settings cannot change). Raises `DataError` naming the file (or the URL
    without its password) for a missing path, an unknown format or an unreadable file, and for a CSV file the
    malformed line (extra fields, an unterminated quote; see `confluence.sources.csv_check`).
    """
    if isinstance(path, str) and is_postgres_url(path):
        if kind not in (None, "postgresql"):
            raise DataError(f"{redact_url(path)}: a URL is a postgresql source, not {kind!r}")
        from confluence.sources.postgres import open_postgres

        return open_postgres(path, memory_limit_mb=memory_limit_mb, threads=threads)
    if looks_like_postgres_url(path):  # e.g. POSTGRESQL:// or postgresql:/ : never shown with its password
        raise DataError(f"{redact_url(str(path))}: not a PostgreSQL URL libpq reads; write it as "
                        "postgresql://[user[:password]@][host][:port][/db] (lower-case scheme, two slashes)")
    path = Path(path)
    if kind == "postgresql":
        raise DataError(f"{path}: a postgresql source is a URL: postgresql://[user[:password]@][host][:port][/db]")
    if kind is None:
        kind = readers.detect_kind(path)
    elif kind not in SOURCE_KINDS:
        raise DataError(f"{path}: unknown source kind {kind!r} (expected one of:"
                        f" {', '.join(SOURCE_KINDS + SERVER_KINDS)})")
    elif not path.exists():
        raise DataError(f"{path}: no such file or directory")
    directory = kind in ("parquet", "csv", "relbench")
    if directory != path.is_dir():
        what = "a directory" if directory else "a database file"
        raise DataError(f"{path}: a {kind} source must be {what}")
    if kind in ("parquet", "relbench"):
        raw = readers.open_parquet(path, relbench=kind == "relbench")
    elif kind == "csv":
        raw = readers.open_csv(path)
    elif kind == "duckdb":
        raw = readers.open_duckdb(path)
    else:
        raw = readers.open_sqlite(path)
    # the files the views read (a SQLite source is copied: none); RelBench task views read under tasks/
    tasks = relbench_tasks.tasks_dir(path) if kind == "relbench" else None
    try:
        lock_down(raw.con, paths=sorted(set(raw.files.values())) if kind != "sqlite" else (),
                  directories=[tasks] if tasks is not None else (), memory_limit_mb=memory_limit_mb, threads=threads)
    except BaseException:
        raw.close()
        raise
    return raw
