"""Sakila, the DVD-rental sample database (jOOQ/sakila, PostgreSQL port), as one Parquet file per table.

The source is a `pg_dump`-style pair: `postgres-sakila-schema.sql` (CREATE TABLE statements: the column types) and
`postgres-sakila-insert-data-using-copy.sql` (one `COPY ... FROM stdin` block of tab-separated text per table). Each
block is parsed in Python, typed with DuckDB casts from the schema's types, sorted by its key columns and written
single-threaded, so the same source gives the same bytes.

Changes to the source (docs/design/devsuite/sakila.md):
- `film.special_features` (a PostgreSQL text[]) becomes one string, "Trailers, Behind the Scenes";
- `character(n)` values lose their blank padding (language names);
- a derived table `rental_return` (rental_id, returned_at): a return is a later event than its rental, so it gets
  a row of its own with its own time instead of being visible on the rental row from the moment of renting;
- `payment.settled_at`: when the payment's amount is final. Sakila records a payment at the rental's time, but its
  amount includes the late fee, which depends on the return: settled_at is the later of payment_date and the
  rental's return_date.
"""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pyarrow as pa

from confluence.devsuite import write_table
from confluence.errors import DataError

SOURCE = {
    "repo": "jOOQ/sakila",
    "commit": "e089a5b1ec9af0df7a9c6a5d47d49fa1736a4e84",
    "paths": [
        "postgres-sakila-db/postgres-sakila-schema.sql",
        "postgres-sakila-db/postgres-sakila-insert-data-using-copy.sql",
    ],
    "licence": (
        "BSD 2-Clause License, 'Copyright (c) 2021, jOOQ Object Oriented Querying' (the repository's LICENSE); its "
        "README: 'License: BSD / Copyright DB Software Laboratory' (the port). The original, by Mike Hillyer "
        "(MySQL AB): 'The contents of the sakila-schema.sql and sakila-data.sql files are licensed under the New BSD "
        "license.' (https://dev.mysql.com/doc/sakila/en/sakila-license.html)"
    ),
    "description": "A DVD rental chain: 16,044 rentals and 16,049 payments of 599 customers, May-August 2005, "
                   "over 4,581 copies of 1,000 films with actors and categories, two stores.",
}
ROLE = "tune"

_DIR = "postgres-sakila-db"
_SCHEMA = "postgres-sakila-schema.sql"
_DATA = "postgres-sakila-insert-data-using-copy.sql"

# PostgreSQL type (without its length) -> the DuckDB expression typing the text value {c} ({n}: the length)
_CASTS = {
    "integer": "CAST({c} AS INTEGER)",
    "smallint": "CAST({c} AS SMALLINT)",
    "year": "CAST({c} AS INTEGER)",  # a domain over integer
    "boolean": "CAST({c} AS BOOLEAN)",  # 't' / 'f'
    "date": "CAST({c} AS DATE)",
    "timestamp without time zone": "CAST({c} AS TIMESTAMP)",
    "numeric": "CAST({c} AS DECIMAL{n})",  # prices: numeric(4,2), numeric(5,2)
    "character varying": "{c}",
    "text": "{c}",
    "character": "rtrim({c})",  # blank-padded
    "mpaa_rating": "{c}",  # an enum of five ratings
    "tsvector": "{c}",
    "text[]": "replace(regexp_replace({c}, '[{}\"]', '', 'g'), ',', ', ')",  # {a,"b c"} -> 'a, b c'
    "bytea": "from_hex(substr({c}, 3))",  # '\\x0a1b...'
}

# the columns each table's rows are sorted by (its primary or composite key)
_ORDER = {"film_actor": "actor_id, film_id", "film_category": "film_id, category_id"}

_DERIVED = {
    "rental_return": (
        "SELECT rental_id, return_date AS returned_at FROM rental WHERE return_date IS NOT NULL ORDER BY rental_id"
    ),
    "payment": (
        "SELECT p.*, greatest(p.payment_date, r.return_date) AS settled_at"
        " FROM payment p LEFT JOIN rental r ON r.rental_id = p.rental_id ORDER BY p.payment_id"
    ),
}


