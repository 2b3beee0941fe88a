"""Per-column work of preprocessing: the plan (global rows and columns), primary keys, the statistics pass and
the encoding pass. Every column is scanned on its own (`SELECT col FROM table`, streamed as Arrow batches), so
memory is bounded by the batch size, not the table width, and the text table's first-seen order is
(table, column, row) whatever the batch size.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from confluence.errors import DataError
from confluence.preprocess import encode as enc
from confluence.preprocess.embeddings import TextInterner, category_text
from confluence.preprocess.graph import KeyIndex
from confluence.preprocess.progress import Reporter
from confluence.preprocess.source import arrow_reader, quote
from confluence.preprocess.stats import (
    CHUNK,
    NUMBER_BOUNDS,
    TIME_BOUNDS,
    BoolStats,
    DistinctValues,
    MomentStats,
    z_scores,
)
from confluence.preprocess.tasks import CategoryBlock
from confluence.preprocess.writer import StoreWriter
from confluence.schema.metadata import ColumnMeta, DatabaseMeta, TableMeta
from confluence.store import format as fmt
from confluence.stypes import D_TIME, SemanticType


@dataclass
class ColumnPlan:
    """One non-ignored table column and what the passes learn about it."""

    table: str
    meta: ColumnMeta
    column_idx: int
    moments: MomentStats | None = None
    bools: BoolStats | None = None
    distinct: DistinctValues | None = None
    block: CategoryBlock | None = None
    null_count: int = 0
    text_distinct: int = 0
    parents: np.ndarray | None = None  # FK columns: global parent row per row, -1 = none
    dangling: int = 0
    nan: int = 0  # numerical / categorical: NaN and ±inf values, read as NULL (a data warning)
    inf: int = 0

    @property
    def stype(self) -> SemanticType:
        return self.meta.stype


@dataclass
class TablePlan:
    """One table: its rows are global rows `row_offset ..`; `keys` is set when it has a primary key."""

    meta: TableMeta
    index: int
    num_rows: int
    row_offset: int
    columns: list[ColumnPlan] = field(default_factory=list)
    keys: KeyIndex | None = None
    null_time_rows: int = 0
    relation: str = ""  # what the passes read: the table itself, or it plus key-only rows (`keyed_relations`)
    key_only_rows: int = 0  # rows added for foreign-key values that match no key (preprocess's dangling_keys)


def batch_rows_for(memory_limit_mb: int) -> int:
    """Rows per streamed batch: a multiple of the statistics chunk, about 1/16 of the budget at ~256 B/row."""
    rows = (int(memory_limit_mb) * 2**20 // 16 // 256) // CHUNK * CHUNK
    return int(min(max(rows, CHUNK), 16 * CHUNK))


def scan(con: duckdb.DuckDBPyConnection, table: str, column: str, batch_rows: int,
         relation: str = "") -> Iterator[tuple[int, pa.Array]]:
    """Stream one column in row order as (first local row, Arrow array) batches; every batch but the last
    holds a multiple of 8 rows (bit arrays are written per byte). `relation`: the SQL to read instead of the table
    (`TablePlan.relation`)."""
    row0 = 0
    carry: pa.Array | None = None
    for batch in _read(con, table, column, batch_rows, relation):
        arr = batch.column(0)
        if carry is not None:
            arr = pa.concat_arrays([carry, arr])
            carry = None
        whole = len(arr) // 8 * 8  # bit arrays are written per byte: batches start at multiples of 8
        if whole < len(arr):
            carry = arr.slice(whole)
            arr = arr.slice(0, whole)
        if len(arr):
            yield row0, arr
            row0 += len(arr)
    if carry is not None and len(carry):
        yield row0, carry


def _read(con: duckdb.DuckDBPyConnection, table: str, column: str, batch_rows: int,
          relation: str = "") -> Iterator[pa.RecordBatch]:
    """The raw record batches of one column; read failures become a DataError naming the column."""
    def fail(exc: Exception) -> DataError:
        return DataError(f"table '{table}', column '{column}': cannot read it: {str(exc).splitlines()[0]}")

    try:
        it = iter(arrow_reader(con, f"SELECT {quote(column)} FROM {relation or quote(table)}", batch_rows))
    except (duckdb.Error, pa.ArrowException) as exc:
        raise fail(exc) from None
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return
        except (duckdb.Error, pa.ArrowException) as exc:
            raise fail(exc) from None
        yield batch


def make_plan(db: DatabaseMeta, con: duckdb.DuckDBPyConnection, relations: dict[str, str] | None = None
              ) -> tuple[list[TablePlan], list[ColumnPlan]]:
    """Tables in metadata order with their row offsets; non-ignored columns with their global indices.
    `relations`: per table, the SQL the passes read instead of the table (`keyed_relations`)."""
    tables: list[TablePlan] = []
    columns: list[ColumnPlan] = []
    offset = 0
    for ti, t in enumerate(db.tables.values()):
        relation = (relations or {}).get(t.name, quote(t.name))
        n = int(con.execute(f"SELECT count(*) FROM {relation}").fetchall()[0][0])
        tp = TablePlan(meta=t, index=ti, num_rows=n, row_offset=offset, relation=relation)
        if relation != quote(t.name):
            tp.key_only_rows = n - int(con.execute(f"SELECT count(*) FROM {quote(t.name)}").fetchall()[0][0])
        for c in t.non_ignored():
            cp = ColumnPlan(table=t.name, meta=c, column_idx=len(columns))
            tp.columns.append(cp)
            columns.append(cp)
        tables.append(tp)
        offset += n
    return tables, columns


def load_primary_keys(con: duckdb.DuckDBPyConnection, tables: list[TablePlan], batch_rows: int,
                      rep: Reporter) -> None:
    """Read each table's primary-key column into its `KeyIndex` (checked non-null, finite, unique)."""
    rep.step("primary keys", sum(tp.num_rows for tp in tables if tp.meta.primary_key))
    for tp in tables:
        pk = tp.meta.primary_key
        if pk is None:
            continue
        parts = []
        for _row0, arr in scan(con, tp.meta.name, pk, batch_rows, tp.relation):
            parts.append(arr)
            rep.advance(len(arr))
        keys = pa.concat_arrays(parts) if parts else pa.array([], type=pa.int64())
        tp.keys = KeyIndex(tp.meta.name, pk, keys)


