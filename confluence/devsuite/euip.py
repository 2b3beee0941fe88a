"""The EU infringement procedures database (EUIP, Fjelstul): the Commission's infringement cases against member
states, 2002 to April 2020, and the decisions taken in them (letters of formal notice, reasoned opinions, referrals
to the Court of Justice, closings), with the member states and the Commission's departments.

Read from the R package's `.RData` files with pyreadr (which hands back pandas data frames; they are turned into
Arrow at once) and written with DuckDB, one thread, `ORDER BY` the key everywhere, so the bytes are the same on every
run. Changes to the source (docs/design/devsuite/euip.md):

- R stores whole numbers (years, counts, 0/1 dummies, ids) as doubles: such columns become INTEGER;
- cases get `opened_at`, the date of their first decision (the source has no opening date): their time;
- a derived `directives` table (one row per CELEX number the cases cite), so cases about one directive are linked.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from confluence.devsuite import write_table
from confluence.errors import DataError

# table -> (file of the source, name of the data frame in it); only these four files are read
FILES = {
    "cases": ("data/cases.RData", "cases"),
    "decisions": ("data/decisions.RData", "decisions"),
    "member_states": ("data-raw/member_states.RData", "member_states"),
    "departments": ("data-raw/departments.RData", "departments"),
}

SOURCE = {
    "repo": "jfjelstul/euip",
    "commit": "d30353acda5709d3c0ed4a8931a9772781406a76",
    # the files read: the mirror lacks another file of the commit (data-raw/infringements_raw.csv)
    "paths": tuple(file for file, _ in FILES.values()),
    "licence": "MIT + file LICENSE (DESCRIPTION: 'License: MIT + file LICENSE'; LICENSE: 'YEAR: 2021 / "
               "COPYRIGHT HOLDER: Joshua C. Fjelstul, Ph.D.')",
    "description": "EU infringement procedures 2002-2020: 21,183 cases, 50,960 Commission decisions, 28 member "
                   "states, 160 Commission departments (Fjelstul's EUIP R package)",
}
ROLE = "check"

_QUERIES = {
    "member_states": "SELECT * FROM member_states ORDER BY member_state_id",
    "departments": "SELECT * FROM departments ORDER BY department_id",
    "directives": (  # the source gives each CELEX number one directive number
        "SELECT celex, min(directive_number) AS directive_number,"
        " CAST(split_part(min(directive_number), '/', 1) AS INTEGER) AS directive_year"
        " FROM cases WHERE celex IS NOT NULL GROUP BY celex ORDER BY celex"
    ),
    "cases": (
        "SELECT c.*, o.opened_at FROM cases c"
        " JOIN (SELECT case_id, min(decision_date) AS opened_at FROM decisions GROUP BY case_id) o USING (case_id)"
        " ORDER BY c.case_id"
    ),
    "decisions": "SELECT * FROM decisions ORDER BY decision_id",
}


def _arrow(path: Path, frame: str) -> pa.Table:
    """One data frame of an .RData file as Arrow: doubles holding only whole numbers (R's years, counts and
    dummies) and 64-bit integers as int32, text as string, so the Parquet types do not depend on pandas' choices."""
    import pyreadr

    if not path.is_file():
        raise DataError(f"{path}: missing from the EUIP source (extract it from commit {SOURCE['commit']})")
    table = pa.Table.from_pandas(pyreadr.read_r(str(path))[frame], preserve_index=False).replace_schema_metadata()
    return pa.table(dict(zip(table.column_names, [_fixed_type(col) for col in table.columns], strict=True)))


def _fixed_type(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """A column of whole numbers as int32 and text as string; any other column as it is."""
    if pa.types.is_floating(col.type):
        values = pc.drop_null(col)
        if len(values) == 0 or pc.all(pc.equal(values, pc.floor(values))).as_py():
            return col.cast(pa.int32())
    elif pa.types.is_int64(col.type):
        return col.cast(pa.int32())
    elif pa.types.is_large_string(col.type):
        return col.cast(pa.string())
    return col


def build(source: Path, out: Path) -> Path:
    """Write cases, decisions, member_states, departments and directives as Parquet files into `out` from
    `source`, a checkout of the repository (at least the four files of `FILES`)."""
    source, out = Path(source), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(":memory:")
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.execute("SET threads = 1")  # one writer thread: identical bytes on every run
        for table, (file, frame) in FILES.items():
            con.register(table, _arrow(source / file, frame))
        for table, query in _QUERIES.items():
            write_table(con, query, out, table)
    except duckdb.Error as exc:
        raise DataError(f"{source}: building the EUIP database failed: {exc}") from None
    finally:
        con.close()
    return out
