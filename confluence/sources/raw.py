"""`RawDatabase`: a raw relational database opened as one DuckDB connection with one view per table."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa

from confluence.errors import DataError

SOURCE_KINDS = ("parquet", "csv", "sqlite", "duckdb", "relbench")


def quote_ident(name: str) -> str:
    """Quote a SQL identifier for DuckDB (double quotes, embedded quotes doubled)."""
    return '"' + name.replace('"', '""') + '"'


def quote_literal(text: str) -> str:
    """Quote a SQL string literal for DuckDB (single quotes, embedded quotes doubled)."""
    return "'" + text.replace("'", "''") + "'"


@dataclass(frozen=True)
class TableHints:
    """Keys and time column recorded by the source itself (RelBench Parquet schema metadata)."""

    primary_key: str | None = None
    foreign_keys: dict[str, str] = field(default_factory=dict)  # column -> referenced table (its primary key)
    temporal_column: str | None = None


@dataclass
class RawDatabase:
    """A raw database: `con` has one view (or table) per raw table, named exactly as the table.

    Always quote table and column names in SQL (`quote_ident`): raw names may hold spaces, capitals or
    reserved words. The connection's time zone is UTC, so timezone-aware timestamps come back in UTC.
    """

    con: duckdb.DuckDBPyConnection
    tables: list[str]  # sorted
    kind: str  # one of SOURCE_KINDS
    path: Path
    hints: dict[str, TableHints] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)  # table -> the file it was read from (for messages)

    def _check(self, table: str) -> None:
        if table not in self.tables:
            raise DataError(
                f"{self.path}: no table '{table}' in this {self.kind} source (tables: {', '.join(self.tables)})"
            )

    def _where(self, table: str) -> str:
        file = self.files.get(table)
        return f"table '{table}' ({file})" if file else f"table '{table}' of {self.path}"

    def sql(self, query: str) -> duckdb.DuckDBPyRelation:
        """A relation for a query on a fresh cursor (safe while another result of `con` is being read)."""
        return self.con.cursor().sql(query)

    def fetchall(self, query: str, params: list | None = None) -> list[tuple]:
        """Run a query on a fresh cursor and return its rows."""
        return self.con.cursor().execute(query, params or []).fetchall()

    def schema(self, table: str) -> pa.Schema:
        """Arrow schema of a table as DuckDB reads it."""
        self._check(table)
        try:
            return self.sql(f"SELECT * FROM {quote_ident(table)} LIMIT 0").to_arrow_table().schema
        except duckdb.Error as exc:
            raise DataError(f"{self._where(table)}: cannot read its schema: {exc}") from None

    def num_rows(self, table: str) -> int:
        """Number of rows of a table."""
        self._check(table)
        try:
            return int(self.fetchall(f"SELECT count(*) FROM {quote_ident(table)}")[0][0])
        except duckdb.Error as exc:
            raise DataError(f"{self._where(table)}: cannot count its rows: {exc}") from None

    def scan(
        self, table: str, columns: list[str] | None = None, batch_rows: int = 1_000_000
    ) -> Iterator[pa.RecordBatch]:
        """Stream a table (or some of its columns) as Arrow record batches, in the source's row order."""
        self._check(table)
        if columns is not None and not columns:
            raise DataError(f"{self._where(table)}: scan() needs at least one column (or None for all)")
        if columns is not None:
            present = set(self.schema(table).names)
            missing = [c for c in columns if c not in present]
            if missing:
                raise DataError(f"{self._where(table)}: no column(s) {', '.join(map(repr, missing))}")
            cols = ", ".join(quote_ident(c) for c in columns)
        else:
            cols = "*"
        try:
            reader = self.sql(f"SELECT {cols} FROM {quote_ident(table)}").to_arrow_reader(batch_rows)
            yield from reader
        except (duckdb.Error, pa.ArrowException) as exc:
            raise DataError(f"{self._where(table)}: cannot read its rows: {exc}") from None

    def close(self) -> None:
        """Close the DuckDB connection."""
        self.con.close()

    def __enter__(self) -> RawDatabase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
