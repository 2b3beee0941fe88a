"""PostgreSQL source: a schema's tables read through ADBC's PostgreSQL driver (libpq, binary COPY to Arrow) and
copied batch by batch into in-memory DuckDB tables; primary and foreign keys read from the catalog become
`TableHints`.

Why a copy: DuckDB's `postgres_scanner` extension is not shipped in the wheel and cannot be downloaded here, so the
rows travel through ADBC. Each table is one `COPY ... TO STDOUT (FORMAT binary)` streamed as Arrow record batches of
about `batch_bytes`; DuckDB keeps the copy within its `memory_limit` and spills the rest to its temporary directory.
All tables are read in one read-only REPEATABLE READ transaction, so they come from one snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass

import adbc_driver_manager
import adbc_driver_postgresql.dbapi as pg_dbapi
import duckdb
import pyarrow as pa
from adbc_driver_postgresql import StatementOptions

from confluence.errors import DataError
from confluence.sources.pg_url import PostgresTarget, driver_message, parse_url
from confluence.sources.raw import RawDatabase, TableHints, quote_ident
from confluence.sources.sandbox import configure, lock_down

KIND = "postgresql"
DEFAULT_BATCH_BYTES = 16 << 20  # ADBC's default hint: about 16 MiB of rows per Arrow batch
DECIMAL_MAX_PRECISION = 38  # DuckDB's widest DECIMAL; wider or unconstrained NUMERIC becomes DOUBLE
# PostgreSQL types that ADBC maps to Arrow types DuckDB reads as the other sources do; the DuckDB type of the copy.
NATIVE_TYPES = {"bool": "BOOLEAN", "int2": "SMALLINT", "int4": "INTEGER", "int8": "BIGINT", "float4": "FLOAT",
                "float8": "DOUBLE", "text": "VARCHAR", "varchar": "VARCHAR", "bpchar": "VARCHAR", "date": "DATE",
                "timestamp": "TIMESTAMP", "timestamptz": "TIMESTAMPTZ", "bytea": "BLOB"}
_BATCH_VIEW = "__pg_batch"


@dataclass(frozen=True)
class _Column:
    name: str
    pg_type: str  # the declared type, as PostgreSQL writes it (for messages)
    select: str  # the expression PostgreSQL sends
    duck_type: str  # the DuckDB type of the copy
    cast: bool  # whether DuckDB converts the text PostgreSQL sends (NUMERIC)


def _column(name: str, declared: str, base: str, typmod: int) -> _Column:
    """How one column is read: ADBC's own Arrow type for the types the other sources also produce, NUMERIC as
    DECIMAL(p, s) (p <= 38) or DOUBLE, and anything else as PostgreSQL's text form of the value."""
    q = quote_ident(name)
    if base in NATIVE_TYPES:
        return _Column(name, declared, q, NATIVE_TYPES[base], False)
    if base == "numeric":
        # typmod = (precision << 16 | scale) + 4, the scale an 11-bit signed number since PostgreSQL 15
        precision, scale = ((typmod - 4) >> 16) & 0xFFFF, (((typmod - 4) & 0x7FF) ^ 0x400) - 0x400
        exact = typmod >= 4 and 1 <= precision <= DECIMAL_MAX_PRECISION and 0 <= scale <= precision
        return _Column(name, declared, f"{q}::text", f"DECIMAL({precision}, {scale})" if exact else "DOUBLE", True)
    return _Column(name, declared, f"{q}::text", "VARCHAR", False)


# Relations read: tables, partitioned tables (their partitions through them), views, materialized views, foreign
# tables.
_TABLES_SQL = """
SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'f') AND NOT c.relispartition
ORDER BY c.relname
"""

# Every column with its declared type and its base type (domains resolved to what they are built on).
_COLUMNS_SQL = """
WITH RECURSIVE cols AS (
  SELECT c.relname AS tbl, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod) AS declared,
         a.atttypid AS typ, a.atttypmod AS typmod
  FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
  WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'f') AND NOT c.relispartition
    AND a.attnum > 0 AND NOT a.attisdropped
), base AS (
  SELECT tbl, attnum, attname, declared, typ, typmod FROM cols
  UNION ALL
  SELECT b.tbl, b.attnum, b.attname, b.declared, t.typbasetype, t.typtypmod
  FROM base b JOIN pg_catalog.pg_type t ON t.oid = b.typ WHERE t.typtype = 'd'
)
SELECT b.tbl, b.attname, b.declared, t.typname::text, b.typmod
FROM base b JOIN pg_catalog.pg_type t ON t.oid = b.typ WHERE t.typtype <> 'd'
ORDER BY b.tbl, b.attnum
"""

