"""unvotes: every recorded roll-call vote of the UN General Assembly, 1946-2020 (the R package unvotes).

The package's three data frames (`data/*.rda`, read with pyreadr) become four tables:

- `countries`: derived, one row per voting country, with a surrogate `country_id` (ordered by name), so that
  votes have a parent to link to (the package repeats the name and ISO code on every vote);
- `roll_calls`: one row per roll call (`rcid`), known from the morning of its `date`. The UN library's catalogue
  suffix ": resolution / adopted by the General Assembly" is cut from `short` and `descr`: it was written after the
  vote and states its outcome;
- `votes`: one row per country and roll call, with a surrogate `vote_id` (ordered by rcid, country) and
  `recorded_at`, the end of the roll call's day (23:59:59): a vote is public once the day's voting is over, so a
  question asked on the morning of the vote sees the roll call but none of that day's votes;
- `roll_call_issues`: the issue codes of a roll call, with its `date` copied in (known with the roll call).

Everything is rebuilt with DuckDB SQL (`ORDER BY` everywhere, one thread), so the same source gives the same bytes.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa

from confluence.devsuite import write_table
from confluence.errors import DataError

SOURCE = {
    "repo": "dgrtwo/unvotes",
    "commit": "7eb7034314ff79c49c9e0785fcd9d216fa04cf14",
    "paths": ("data/un_votes.rda", "data/un_roll_calls.rda", "data/un_roll_call_issues.rda"),
    "licence": (
        "package: 'License: MIT + file LICENSE' (LICENSE: 'YEAR: 2016 / COPYRIGHT HOLDER: David Robinson'); "
        "data: Erik Voeten, 'United Nations General Assembly Voting Data', Harvard Dataverse hdl:1902.1/12379, "
        "'the data files are dedicated to the public domain under the CC0 license' (data-raw/README.md)"
    ),
    "description": "UN General Assembly roll-call votes 1946-2020: 870,109 votes of 200 countries on 6,203 roll calls",
}
ROLE = "check"

# each table and the order of its rows (countries first: votes are joined to it)
TABLES = {"countries": "country_id", "roll_calls": "rcid", "votes": "vote_id", "roll_call_issues": "rcid, short_name"}

# the catalogue suffix that states the outcome (": resolution / adopted by the General Assembly"), also cut short
# ("... adopted by the Gen"), misspelt ("resolultion") or without "resolution /"; only after a colon, so that
# "decisions adopted by the General Assembly at its 10th special session" stays
_ADOPTED_SUFFIX = r"\s*:\s*(resol\w*\s*/\s*)?adopted by.*$"


def _clean_text(column: str) -> str:
    """SQL: `column` without the outcome suffix, trimmed, NULL when nothing is left."""
    return f"nullif(trim(regexp_replace({column}, '{_ADOPTED_SUFFIX}', '', 'is')), '')"


_QUERIES = {
    "countries": (
        "SELECT CAST(row_number() OVER (ORDER BY country) AS INTEGER) AS country_id, country, country_code"
        " FROM (SELECT country, any_value(country_code) AS country_code FROM un_votes GROUP BY country)"
        " ORDER BY country_id"
    ),
    "roll_calls": (
        "SELECT CAST(rcid AS INTEGER) AS rcid, CAST(session AS INTEGER) AS session,"
        " CAST(importantvote AS BOOLEAN) AS importantvote, CAST(date AS DATE) AS date, unres,"
        " CAST(amend AS BOOLEAN) AS amend, CAST(para AS BOOLEAN) AS para,"
        f" {_clean_text('short')} AS short, {_clean_text('descr')} AS descr"
        " FROM un_roll_calls ORDER BY rcid"
    ),
    "votes": (
        "SELECT CAST(row_number() OVER (ORDER BY v.rcid, v.country) AS INTEGER) AS vote_id,"
        " CAST(v.rcid AS INTEGER) AS rcid, c.country_id, CAST(v.vote AS VARCHAR) AS vote,"
        " CAST(r.date AS TIMESTAMP) + INTERVAL 1 DAY - INTERVAL 1 SECOND AS recorded_at"
        " FROM un_votes v JOIN countries c USING (country) JOIN un_roll_calls r ON r.rcid = v.rcid"
        " ORDER BY vote_id"
    ),
    "roll_call_issues": (
        "SELECT CAST(i.rcid AS INTEGER) AS rcid, i.short_name, CAST(i.issue AS VARCHAR) AS issue,"
        " CAST(r.date AS DATE) AS date"
        " FROM un_roll_call_issues i JOIN un_roll_calls r ON r.rcid = i.rcid ORDER BY i.rcid, i.short_name"
    ),
}


def _read_rda(path: Path) -> pa.Table:
    """The one data frame of an .rda file, as Arrow (pyreadr reads R's format into pandas; nothing else uses it)."""
    import pyreadr  # optional: only the development suite needs it

    if not path.is_file():
        raise DataError(f"{path}: missing (a checkout of {SOURCE['repo']} at {SOURCE['commit'][:8]} holds it)")
    frames = pyreadr.read_r(str(path))
    if len(frames) != 1:
        raise DataError(f"{path}: expected one data frame, found {sorted(frames)}")
    return pa.Table.from_pandas(next(iter(frames.values())), preserve_index=False).replace_schema_metadata(None)


def build(source: Path, out: Path) -> Path:
    """Write the four tables of `source` (a checkout of the package: its `data/` folder) as Parquet into `out`."""
    source, out = Path(source), Path(out)
    frames = {name: _read_rda(source / "data" / f"{name}.rda")
              for name in ("un_votes", "un_roll_calls", "un_roll_call_issues")}
    out.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(":memory:")
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.execute("SET threads = 1")  # one writer thread: identical bytes on every run
        for name, table in frames.items():
            con.register(name, table)
        for table, order in TABLES.items():
            con.execute(f"CREATE TABLE {table} AS {_QUERIES[table]}")
            write_table(con, f"SELECT * FROM {table} ORDER BY {order}", out, table)
    except duckdb.Error as exc:
        raise DataError(f"{source}: building unvotes failed: {exc}") from None
    finally:
        con.close()
    return out
