"""`RawDatabase`: a raw relational database opened as one DuckDB connection with one view per table."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa

from confluence.errors import DataError

SOURCE_KINDS = ("parquet", "csv", "sqlite", "duckdb", "relbench")  # read from a file or a directory
SERVER_KINDS = ("postgresql",)  # read from a server named by a URL


def quote_ident(name: str) -> str:
    """Quote a SQL identifier for DuckDB (double quotes, embedded quotes doubled)."""
    return '"' + name.replace('"', '""') + '"'


def quote_literal(text: str) -> str:
    """Quote a SQL string literal for DuckDB (single quotes, embedded quotes doubled)."""
    return "'" + text.replace("'", "''") + "'"


@dataclass(frozen=True)
class TableHints:
    """Keys and time column recorded by the source itself (RelBench Parquet schema metadata, PostgreSQL's
    catalog)."""

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
    kind: str  # one of SOURCE_KINDS or SERVER_KINDS
    path: Path | str  # the file or directory read; for a server, its URL without the password (for messages)
    hints: dict[str, TableHints] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)  # table -> the file it was read from (for messages)
    # CSV tables: table -> (read_csv options, pinned column types), to re-read a file when locating a bad value
    csv_reads: dict[str, tuple[str, dict[str, str]]] = field(default_factory=dict)
    database: str | None = None  # a server database's name (files are named by their path)

    @property
    def name(self) -> str:
        """The database's name, the default name of a draft: a server database's name, else the file's stem."""
        return self.database or Path(self.path).stem

    def _check(self, table: str) -> None:
        if table not in self.tables:
            raise DataError(
                f"{self.path}: no table '{table}' in this {self.kind} source (tables: {', '.join(self.tables)})"
            )

    def _where(self, table: str) -> str:
        file = self.files.get(table)
        return f"table '{table}' ({file})" if file else f"table '{table}' of {self.path}"

    def _failure(self, table: str, what: str, exc: Exception) -> DataError:
        """A read error: for a CSV file, the file, line and problem; else DuckDB's first line."""
        from confluence.sources.csv_check import csv_problem, first_line

        if table in self.csv_reads and (msg := csv_problem(self.files[table], str(exc))) is not None:
            return DataError(f"{self._where(table)}: {what}: {msg}")
        return DataError(f"{self._where(table)}: {what}: {first_line(str(exc))}")

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
            raise self._failure(table, "cannot read its schema", exc) from None

    def num_rows(self, table: str) -> int:
        """Number of rows of a table."""
        self._check(table)
        try:
            return int(self.fetchall(f"SELECT count(*) FROM {quote_ident(table)}")[0][0])
        except duckdb.Error as exc:
            raise self._failure(table, "cannot count its rows", exc) from None

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
            raise self._failure(table, "cannot read its rows", exc) from None

    def first_unconvertible(self, table: str, column: str, sql_type: str = "DOUBLE") -> str | None:
        """Where the first non-NULL value of `column` that does not convert to `sql_type` is, with the value:
        "line 42 of <file> holds 'abc'" for a CSV table (the file's line, header included, counted from 1),
        "row 40 holds 'abc'" otherwise (counted from 0, in the source's order). None when every value converts."""
        self._check(table)
        if table in self.csv_reads:
            from confluence.sources.csv_check import csv_line_value

            options, types = self.csv_reads[table]
            typed = "{" + ", ".join(f"{quote_literal(n)}: {quote_literal(sql_type if n == column else t)}"
                                    for n, t in types.items()) + "}"
            try:
                self.fetchall(f"SELECT count({quote_ident(column)}) FROM read_csv({options}, columns={typed})")
            except duckdb.Error as exc:
                found = csv_line_value(str(exc))
                if found is not None:
                    return f"line {found[0]} of {self.files[table]} holds {found[1]!r}"
        c = quote_ident(column)
        rows = self.fetchall(
            f"SELECT n, v FROM (SELECT row_number() OVER () - 1 AS n, CAST({c} AS VARCHAR) AS v,"
            f" TRY_CAST({c} AS {sql_type}) AS x FROM {quote_ident(table)}) WHERE v IS NOT NULL AND x IS NULL"
            " ORDER BY n LIMIT 1"
        )
        return f"row {rows[0][0]} holds {rows[0][1]!r}" if rows else None

    def close(self) -> None:
        """Close the DuckDB connection."""
        self.con.close()

    def __enter__(self) -> RawDatabase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
