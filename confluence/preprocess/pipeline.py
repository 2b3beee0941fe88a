"""`preprocess`: raw database + metadata -> processed store (docs/architecture.md, spec/preprocessing.md).

Steps: validate; per table, load the primary key; per column, a statistics pass (numerical moments, timestamp
moments, sorted categories) and an encoding pass that streams Arrow batches into memory-mapped `.npy` files;
tasks; the FK graph; the three embedding tables; `metadata.json` last; atomic rename. Every column is scanned on
its own (`SELECT col FROM table`), so memory is bounded by the batch size, not the table width, and the text
table's first-seen order is (table, column, row) whatever the batch size.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

import confluence
from confluence.errors import ConfluenceError, DataError
from confluence.preprocess import encode as enc
from confluence.preprocess.embeddings import (
    TextInterner,
    category_text,
    column_text,
    embed_into,
    encoder_info,
)
from confluence.preprocess.graph import KeyIndex, build_graph, table_edges
from confluence.preprocess.progress import Reporter
from confluence.preprocess.source import arrow_reader, open_raw, quote
from confluence.preprocess.stats import CHUNK, BoolStats, DistinctValues, MomentStats
from confluence.preprocess.tasks import CategoryBlock, materialize
from confluence.preprocess.writer import StoreWriter
from confluence.schema.metadata import ColumnMeta, DatabaseMeta, TableMeta, load_metadata
from confluence.schema.validate import validate_against_data
from confluence.store import format as fmt
from confluence.stypes import D_TIME, SemanticType
from confluence.textenc.base import TextEncoder

DEFAULT_MEMORY_LIMIT_MB = 2048


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

    @property
    def stype(self) -> SemanticType:
        return self.meta.stype


@dataclass
class TablePlan:
    meta: TableMeta
    index: int
    num_rows: int
    row_offset: int
    columns: list[ColumnPlan] = field(default_factory=list)
    keys: KeyIndex | None = None
    null_time_rows: int = 0


def batch_rows_for(memory_limit_mb: int) -> int:
    """Rows per streamed batch: a multiple of the statistics chunk, about 1/16 of the budget at ~256 B/row."""
    rows = (int(memory_limit_mb) * 2**20 // 16 // 256) // CHUNK * CHUNK
    return int(min(max(rows, CHUNK), 16 * CHUNK))


def preprocess(
    source: Any,
    metadata: str | Path | DatabaseMeta,
    out: str | Path,
    *,
    encoder: TextEncoder | None = None,
    text_encoder: str | None = None,
    embedding_cache: Any = None,
    memory_limit_mb: int = DEFAULT_MEMORY_LIMIT_MB,
    threads: int | None = None,
    progress: bool = True,
    validate: bool = True,
) -> Path:
    """Preprocess `source` (a path or an opened raw database) with `metadata` into the store directory `out`.

    `encoder` (or the spec `text_encoder`, resolved by `confluence.textenc.registry.load_encoder`) embeds
    column names, categories and text. `validate=False` skips `validate_against_data` (for a database
    validated already); the passes still check what they read. Returns the store path, which appears
    atomically at the end.
    """
    db = metadata if isinstance(metadata, DatabaseMeta) else load_metadata(metadata)
    raw = open_raw(source)
    if validate:
        validate_against_data(db, raw)
    if encoder is None:
        encoder = _load_encoder(text_encoder)
    con = raw.con
    con.execute(f"SET memory_limit = '{max(int(memory_limit_mb) // 2, 64)}MB'")
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    con.execute("SET preserve_insertion_order = true")
    writer = StoreWriter(out)
    try:
        with Reporter(progress) as rep:
            meta = _run(db, con, writer, encoder, embedding_cache, batch_rows_for(memory_limit_mb), rep)
        return writer.commit(meta)
    except BaseException:
        writer.abort()
        raise


def _load_encoder(spec: str | None) -> TextEncoder:
    """The encoder named by `spec` via `confluence.textenc.registry`; the shipped static encoder by default."""
    try:
        registry = importlib.import_module("confluence.textenc.registry")
    except ModuleNotFoundError as exc:
        if exc.name != "confluence.textenc.registry":
            raise
        if spec not in (None, "default"):
            raise ConfluenceError(f"text encoder {spec!r}: confluence.textenc.registry is not installed") from None
        from confluence.textenc.default import StaticEncoder

        return StaticEncoder()
    return registry.load_encoder(spec)


def _scan(con: duckdb.DuckDBPyConnection, table: str, column: str, batch_rows: int) -> Iterator[tuple[int, pa.Array]]:
    """Stream one column in row order as (first local row, Arrow array) batches."""
    reader = arrow_reader(con, f"SELECT {quote(column)} FROM {quote(table)}", batch_rows)
    row0 = 0
    carry: pa.Array | None = None
    for batch in reader:
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


def _plan(db: DatabaseMeta, con: duckdb.DuckDBPyConnection) -> tuple[list[TablePlan], list[ColumnPlan]]:
    tables: list[TablePlan] = []
    columns: list[ColumnPlan] = []
    offset = 0
    for ti, t in enumerate(db.tables.values()):
        n = int(con.execute(f"SELECT count(*) FROM {quote(t.name)}").fetchall()[0][0])
        tp = TablePlan(meta=t, index=ti, num_rows=n, row_offset=offset)
        for c in t.non_ignored():
            cp = ColumnPlan(table=t.name, meta=c, column_idx=len(columns))
            tp.columns.append(cp)
            columns.append(cp)
        tables.append(tp)
        offset += n
    return tables, columns


def _run(db: DatabaseMeta, con: duckdb.DuckDBPyConnection, writer: StoreWriter, encoder: TextEncoder,
         cache: Any, batch_rows: int, rep: Reporter) -> dict[str, Any]:
    tables, columns = _plan(db, con)
    by_name = {tp.meta.name: tp for tp in tables}
    num_rows = sum(tp.num_rows for tp in tables)

    # 1) primary keys
    rep.step("primary keys", sum(tp.num_rows for tp in tables if tp.meta.primary_key))
    for tp in tables:
        pk = tp.meta.primary_key
        if pk is None:
            continue
        parts = []
        for _row0, arr in _scan(con, tp.meta.name, pk, batch_rows):
            parts.append(arr)
            rep.advance(len(arr))
        keys = pa.concat_arrays(parts) if parts else pa.array([], type=pa.int64())
        tp.keys = KeyIndex(tp.meta.name, pk, keys)

    # 2) statistics pass
    stat_cols = [c for c in columns if c.stype in (SemanticType.NUMERICAL, SemanticType.TIMESTAMP,
                                                   SemanticType.CATEGORICAL)]
    rep.step("statistics", sum(by_name[c.table].num_rows for c in stat_cols))
    for c in stat_cols:
        name = c.meta.name
        if c.stype == SemanticType.CATEGORICAL:
            c.distinct = DistinctValues()
        else:
            c.moments = MomentStats()
        for row0, arr in _scan(con, c.table, name, batch_rows):
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
    ts_mean, ts_std = float(ts_all.mean), float(ts_all.std)
    cat_texts: list[str] = []
    for c in columns:
        if c.stype == SemanticType.CATEGORICAL:
            c.block = CategoryBlock(values=c.distinct.sorted_values(), start=len(cat_texts))
            cat_texts.extend(category_text(c.meta.name, s) for s in c.block.strings)

    # 3) encoding pass
    texts = TextInterner()
    row_time = writer.array(fmt.ROW_TIME, np.int64, (num_rows,))
    for tp in tables:
        if tp.meta.temporal_column is None:
            row_time[tp.row_offset:tp.row_offset + tp.num_rows] = fmt.STATIC_TIME
    rep.step("encoding columns", sum(by_name[c.table].num_rows for c in columns))
    for c in columns:
        _encode_column(con, writer, by_name[c.table], c, by_name, texts, row_time, ts_mean, ts_std, batch_rows, rep)

    # 4) tasks
    derived_columns: list[dict[str, Any]] = []
    task_entries: list[dict[str, Any]] = []
    rep.step("tasks", len(db.tasks))
    col_by_key = {(c.table, c.meta.name): c for c in columns}
    for ki, task in enumerate(db.tasks.values()):
        anchor = by_name[task.anchor_table]
        cell = task.is_cell_masking(db)
        col = col_by_key.get((task.anchor_table, task.target_column)) if cell else None
        res = materialize(
            con, db, task, anchor_index=anchor.keys, anchor_offset=anchor.row_offset, row_time=row_time,
            ts_mean=ts_mean, ts_std=ts_std, column_stats=_column_stats(col) if col else None,
            column_block=col.block if col else None, next_cat_index=len(cat_texts),
        )
        if cell:
            target_idx = col.column_idx
        else:
            target_idx = len(columns) + len(derived_columns)
            text = column_text(task.target_column, task.name, task.description)
            derived_columns.append({"column_idx": target_idx, "table": None, "task": task.name,
                                    "name": task.target_column, "stype": task.target_stype.label,
                                    "text": text, "stats": res.stats})
        block = col.block if (cell and col.block) else res.new_block
        if res.new_block is not None:
            cat_texts.extend(category_text(task.target_column, s) for s in res.new_block.strings)
        n = len(res.anchor_row)
        writer.save(fmt.task_file(task.name, "anchor_row"), res.anchor_row)
        writer.save(fmt.task_file(task.name, "obs_time"), res.obs_time)
        writer.save(fmt.task_file(task.name, "target.valid"), res.target_valid)
        writer.save(fmt.task_file(task.name, "target.values"), res.target_values)
        anchor_cols = {cp.meta.name: cp.column_idx for cp in anchor.columns}
        task_entries.append({
            "name": task.name, "index": ki, "anchor_table": task.anchor_table,
            "target_stype": task.target_stype.label, "target_column_idx": target_idx, "is_derived": not cell,
            "exclude_column_idxs": sorted(anchor_cols[x] for x in task.exclude_columns if x in anchor_cols),
            "cat_block_start": block.start if block and task.target_stype == SemanticType.CATEGORICAL else 0,
            "cat_count": len(block.values) if block and task.target_stype == SemanticType.CATEGORICAL else 0,
            "num_seeds": n, "observation_time": res.observation_time, "stats": res.stats,
            "target_stats": res.target_stats, "unmatched_anchor_keys": res.unmatched_anchor_keys,
        })
        rep.advance(1)

    # 5) graph
    rep.step("foreign-key graph", 1)
    edges = [table_edges([c.parents for c in tp.columns if c.parents is not None],
                         [c.column_idx for c in tp.columns if c.parents is not None], tp.row_offset)
             for tp in tables]
    for tp in tables:
        for c in tp.columns:
            c.parents = None
    child = np.concatenate([e[0] for e in edges]) if edges else np.zeros(0, np.int64)
    parent = np.concatenate([e[1] for e in edges]) if edges else np.zeros(0, np.int64)
    column = np.concatenate([e[2] for e in edges]) if edges else np.zeros(0, np.int32)
    del edges
    graph = build_graph(num_rows, child, parent, column, np.asarray(row_time))
    del child, parent, column
    for rel, arr in ((fmt.PARENT_INDPTR, graph.parent_indptr), (fmt.PARENT_INDICES, graph.parent_indices),
                     (fmt.PARENT_COLUMN, graph.parent_column), (fmt.CHILD_INDPTR, graph.child_indptr),
                     (fmt.CHILD_INDICES, graph.child_indices), (fmt.CHILD_TIME, graph.child_time),
                     (fmt.CHILD_COLUMN, graph.child_column)):
        writer.save(rel, arr)
    num_edges = len(graph.parent_indices)
    del graph
    writer.close(fmt.ROW_TIME)
    rep.advance(1)

    # 6) embeddings
    d_t = int(encoder.dim)
    col_texts = [column_text(c.meta.name, c.table, c.meta.description) for c in columns]
    col_texts += [d["text"] for d in derived_columns]
    rep.step("embedding texts", len(col_texts) + len(cat_texts) + len(texts))
    for rel, strings in ((fmt.COLUMN_EMBEDDINGS, col_texts), (fmt.CATEGORY_EMBEDDINGS, cat_texts),
                         (fmt.TEXT_EMBEDDINGS, texts.texts)):
        out = writer.array(rel, np.float16, (len(strings), d_t))
        embed_into(encoder, strings, out, cache=cache, on_progress=rep.advance)
        writer.close(rel)

    # 7) metadata
    max_k = max([len(c.block.values) for c in columns if c.block is not None]
                + [t["cat_count"] for t in task_entries], default=0)
    column_entries = [
        {"column_idx": c.column_idx, "table": c.table, "task": None, "name": c.meta.name,
         "stype": c.stype.label, "text": col_texts[c.column_idx], "stats": _column_stats(c),
         "foreign_key": c.meta.foreign_key}
        for c in columns
    ] + derived_columns
    table_entries = [
        {"name": tp.meta.name, "index": tp.index, "num_rows": tp.num_rows, "row_offset": tp.row_offset,
         "primary_key": tp.meta.primary_key, "temporal_column": tp.meta.temporal_column,
         "null_time_rows": tp.null_time_rows,
         "columns": [{"name": c.meta.name, "stype": c.stype.label, "column_idx": c.column_idx,
                      "foreign_key": c.meta.foreign_key, "stats": _column_stats(c)} for c in tp.columns]}
        for tp in tables
    ]
    dangling = {f"{c.table}.{c.meta.name}": c.dangling for c in columns if c.meta.foreign_key}
    return {
        "format_version": fmt.FORMAT_VERSION,
        "confluence_version": confluence.__version__,
        "name": db.name,
        "d_t": d_t,
        "text_encoder": encoder_info(encoder),
        "num_rows": num_rows,
        "num_columns": len(column_entries),
        "num_categories": len(cat_texts),
        "num_texts": len(texts),
        "max_k": int(max_k),
        "timestamp_stats": {"count": ts_all.count, "mean": ts_mean, "std": ts_std},
        "tables": table_entries,
        "columns": column_entries,
        "graph": {"num_parent_edges": num_edges, "num_child_edges": num_edges, "dangling": dangling,
                  "num_dangling": int(sum(dangling.values()))},
        "tasks": task_entries,
        "database": db.to_json(),
    }


def _column_stats(c: ColumnPlan) -> dict[str, Any]:
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


def _encode_column(con: duckdb.DuckDBPyConnection, writer: StoreWriter, tp: TablePlan, c: ColumnPlan,
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
    for row0, arr in _scan(con, t, name, batch_rows):
        stop = row0 + len(arr)
        if stype == SemanticType.NUMERICAL:
            x, valid = enc.to_float(arr, t, name, row0)
            values_out[row0:stop] = np.where(valid, (x - c.moments.mean) / c.moments.std, 0.0)
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