# Primary and foreign keys, one row per constraint column in key order.
_KEYS_SQL = """
SELECT c.relname, con.conname, con.contype::text, k.ord, a.attname, rc.relname, rn.nspname, ra.attname
FROM pg_catalog.pg_constraint con
JOIN pg_catalog.pg_class c ON c.oid = con.conrelid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN LATERAL unnest(con.conkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_catalog.pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.attnum
LEFT JOIN pg_catalog.pg_class rc ON rc.oid = con.confrelid
LEFT JOIN pg_catalog.pg_namespace rn ON rn.oid = rc.relnamespace
LEFT JOIN pg_catalog.pg_attribute ra ON ra.attrelid = con.confrelid AND ra.attnum = con.confkey[k.ord]
WHERE n.nspname = $1 AND con.contype IN ('p', 'f')
ORDER BY c.relname, con.contype DESC, con.conname, k.ord
"""


def _keys(rows: list[tuple], schema: str) -> tuple[dict[str, list[str]], dict[str, dict[str, str]]]:
    """(primary-key columns per table, {column: referenced table} per table) from the catalog's constraints.

    Only single-column foreign keys that reference the single-column primary key of a table of the same schema
    become hints (the draft resolves a hint to the referenced table's primary key); composite keys do not.
    """
    pks: dict[str, list[str]] = {}
    fks: dict[str, dict[str, list[tuple]]] = {}
    for table, conname, contype, _, col, ref_table, ref_schema, ref_col in rows:
        if contype == "p":
            pks.setdefault(table, []).append(col)
        else:
            fks.setdefault(table, {}).setdefault(conname, []).append((col, ref_table, ref_schema, ref_col))
    hints: dict[str, dict[str, str]] = {}
    for table, constraints in fks.items():
        for _, cols in sorted(constraints.items()):
            if len(cols) != 1:
                continue
            col, ref_table, ref_schema, ref_col = cols[0]
            if ref_schema == schema and pks.get(ref_table) == [ref_col]:
                hints.setdefault(table, {}).setdefault(col, ref_table)
    return pks, {t: dict(sorted(h.items())) for t, h in hints.items()}