def schema_types(sql: str) -> dict[str, dict[str, str]]:
    """{table: {column: PostgreSQL type}} from the CREATE TABLE statements of the schema dump."""
    tables: dict[str, dict[str, str]] = {}
    for name, body in re.findall(r"^CREATE TABLE (\w+) \((.*?)^\)", sql, re.M | re.S):
        cols = {}
        for line in body.strip().splitlines():
            m = re.match(r"\s*(\w+) ((?:character varying|timestamp without time zone|[\w\[\]]+)(?:\(\d+(?:,\d+)?\))?)",
                         line)
            if m and m.group(1) != "CONSTRAINT":
                cols[m.group(1)] = m.group(2)
        tables[name] = cols
    return tables


def _unescape(field: str) -> str:
    """A COPY text field's backslash escapes (\\t, \\n, \\\\, octal, hex) decoded."""
    simple = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}

    def one(m: re.Match) -> str:
        s = m.group(1)
        if s[0] == "x" and len(s) > 1:
            return chr(int(s[1:], 16))
        if s[0] in "01234567":
            return chr(int(s, 8))
        return simple.get(s, s)

    return re.sub(r"\\(x[0-9a-fA-F]{1,2}|[0-7]{1,3}|.)", one, field)


def copy_blocks(sql: str) -> dict[str, pa.Table]:
    """{table: all-string Arrow table} from the dump's `COPY public.t (cols) FROM stdin;` blocks (NULL for \\N)."""
    out = {}
    for name, cols, body in re.findall(r"^COPY public\.(\w+) \(([^)]*)\) FROM stdin;\n(.*?)^\\\.$", sql, re.M | re.S):
        names = [c.strip() for c in cols.split(",")]
        rows = [line.split("\t") for line in body.splitlines()]
        if any(len(r) != len(names) for r in rows):
            raise DataError(f"COPY block of {name}: a line without {len(names)} tab-separated fields")
        out[name] = pa.table({c: pa.array([None if r[i] == r"\N" else _unescape(r[i]) if "\\" in r[i] else r[i]
                                           for r in rows], pa.string()) for i, c in enumerate(names)})
    return out


def build(source: Path, out: Path) -> Path:
    """Write the Sakila tables (and the derived `rental_return`) as Parquet files into `out` from a checkout of
    jOOQ/sakila; returns `out`."""
    base = Path(source) / _DIR
    for name in (_SCHEMA, _DATA):
        if not (base / name).is_file():
            raise DataError(f"{base / name}: missing (a checkout of {SOURCE['repo']} at {SOURCE['commit'][:8]}?)")
    types = schema_types((base / _SCHEMA).read_text(encoding="utf-8"))
    blocks = copy_blocks((base / _DATA).read_text(encoding="utf-8"))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(":memory:")
    try:
        con.execute("SET threads = 1")  # one writer thread: identical bytes on every run
        for table, data in blocks.items():
            exprs = []
            for col in data.column_names:
                pg = types.get(table, {}).get(col, "")
                kind, length = re.fullmatch(r"(.*?)(\(.*\))?", pg).groups()
                if kind not in _CASTS:
                    raise DataError(f"{table}.{col}: type {pg!r} in the schema dump is not handled")
                cast = _CASTS[kind].replace("{c}", f'"{col}"').replace("{n}", length or "")
                exprs.append(f'{cast} AS "{col}"')
            con.register("raw", data)
            con.execute(f"CREATE TABLE {table} AS SELECT {', '.join(exprs)} FROM raw"
                        f" ORDER BY {_ORDER.get(table, data.column_names[0])}")
            con.unregister("raw")
        queries = {t: f"SELECT * FROM {t} ORDER BY {_ORDER.get(t, blocks[t].column_names[0])}" for t in blocks}
        queries.update(_DERIVED)
        for table, query in sorted(queries.items()):
            write_table(con, query, out, table)
    except duckdb.Error as exc:
        raise DataError(f"{base}: building sakila failed: {exc}") from None
    finally:
        con.close()
    return out