def statistics_pass(con: duckdb.DuckDBPyConnection, tables: list[TablePlan], columns: list[ColumnPlan],
                    batch_rows: int, rep: Reporter) -> tuple[MomentStats, list[str]]:
    """Moments of numerical and timestamp columns, sorted categories and their blocks.

    Returns the database-wide timestamp moments and the category texts in global categorical order.
    """
    by_name = {tp.meta.name: tp for tp in tables}
    stat_cols = [c for c in columns if c.stype in (SemanticType.NUMERICAL, SemanticType.TIMESTAMP,
                                                   SemanticType.CATEGORICAL)]
    rep.step("statistics", sum(by_name[c.table].num_rows for c in stat_cols))
    for c in stat_cols:
        name = c.meta.name
        if c.stype == SemanticType.CATEGORICAL:
            c.distinct = DistinctValues()
        else:
            c.moments = MomentStats(bounds=NUMBER_BOUNDS if c.stype == SemanticType.NUMERICAL else TIME_BOUNDS)
        for row0, arr in scan(con, c.table, name, batch_rows, by_name[c.table].relation):
            nan, inf = enc.non_finite_counts(arr)
            c.nan, c.inf = c.nan + nan, c.inf + inf
            if c.stype == SemanticType.NUMERICAL:
                c.moments.add(*enc.to_float(arr, c.table, name, row0))
            elif c.stype == SemanticType.TIMESTAMP:
                c.moments.add(*enc.to_epoch_us(arr, c.table, name, row0))
            else:
                c.distinct.add(enc.category_keys(arr))
            rep.advance(len(arr))
        if c.moments is not None:
            c.moments.finish()
    ts_all = MomentStats()
    for c in columns:
        if c.stype == SemanticType.TIMESTAMP:
            ts_all = ts_all.merged(c.moments)
    cat_texts: list[str] = []
    for c in columns:
        if c.stype == SemanticType.CATEGORICAL:
            c.block = CategoryBlock(values=c.distinct.sorted_values(), start=len(cat_texts))
            cat_texts.extend(category_text(c.meta.name, s) for s in c.block.strings)
    return ts_all, cat_texts


def column_stats(c: ColumnPlan) -> dict[str, Any]:
    """The per-stype statistics recorded in metadata.json (docs/reference/store.md)."""
    if c.stype in (SemanticType.NUMERICAL, SemanticType.TIMESTAMP):
        return c.moments.to_json()
    if c.stype == SemanticType.BOOLEAN:
        return c.bools.to_json()
    if c.stype == SemanticType.CATEGORICAL:
        return {"null_count": c.distinct.null_count, "categories": c.block.strings, "cat_emb_start": c.block.start,
                "k": len(c.block.values)}
    if c.stype == SemanticType.TEXT:
        return {"null_count": c.null_count, "distinct": c.text_distinct}
    return {"null_count": c.null_count}