class _Reader:
    """One ADBC connection in a read-only REPEATABLE READ transaction, copying tables into a DuckDB connection."""

    def __init__(self, target: PostgresTarget, batch_bytes: int):
        self.target, self.batch_bytes = target, batch_bytes
        try:
            self.conn = pg_dbapi.connect(target.libpq_url)
        except adbc_driver_manager.Error as exc:
            raise DataError(f"{target.display}: cannot connect: {driver_message(exc, target)}") from None
        try:
            self.rows("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        except DataError:
            self.conn.close()
            raise

    def rows(self, sql: str, params: tuple = ()) -> list[tuple]:
        """Run a catalog query and return its rows."""
        cur = self.conn.cursor()
        try:
            cur.execute(sql, params or None)
            return cur.fetchall() if cur.description else []
        except adbc_driver_manager.Error as exc:
            raise DataError(f"{self.target.display}: {driver_message(exc, self.target)}") from None
        finally:
            cur.close()

    def copy(self, con: duckdb.DuckDBPyConnection, table: str, columns: list[_Column], order: list[str]) -> int:
        """Copy one table into a new DuckDB table of the same name, one Arrow batch at a time; returns the number
        of batches. Rows come in primary-key order (PostgreSQL keeps no row order of its own)."""
        t = quote_ident(table)
        con.execute(f"CREATE TABLE {t} (" + ", ".join(f"{quote_ident(c.name)} {c.duck_type}" for c in columns) + ")")
        select = (f"SELECT {', '.join(c.select for c in columns)} FROM {quote_ident(self.target.schema)}.{t}"
                  + (f" ORDER BY {', '.join(quote_ident(c) for c in order)}" if order else ""))
        insert = f"INSERT INTO {t} SELECT " + ", ".join(
            f"CAST({quote_ident(c.name)} AS {c.duck_type})" if c.cast else quote_ident(c.name) for c in columns
        ) + f" FROM {_BATCH_VIEW}"
        cur = self.conn.cursor()
        batches = 0
        try:
            cur.adbc_statement.set_options(**{StatementOptions.BATCH_SIZE_HINT_BYTES.value: str(self.batch_bytes)})
            cur.execute(select)
            for batch in cur.fetch_record_batch():
                con.register(_BATCH_VIEW, pa.Table.from_batches([batch]))
                try:
                    con.execute(insert)
                finally:
                    con.unregister(_BATCH_VIEW)
                batches += 1
        except adbc_driver_manager.Error as exc:
            raise DataError(f"{self.target.display}: table '{table}': cannot read its rows:"
                            f" {driver_message(exc, self.target)}") from None
        except duckdb.ConversionException as exc:
            raise DataError(self._conversion_problem(table, columns, exc)) from None
        finally:
            cur.close()
        return batches

    def _conversion_problem(self, table: str, columns: list[_Column], exc: duckdb.Error) -> str:
        """Name the NUMERIC column whose value does not fit its DECIMAL (NaN or ±Infinity) and that value."""
        qt = f"{quote_ident(self.target.schema)}.{quote_ident(table)}"
        for c in columns:
            if c.cast and c.duck_type.startswith("DECIMAL"):
                q = quote_ident(c.name)
                bad = self.rows(f"SELECT {q}::text FROM {qt} WHERE {q}::text IN ('NaN', 'Infinity', '-Infinity')"
                                " LIMIT 1")
                if bad:
                    return (f"{self.target.display}: column '{table}.{c.name}' ({c.pg_type}) holds {bad[0][0]},"
                            f" which {c.duck_type} cannot hold; declare the column plain numeric (read as DOUBLE,"
                            " NaN as NULL) or make those values NULL")
        return f"{self.target.display}: table '{table}': cannot convert its rows ({str(exc).splitlines()[0]})"

    def close(self) -> None:
        """End the transaction (nothing was written) and close the connection."""
        try:
            self.conn.rollback()
        except adbc_driver_manager.Error:
            pass
        self.conn.close()


def open_postgres(url: str, *, batch_bytes: int = DEFAULT_BATCH_BYTES,
                  memory_limit_mb: int | None = None, threads: int | None = None) -> RawDatabase:
    """Open a PostgreSQL schema as a `RawDatabase`: every table, view, materialized view and foreign table of the
    schema copied into an in-memory DuckDB table (streamed in Arrow batches of about `batch_bytes`; DuckDB spills
    beyond `memory_limit_mb` to its temporary directory, using `threads` when given), with single-column primary
    and foreign keys from the catalog as hints. The DuckDB connection is then locked (`sandbox.lock_down`: no file
    access at all, no setting changes); nothing of the user's but the URL reaches the server (the schema name is a
    bound parameter or a quoted identifier).

    Credentials come from the URL or libpq's environment (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, ...);
    messages show the URL without its password. Raises `DataError` when the server cannot be reached or refuses
    the login, the schema does not exist or holds no tables, or a table cannot be read.
    """
    from confluence.sources.readers import new_connection

    target = parse_url(url)
    reader = _Reader(target, batch_bytes)
    con = new_connection()
    try:
        configure(con, memory_limit_mb=memory_limit_mb, threads=threads)
        database = reader.rows("SELECT current_database()")[0][0]
        where = f"database '{database}' of {target.display}"
        if not reader.rows("SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1", (target.schema,)):
            found = [r[0] for r in reader.rows(
                "SELECT nspname FROM pg_catalog.pg_namespace WHERE nspname NOT LIKE 'pg\\_%'"
                " AND nspname <> 'information_schema' ORDER BY nspname")]
            raise DataError(f"{where}: no schema '{target.schema}' (schemas: {', '.join(found) or 'none'})")
        tables = sorted(r[0] for r in reader.rows(_TABLES_SQL, (target.schema,)))
        if not tables:
            raise DataError(f"{where}: schema '{target.schema}' has no tables")
        _check_names(tables, f"{where}, schema '{target.schema}'")
        columns: dict[str, list[_Column]] = {t: [] for t in tables}
        for table, name, declared, base, typmod in reader.rows(_COLUMNS_SQL, (target.schema,)):
            columns[table].append(_column(name, declared, base, int(typmod)))
        pks, fks = _keys(reader.rows(_KEYS_SQL, (target.schema,)), target.schema)
        for table in tables:
            try:
                reader.copy(con, table, columns[table], pks.get(table, []))
            except duckdb.Error as exc:
                raise DataError(f"{target.display}: table '{table}': cannot copy it into DuckDB"
                                f" ({str(exc).splitlines()[0]})") from None
        lock_down(con)  # the copy is in memory: the connection reads no file at all
    except BaseException:
        con.close()
        raise
    finally:
        reader.close()
    hints = {t: TableHints(primary_key=pks[t][0] if len(pks.get(t, [])) == 1 else None,
                           foreign_keys=fks.get(t, {}))
             for t in tables if len(pks.get(t, [])) == 1 or fks.get(t)}
    return RawDatabase(con=con, tables=tables, kind=KIND, path=target.display, hints=hints, database=database)


def _check_names(tables: list[str], where: str) -> None:
    """DuckDB names are case-insensitive: two tables whose names differ only in case cannot both be copied."""
    seen: dict[str, str] = {}
    for t in tables:
        if t.lower() in seen:
            raise DataError(f"{where}: tables '{seen[t.lower()]}' and '{t}' differ only in case, which DuckDB"
                            " cannot tell apart; read a schema without one of them")
        seen[t.lower()] = t
