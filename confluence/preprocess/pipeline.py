"""`preprocess`: raw database + metadata -> processed store (docs/design/architecture.md, spec/preprocessing.md).

Steps: validate; primary keys; statistics pass; encoding pass (`columns.py`); tasks (`tasks.py`); the FK graph
(`graph.py`); the three embedding tables (`embeddings.py`); `metadata.json` last; atomic rename (`writer.py`).
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

import confluence
from confluence.errors import ConfigError, MetadataError
from confluence.preprocess.columns import (
    ColumnPlan,
    TablePlan,
    batch_rows_for,
    column_stats,
    encode_column,
    keyed_relations,
    load_primary_keys,
    make_plan,
    statistics_pass,
)
from confluence.preprocess.embeddings import (
    TextInterner,
    category_text,
    column_text,
    embed_into,
    encoder_info,
)
from confluence.preprocess.graph import build_graph, table_edges
from confluence.preprocess.links import materialize_link
from confluence.preprocess.progress import Reporter
from confluence.preprocess.source import open_raw
from confluence.preprocess.stats import MomentStats
from confluence.preprocess.tasks import materialize
from confluence.preprocess.writer import StoreWriter
from confluence.schema.metadata import DatabaseMeta, load_metadata
from confluence.schema.validate import check_against_data
from confluence.sources import data_warnings as dw
from confluence.sources.sandbox import configure, is_locked
from confluence.store import format as fmt
from confluence.store.format import COUNT_WINDOWS_DAYS
from confluence.stypes import SemanticType
from confluence.textenc.base import TextEncoder
from confluence.textenc.registry import load_encoder

DEFAULT_MEMORY_LIMIT_MB = 2048
# what becomes of a foreign-key value that matches no key of its table: "drop" (its edge is dropped, the value
# lost) or "keep" (a key-only row of that table stands for it, so the rows sharing it stay siblings)
DANGLING_KEYS = ("drop", "keep")
__all__ = ["DANGLING_KEYS", "DEFAULT_MEMORY_LIMIT_MB", "batch_rows_for", "check_dangling_keys", "preprocess"]


def check_dangling_keys(value: str) -> None:
    """A ConfigError unless `value` is one of `DANGLING_KEYS`."""
    if value not in DANGLING_KEYS:
        raise ConfigError("dangling_keys", f"must be one of {', '.join(DANGLING_KEYS)}, got {value!r}")


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
    strict: bool = False,
    dangling_keys: str = "drop",
) -> Path:
    """Preprocess `source` (a path or an opened raw database) with `metadata` into the store directory `out`.

    `encoder` (or the spec `text_encoder`, resolved by `confluence.textenc.registry.load_encoder`) embeds
    column names, categories and text. `validate=False` skips `validate_against_data` (for a database
    validated already); the passes still check what they read. Returns the store path, which appears
    atomically at the end.

    Data warnings (NaN / ±inf read as NULL, foreign-key values that match no key, empty tables; found by the
    validation and by the passes, each once) are issued with `warnings.warn` at the end
    (`confluence.sources.data_warnings.DataWarning`). With `strict=True` they are errors instead: a
    `StrictDataError` (or the validation's `MetadataError`) listing them, and no store is written.

    `dangling_keys` (`DANGLING_KEYS`): "keep" adds to each referenced table one key-only row (its other columns
    NULL, always visible) per distinct foreign-key value matching none of its keys, after its own rows, instead of
    dropping those edges; tasks still read the tables as they are (docs/design/preprocessing.md).

    A source opened here gets DuckDB's share of `memory_limit_mb` and `threads` before its connection is locked
    (`confluence.sources.sandbox.lock_down`); an opened source keeps the settings it was opened with
    (`open_source(path, memory_limit_mb=..., threads=...)`) unless its connection is not locked.
    """
    check_dangling_keys(dangling_keys)
    db = metadata if isinstance(metadata, DatabaseMeta) else load_metadata(metadata)
    duckdb_mb = max(int(memory_limit_mb) // 2, 64)  # DuckDB's share of the budget (the rest: Arrow batches)
    raw = open_raw(source, duckdb_mb, threads)
    found = dw.WarningList()
    try:
        if validate:
            problems, warns = check_against_data(db, raw, keep_dangling=dangling_keys == "keep")
            found.extend(warns)
            if problems:
                if strict:
                    problems += [f"{w} (a warning; strict mode makes it an error)" for w in found.items]
                raise MetadataError(problems)
            found.check_strict(strict)
        if encoder is None:
            encoder = load_encoder(text_encoder)
        con = raw.con
        if not is_locked(con):  # a source opened here, or by open_source, has these settings and is locked
            configure(con, memory_limit_mb=duckdb_mb, threads=threads)
        writer = StoreWriter(out)
        try:
            with Reporter(progress) as rep:
                relations = keyed_relations(db, con) if dangling_keys == "keep" else None
                meta = _run(db, con, writer, encoder, embedding_cache, batch_rows_for(memory_limit_mb), rep,
                            found, relations, warn_key_only=not validate)
            found.check_strict(strict)
            return writer.commit(meta)
        except BaseException:
            writer.abort()
            raise
    finally:
        if raw is not source:  # opened here: close it
            raw.close()
        if not strict:
            found.emit()


def write_primary_keys(writer: StoreWriter, tables: list) -> None:
    """Keep each table's primary-key values (row order) so predictions can name their anchors and users can name
    anchors by key. Integer keys are int64; anything else is stored as fixed-width unicode text."""
    for tp in tables:
        if tp.keys is None:
            continue
        keys = tp.keys.keys
        if pa.types.is_integer(keys.type):
            arr = np.asarray(keys.to_numpy(zero_copy_only=False), dtype=np.int64)
        else:
            arr = np.asarray(keys.cast(pa.string()).to_pylist(), dtype=np.str_)
        writer.save(fmt.keys_file(tp.meta.name), arr)


def _run(db: DatabaseMeta, con: duckdb.DuckDBPyConnection, writer: StoreWriter, encoder: TextEncoder,
         cache: Any, batch_rows: int, rep: Reporter, found: dw.WarningList,
         relations: dict[str, str] | None = None, warn_key_only: bool = False) -> dict[str, Any]:
    """The passes over the data; `warn_key_only`: say per table how many key-only rows were added (without
    validation nothing else names the dangling keys kept)."""
    tables, columns = make_plan(db, con, relations)
    by_name = {tp.meta.name: tp for tp in tables}
    num_rows = sum(tp.num_rows for tp in tables)
    found.extend([dw.empty_table(tp.meta.name) for tp in tables if tp.num_rows == 0])
    load_primary_keys(con, tables, batch_rows, rep)
    write_primary_keys(writer, tables)
    ts_all, cat_texts = statistics_pass(con, tables, columns, batch_rows, rep)
    ts_mean, ts_std = float(ts_all.mean), float(ts_all.std)
    found.extend([dw.non_finite(c.table, c.meta.name, c.nan, c.inf, by_name[c.table].num_rows)
                  for c in columns if c.nan or c.inf])
    found.extend([dw.outliers(c.table, c.meta.name, c.moments.outliers, by_name[c.table].num_rows,
                              c.stype == SemanticType.TIMESTAMP)
                  for c in columns if c.moments is not None and c.moments.outliers])

    texts = TextInterner()
    row_time = writer.array(fmt.ROW_TIME, np.int64, (num_rows,))
    for tp in tables:
        if tp.meta.temporal_column is None:
            row_time[tp.row_offset:tp.row_offset + tp.num_rows] = fmt.STATIC_TIME
    rep.step("encoding columns", sum(by_name[c.table].num_rows for c in columns))
    for c in columns:
        encode_column(con, writer, by_name[c.table], c, by_name, texts, row_time, ts_mean, ts_std, batch_rows, rep)
    for tp in tables:  # key-only rows carry no time: visible at any time (only a visible child leads to one)
        if tp.key_only_rows and tp.meta.temporal_column is not None:
            end = tp.row_offset + tp.num_rows
            row_time[end - tp.key_only_rows:end] = fmt.STATIC_TIME
            tp.null_time_rows -= tp.key_only_rows
    if warn_key_only:
        found.extend([dw.key_only_rows(tp.meta.name, tp.key_only_rows) for tp in tables if tp.key_only_rows])
    found.extend([dw.dangling_foreign_key(c.table, c.meta.name, c.dangling,
                                          by_name[c.table].num_rows - c.null_count, str(c.meta.foreign_key))
                  for c in columns if c.dangling])

    task_entries, derived_columns = _tasks(db, con, writer, tables, columns, row_time, ts_mean, ts_std,
                                           cat_texts, rep)
    temporal = {tp.meta.name for tp in tables if tp.meta.temporal_column is not None}
    derived_columns += child_count_columns(columns, len(columns) + len(derived_columns), temporal)
    derived_columns += child_mean_columns(columns, len(columns) + len(derived_columns), temporal)
    derived_columns += child_latest_columns(columns, len(columns) + len(derived_columns), temporal)
    # link tasks' columns last: adding a link task changes no other column's index (nor any cell task's batches)
    link_entries, link_columns = _link_tasks(db, con, writer, by_name, rep, len(columns) + len(derived_columns))
    derived_columns += link_columns
    num_edges = _graph(writer, tables, num_rows, np.asarray(row_time), rep)
    writer.close(fmt.ROW_TIME)

    col_texts = [column_text(c.meta.name, c.table, c.meta.description) for c in columns]
    col_texts += [d["text"] for d in derived_columns]
    _embeddings(writer, encoder, cache, col_texts, cat_texts, texts, rep)
    meta = _metadata(db, encoder, tables, columns, derived_columns, task_entries, col_texts, cat_texts, texts,
                     ts_all, num_edges)
    if link_entries:  # after "tasks": a store without link tasks is byte-for-byte what it was before they existed
        meta = {**{k: v for k, v in meta.items() if k != "database"}, "link_tasks": link_entries,
                "database": meta["database"]}
    return meta


OBS_COLUMN_NAME = "observation time"
OBS_COLUMN_DESCRIPTION = "the moment the prediction is made; only rows up to it are visible"


def _tasks(db: DatabaseMeta, con: duckdb.DuckDBPyConnection, writer: StoreWriter, tables: list[TablePlan],
           columns: list[ColumnPlan], row_time: np.ndarray, ts_mean: float, ts_std: float, cat_texts: list[str],
           rep: Reporter) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Materialize every task; derived targets get column indices after the table columns and their category
    blocks are appended to `cat_texts`. Returns (task entries, derived column entries) for metadata.json."""
    by_name = {tp.meta.name: tp for tp in tables}
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
            ts_mean=ts_mean, ts_std=ts_std, column_stats=column_stats(col) if col else None,
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
        writer.save(fmt.task_file(task.name, "anchor_row"), res.anchor_row)
        writer.save(fmt.task_file(task.name, "obs_time"), res.obs_time)
        writer.save(fmt.task_file(task.name, "target.valid"), res.target_valid)
        writer.save(fmt.task_file(task.name, "target.values"), res.target_values)
        anchor_cols = {cp.meta.name: cp.column_idx for cp in anchor.columns}
        categorical = block is not None and task.target_stype == SemanticType.CATEGORICAL
        task_entries.append({
            "name": task.name, "index": ki, "anchor_table": task.anchor_table,
            "target_stype": task.target_stype.label, "target_column_idx": target_idx, "is_derived": not cell,
            "exclude_column_idxs": sorted(anchor_cols[x] for x in task.exclude_columns if x in anchor_cols),
            "cat_block_start": block.start if categorical else 0,
            "cat_count": len(block.values) if categorical else 0,
            "num_seeds": len(res.anchor_row), "observation_time": res.observation_time, "stats": res.stats,
            "target_stats": res.target_stats, "unmatched_anchor_keys": res.unmatched_anchor_keys,
        })
        rep.advance(1)
    # A task whose observation time comes from its own column (typically a derived task on a static anchor, such
    # as "this plane's flights in the 30 days after t") shows that time as a timestamp cell of the anchor row:
    # without it the model could not tell "now" from the context alone. Indices follow the target columns.
    for entry in task_entries:
        entry["obs_column_idx"] = -1
        if entry["observation_time"] == "observation_time_column":
            entry["obs_column_idx"] = len(columns) + len(derived_columns)
            derived_columns.append({
                "column_idx": entry["obs_column_idx"], "table": None, "task": entry["name"],
                "name": OBS_COLUMN_NAME, "stype": SemanticType.TIMESTAMP.label,
                "text": column_text(OBS_COLUMN_NAME, entry["name"], OBS_COLUMN_DESCRIPTION), "stats": {},
            })
    return task_entries, derived_columns


def _link_tasks(db: DatabaseMeta, con: duckdb.DuckDBPyConnection, writer: StoreWriter,
                by_name: dict[str, TablePlan], rep: Reporter, first_idx: int
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Materialize every link task (`preprocess.links`): its seeds and, per seed, the target rows. Each gets two
    derived columns from `first_idx` on: the anchor row's question cell ("links to <target table>", what the model's
    link head reads) and its observation-time cell. Returns (metadata.json entries, derived column entries)."""
    entries: list[dict[str, Any]] = []
    columns: list[dict[str, Any]] = []
    if not db.link_tasks:
        return entries, columns
    rep.step("link tasks", len(db.link_tasks))
    for task in db.link_tasks.values():
        anchor, target = by_name[task.anchor_table], by_name[task.target_table]
        res = materialize_link(con, task, anchor_index=anchor.keys, anchor_offset=anchor.row_offset,
                               target_index=target.keys, target_offset=target.row_offset)
        for name, arr in (("anchor_row", res.anchor_row), ("obs_time", res.obs_time),
                          ("link.offsets", res.offsets), ("link.targets", res.targets)):
            writer.save(fmt.task_file(task.name, name), arr)
        target_idx, obs_idx = first_idx + len(columns), first_idx + len(columns) + 1
        name = f"links to {task.target_table}"
        columns += [
            {"column_idx": target_idx, "table": None, "task": task.name, "name": name,
             "stype": SemanticType.BOOLEAN.label, "text": column_text(name, task.name, task.description), "stats": {}},
            {"column_idx": obs_idx, "table": None, "task": task.name, "name": OBS_COLUMN_NAME,
             "stype": SemanticType.TIMESTAMP.label,
             "text": column_text(OBS_COLUMN_NAME, task.name, OBS_COLUMN_DESCRIPTION), "stats": {}},
        ]
        entries.append({"name": task.name, "anchor_table": task.anchor_table, "target_table": task.target_table,
                        "horizon_us": task.horizon_us, "k": task.k, "split": task.split.to_json(),
                        "num_seeds": len(res.anchor_row), "num_links": len(res.targets),
                        "query_rows": res.query_rows, "duplicate_links": res.duplicates,
                        "target_column_idx": target_idx, "obs_column_idx": obs_idx})
        rep.advance(1)
    return entries, columns


def child_count_columns(columns: list[ColumnPlan], first_idx: int, temporal: Collection[str] = ()
                        ) -> list[dict[str, Any]]:
    """One numerical "child count" column per foreign-key column: how many rows of the child table point at a
    parent row through it (up to the observation time); then, for each foreign key of a `temporal` child table,
    one per window of `COUNT_WINDOWS_DAYS`: how many did in the last w days. The sampler shows them as cells of
    the parent row when `SamplerConfig.child_counts` is on (the windows it names in `child_count_windows`;
    docs/design/sampler.md); the store only names them and embeds their text. The windowed columns come after every
    all-time one, so a store's all-time count columns keep the indices they had before windows existed."""
    out: list[dict[str, Any]] = []

    def add(c: ColumnPlan, span: str, extra: dict[str, Any]) -> None:
        parent_table = str(c.meta.fk_table)
        name = f"number of {c.table} rows by {c.meta.name}{span}"
        desc = f"how many rows of {c.table} reference this {parent_table} row through {c.table}.{c.meta.name}"
        if span:
            desc += f" with a time{span} before the observation time"
        out.append({"column_idx": first_idx + len(out), "table": None, "task": None, "name": name,
                    "stype": SemanticType.NUMERICAL.label, "text": column_text(name, parent_table, desc), "stats": {},
                    "count_of": {"parent_table": parent_table, "child_table": c.table, "column": c.meta.name,
                                 "column_idx": c.column_idx, **extra}})

    fks = [c for c in columns if c.meta.foreign_key]
    for c in fks:
        add(c, "", {"windows": list(COUNT_WINDOWS_DAYS) if c.table in temporal else []})
    for c in (c for c in fks if c.table in temporal):
        for w in COUNT_WINDOWS_DAYS:
            add(c, " in the last day" if w == 1 else f" in the last {w} days", {"window_days": w})
    return out


def child_latest_columns(columns: list[ColumnPlan], first_idx: int, temporal: Collection[str] = ()
                         ) -> list[dict[str, Any]]:
    """One numerical "days since the latest child" column per foreign key of a `temporal` child table: how long
    before the observation time a row of the child table last referenced the parent row through the key (a
    customer's days since their last order, a team's since its last match). A count column (`count_of` with
    `"latest": true`): the sampler computes the value beside the counts (`SamplerConfig.child_latest`,
    docs/design/sampler.md); the store only names the columns and embeds their text."""
    out: list[dict[str, Any]] = []
    for c in columns:
        if not c.meta.foreign_key or c.table not in temporal:
            continue
        parent_table = str(c.meta.fk_table)
        name = f"days since the latest {c.table} row by {c.meta.name}"
        desc = (f"how many days before the observation time a row of {c.table} last referenced this {parent_table} "
                f"row through {c.table}.{c.meta.name}")
        out.append({"column_idx": first_idx + len(out), "table": None, "task": None, "name": name,
                    "stype": SemanticType.NUMERICAL.label, "text": column_text(name, parent_table, desc), "stats": {},
                    "count_of": {"parent_table": parent_table, "child_table": c.table, "column": c.meta.name,
                                 "column_idx": c.column_idx, "latest": True}})
    return out


def child_mean_columns(columns: list[ColumnPlan], first_idx: int, temporal: Collection[str] = ()
                       ) -> list[dict[str, Any]]:
    """One numerical "children's mean" column per (foreign key of a `temporal` child table, numerical or boolean
    column of that table): the mean of that column over the latest rows of the child table that reference a parent
    row through the key, before the observation time (a team's recent goals, a courier's recent handling times, a
    scorer's share of penalties). The sampler computes the value (`SamplerConfig.child_means`,
    docs/design/sampler.md); the store only names the columns and embeds their text."""
    out: list[dict[str, Any]] = []
    by_table: dict[str, list[ColumnPlan]] = {}
    for c in columns:
        by_table.setdefault(c.table, []).append(c)
    for c in columns:
        if not c.meta.foreign_key or c.table not in temporal:
            continue
        parent_table = str(c.meta.fk_table)
        for v in by_table[c.table]:
            if v.stype not in fmt.MEAN_VALUE_STYPES or v.meta.foreign_key:
                continue
            name = f"mean {v.meta.name} of the latest {c.table} rows by {c.meta.name}"
            desc = (f"the mean of {c.table}.{v.meta.name} over the latest rows of {c.table} that reference this "
                    f"{parent_table} row through {c.table}.{c.meta.name}, before the observation time")
            out.append({"column_idx": first_idx + len(out), "table": None, "task": None, "name": name,
                        "stype": SemanticType.NUMERICAL.label, "text": column_text(name, parent_table, desc),
                        "stats": {},
                        "mean_of": {"parent_table": parent_table, "child_table": c.table, "column": c.meta.name,
                                    "column_idx": c.column_idx, "value_column": v.meta.name,
                                    "value_column_idx": v.column_idx}})
    return out


def _graph(writer: StoreWriter, tables: list[TablePlan], num_rows: int, row_time: np.ndarray,
           rep: Reporter) -> int:
    """Build and write both CSR directions from the resolved FK columns; returns the number of edges."""
    rep.step("foreign-key graph", 1)
    edges = []
    for tp in tables:
        fks = [c for c in tp.columns if c.parents is not None]
        edges.append(table_edges([c.parents for c in fks], [c.column_idx for c in fks], tp.row_offset))
        for c in fks:
            c.parents = None
    child = np.concatenate([e[0] for e in edges]) if edges else np.zeros(0, np.int64)
    parent = np.concatenate([e[1] for e in edges]) if edges else np.zeros(0, np.int64)
    column = np.concatenate([e[2] for e in edges]) if edges else np.zeros(0, np.int32)
    del edges
    graph = build_graph(num_rows, child, parent, column, row_time)
    del child, parent, column
    for rel, arr in ((fmt.PARENT_INDPTR, graph.parent_indptr), (fmt.PARENT_INDICES, graph.parent_indices),
                     (fmt.PARENT_COLUMN, graph.parent_column), (fmt.CHILD_INDPTR, graph.child_indptr),
                     (fmt.CHILD_INDICES, graph.child_indices), (fmt.CHILD_TIME, graph.child_time),
                     (fmt.CHILD_COLUMN, graph.child_column)):
        writer.save(rel, arr)
    rep.advance(1)
    return len(graph.parent_indices)


def _embeddings(writer: StoreWriter, encoder: TextEncoder, cache: Any, col_texts: list[str],
                cat_texts: list[str], texts: TextInterner, rep: Reporter) -> None:
    """Embed column names, categories and text cells into the three f16 tables."""
    rep.step("embedding texts", len(col_texts) + len(cat_texts) + len(texts))
    for rel, strings in ((fmt.COLUMN_EMBEDDINGS, col_texts), (fmt.CATEGORY_EMBEDDINGS, cat_texts),
                         (fmt.TEXT_EMBEDDINGS, texts.texts)):
        out = writer.array(rel, np.float16, (len(strings), int(encoder.dim)))
        embed_into(encoder, strings, out, cache=cache, on_progress=rep.advance)
        writer.close(rel)


def _metadata(db: DatabaseMeta, encoder: TextEncoder, tables: list[TablePlan], columns: list[ColumnPlan],
              derived_columns: list[dict[str, Any]], task_entries: list[dict[str, Any]], col_texts: list[str],
              cat_texts: list[str], texts: TextInterner, ts_all: MomentStats, num_edges: int) -> dict[str, Any]:
    """The content of metadata.json, keys in the order of docs/reference/store.md (`files` is added on commit)."""
    max_k = max([len(c.block.values) for c in columns if c.block is not None]
                + [t["cat_count"] for t in task_entries], default=0)
    column_entries = [
        {"column_idx": c.column_idx, "table": c.table, "task": None, "name": c.meta.name,
         "stype": c.stype.label, "text": col_texts[c.column_idx], "stats": column_stats(c),
         "foreign_key": c.meta.foreign_key}
        for c in columns
    ] + derived_columns
    table_entries = [
        {"name": tp.meta.name, "index": tp.index, "num_rows": tp.num_rows, "row_offset": tp.row_offset,
         "primary_key": tp.meta.primary_key, "temporal_column": tp.meta.temporal_column,
         "null_time_rows": tp.null_time_rows, "key_only_rows": tp.key_only_rows,
         "key_type": str(tp.keys.keys.type) if tp.keys is not None else None,
         "columns": [{"name": c.meta.name, "stype": c.stype.label, "column_idx": c.column_idx,
                      "foreign_key": c.meta.foreign_key, "stats": column_stats(c)} for c in tp.columns]}
        for tp in tables
    ]
    dangling = {f"{c.table}.{c.meta.name}": c.dangling for c in columns if c.meta.foreign_key}
    return {
        "format_version": fmt.FORMAT_VERSION,
        "confluence_version": confluence.__version__,
        "name": db.name,
        "d_t": int(encoder.dim),
        "text_encoder": encoder_info(encoder),
        "num_rows": sum(tp.num_rows for tp in tables),
        "num_columns": len(column_entries),
        "num_categories": len(cat_texts),
        "num_texts": len(texts),
        "max_k": int(max_k),
        "timestamp_stats": {"count": ts_all.count, "mean": float(ts_all.mean), "std": float(ts_all.std)},
        "tables": table_entries,
        "columns": column_entries,
        "graph": {"num_parent_edges": num_edges, "num_child_edges": num_edges, "dangling": dangling,
                  "num_dangling": int(sum(dangling.values())),
                  "num_key_only_rows": int(sum(tp.key_only_rows for tp in tables))},
        "tasks": task_entries,
        "database": db.to_json(),
    }