def encode_column(con: duckdb.DuckDBPyConnection, writer: StoreWriter, tp: TablePlan, c: ColumnPlan,
                   tables: dict[str, TablePlan], texts: TextInterner, row_time: np.ndarray, ts_mean: float,
                   ts_std: float, batch_rows: int, rep: Reporter) -> None:
    """Stream one column into its values / validity files (and FK parents, row times, text table)."""
    n, t, name = tp.num_rows, tp.meta.name, c.meta.name
    valid_out = writer.array(fmt.valid_file(t, name), np.uint8, (fmt.num_bit_bytes(n),))
    stype = c.stype
    values_out: np.ndarray | None = None
    if stype == SemanticType.NUMERICAL:
        values_out = writer.array(fmt.values_file(t, name), np.float32, (n,))
    elif stype == SemanticType.TIMESTAMP:
        values_out = writer.array(fmt.values_file(t, name), np.float32, (n, D_TIME))
    elif stype == SemanticType.BOOLEAN:
        values_out = writer.array(fmt.values_file(t, name), np.uint8, (fmt.num_bit_bytes(n),))
        c.bools = BoolStats()
    elif stype in (SemanticType.CATEGORICAL, SemanticType.TEXT):
        values_out = writer.array(fmt.values_file(t, name), np.uint32, (n,))
    parent = tables[c.meta.fk_table] if c.meta.foreign_key else None
    if parent is not None:
        c.parents = np.full(n, -1, dtype=np.int64)
    is_time = name == tp.meta.temporal_column
    seen_texts = np.zeros(0, dtype=bool)  # text columns: which global texts occur in this column
    seen = 0
    for row0, arr in scan(con, t, name, batch_rows, tp.relation):
        stop = row0 + len(arr)
        if stype == SemanticType.NUMERICAL:
            x, valid = enc.to_float(arr, t, name, row0)
            values_out[row0:stop] = z_scores(x, valid, c.moments.mean, c.moments.std)
        elif stype == SemanticType.TIMESTAMP:
            us, valid = enc.to_epoch_us(arr, t, name, row0)
            block = enc.encode_timestamp(us, ts_mean, ts_std)
            block[~valid] = 0.0
            values_out[row0:stop] = block
            if is_time:
                row_time[tp.row_offset + row0:tp.row_offset + stop] = np.where(valid, us, fmt.NULL_TIME)
                tp.null_time_rows += int(len(valid) - np.count_nonzero(valid))
        elif stype == SemanticType.BOOLEAN:
            x, valid = enc.to_bool(arr, t, name, row0)
            c.bools.add(x, valid)
            values_out[row0 // 8:(stop + 7) // 8] = fmt.pack_bits(x)
        elif stype == SemanticType.CATEGORICAL:
            idx, valid = enc.encode_categorical(arr, c.block.values, c.block.start)
            values_out[row0:stop] = idx
        elif stype == SemanticType.TEXT:
            idx, valid = texts.intern(arr)
            values_out[row0:stop] = idx
            c.null_count += int(len(valid) - np.count_nonzero(valid))
            if len(seen_texts) < len(texts):
                seen_texts = np.concatenate([seen_texts, np.zeros(len(texts) - len(seen_texts), dtype=bool)])
            seen_texts[idx[valid]] = True
        else:  # identifier
            valid = enc.valid_mask(arr)
            c.null_count += int(len(valid) - np.count_nonzero(valid))
            if parent is not None:
                local = parent.keys.lookup(arr, f"table '{t}', column '{name}'")
                c.dangling += int(np.count_nonzero(valid & (local < 0)))
                c.parents[row0:stop] = np.where(local >= 0, local + parent.row_offset, -1)
        valid_out[row0 // 8:(stop + 7) // 8] = fmt.pack_bits(valid)
        seen = stop
        rep.advance(len(arr))
    if seen != n:
        raise DataError(f"table '{t}', column '{name}': read {seen} rows, the table has {n} (did the source change?)")
    if stype == SemanticType.TEXT:
        c.text_distinct = int(np.count_nonzero(seen_texts))
    writer.close(fmt.valid_file(t, name))
    if values_out is not None:
        writer.close(fmt.values_file(t, name))


def keyed_relations(db: DatabaseMeta, con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """Per table that foreign keys reference: the SQL of the table followed by one key-only row (every other column
    NULL) for each distinct foreign-key value that matches none of its keys, sorted by key. Such a value still says
    which rows share a parent (the flights of a plane missing from `planes`); as a row of its own it keeps them
    siblings instead of dropping their edges. The table's own rows keep their order and come first. Values that
    do not convert to the key's type stay dangling."""
    refs: dict[str, list[tuple[str, str]]] = {}
    for t in db.tables.values():
        for c in t.foreign_keys():
            if c.fk_column == db.tables[str(c.fk_table)].primary_key:
                refs.setdefault(str(c.fk_table), []).append((t.name, c.name))
    out = {}
    for name, children in refs.items():
        pk = db.tables[name].primary_key
        if pk is None:
            continue
        table, key = quote(name), quote(pk)
        key_type = con.execute(f"SELECT typeof({key}) FROM {table} LIMIT 1").fetchall()
        if not key_type:  # an empty table: its type from the schema
            key_type = con.execute(f"SELECT data_type FROM (DESCRIBE SELECT {key} FROM {table})").fetchall()
        kt = key_type[0][0]
        values = " UNION ".join(f"SELECT TRY_CAST({quote(col)} AS {kt}) AS k FROM {quote(child)}"
                                for child, col in children)
        out[name] = (f"(SELECT * FROM {table} UNION ALL BY NAME (SELECT DISTINCT k AS {key} FROM ({values}) "
                     f"WHERE k IS NOT NULL AND k NOT IN (SELECT {key} FROM {table}) ORDER BY k))")
    return out
