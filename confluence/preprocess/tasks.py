"""Task materialization: run each task's query in DuckDB, resolve anchors and observation times, encode targets.

A cell-masking task reuses its column's index, statistics and category block; a derived task's target gets its
own column index, statistics (z-score for numerical) and, when categorical, its own category block. Tuples are
sorted by (anchor_row, obs_time, target validity, target value) so the result does not depend on the order in
which DuckDB returns rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import duckdb
import numpy as np
import pyarrow as pa

from confluence.errors import DataError
from confluence.preprocess import encode as enc
from confluence.preprocess.graph import KeyIndex
from confluence.preprocess.source import arrow_table, quote
from confluence.preprocess.stats import (
    NUMBER_BOUNDS,
    TIME_BOUNDS,
    BoolStats,
    DistinctValues,
    MomentStats,
    z_scores,
)
from confluence.schema.metadata import DatabaseMeta, TaskMeta
from confluence.sources.sandbox import check_task_query, task_subquery
from confluence.store.format import NO_CUTOFF, pack_bits
from confluence.stypes import SemanticType

T = TypeVar("T")
_RESULT = "<task result>"  # the table label encoders see; `_named` turns it into the task's name


@dataclass
class CategoryBlock:
    """Sorted categories (as an Arrow array of the native type) and the block's first global index."""

    values: pa.Array
    start: int

    @property
    def strings(self) -> list[str]:
        return [enc.category_string(v) for v in self.values.to_pylist()]


@dataclass
class TaskResult:
    """Everything preprocessing writes for one task."""

    anchor_row: np.ndarray
    obs_time: np.ndarray
    target_values: np.ndarray
    target_valid: np.ndarray  # packed bits
    stats: dict[str, Any]
    target_stats: dict[str, Any]
    observation_time: str
    unmatched_anchor_keys: int
    new_block: CategoryBlock | None = None
    info: dict[str, Any] = field(default_factory=dict)


def run_query(con: duckdb.DuckDBPyConnection, task: TaskMeta) -> pa.Table:
    """The task's anchor key, target and observation time columns, as Arrow. The query must be one read-only SELECT
    of the database's tables (`check_task_query`: a MetadataError naming the task otherwise, and nothing runs)."""
    cols = [task.anchor_key, task.target_column]
    if task.observation_time_column:
        cols.append(task.observation_time_column)
    query = task.query.strip().rstrip(";")
    check_task_query(con, task.name, query)
    select = ", ".join(quote(c) for c in cols)
    try:
        return arrow_table(con, f"SELECT {select} FROM {task_subquery(query)} AS task_result")
    except duckdb.Error as exc:
        msg = str(exc).splitlines()[0]
        raise DataError(f"task '{task.name}': query failed or lacks the columns {cols}: {msg}") from None


def materialize(
    con: duckdb.DuckDBPyConnection,
    db: DatabaseMeta,
    task: TaskMeta,
    *,
    anchor_index: KeyIndex,
    anchor_offset: int,
    row_time: np.ndarray,
    ts_mean: float,
    ts_std: float,
    column_stats: dict[str, Any] | None,
    column_block: CategoryBlock | None,
    next_cat_index: int,
) -> TaskResult:
    """Run one task and encode its `(anchor_row, obs_time, target)` tuples."""
    result = run_query(con, task)
    table = result.combine_chunks()
    anchor_keys = table.column(0).combine_chunks()
    target = table.column(1).combine_chunks()
    where = f"task '{task.name}' anchor key '{task.anchor_key}'"
    local = anchor_index.lookup(anchor_keys, where)
    matched = local >= 0
    unmatched = int(len(local) - np.count_nonzero(matched))
    keep = np.flatnonzero(matched)
    anchor_row = local[keep] + anchor_offset
    anchor_meta = db.tables[task.anchor_table]
    if task.observation_time_column:
        obs_arr = table.column(2).combine_chunks()
        obs, obs_valid = _named(task, lambda: enc.to_epoch_us(obs_arr, _RESULT, task.observation_time_column, 0))
        obs, obs_valid = obs[keep], obs_valid[keep]
        if not obs_valid.all():
            row = int(keep[np.flatnonzero(~obs_valid)[0]])
            raise DataError(f"task '{task.name}', observation_time_column '{task.observation_time_column}',"
                            f" result row {row}: observation time is NULL")
        observation_time = "observation_time_column"
    elif anchor_meta.temporal_column:
        obs = row_time[anchor_row].copy()
        observation_time = "anchor_temporal_column"
    else:
        obs = np.full(len(anchor_row), NO_CUTOFF, dtype=np.int64)
        observation_time = "none"

    cell_masking = task.is_cell_masking(db)
    stype = task.target_stype
    new_block: CategoryBlock | None = None
    # 1) a sortable raw key per tuple (decoded over the whole result, so errors name result rows)
    if stype == SemanticType.NUMERICAL:
        raw, valid = _named(task, lambda: enc.to_float(target, _RESULT, task.target_column, 0))
    elif stype == SemanticType.TIMESTAMP:
        raw, valid = _named(task, lambda: enc.to_epoch_us(target, _RESULT, task.target_column, 0))
    elif stype == SemanticType.BOOLEAN:
        raw, valid = _named(task, lambda: enc.to_bool(target, _RESULT, task.target_column, 0))
    else:
        target = target.take(pa.array(keep))
        keys = enc.category_keys(target)
        if cell_masking:
            assert column_block is not None
            block = column_block
        else:
            dv = DistinctValues()
            dv.add(keys)
            block = new_block = CategoryBlock(values=dv.sorted_values(), start=next_cat_index)
        raw, valid = _named(task, lambda: enc.encode_categorical(keys, block.values, block.start))
        present = enc.valid_mask(keys)
        if (present & ~valid).any():
            row = int(keep[np.flatnonzero(present & ~valid)[0]])
            value = keys[int(np.flatnonzero(present & ~valid)[0])].as_py()
            raise DataError(f"task '{task.name}', result column '{task.target_column}', row {row}: target value"
                            f" {value!r} is not a category of column '{task.anchor_table}.{task.target_column}'")
    if stype != SemanticType.CATEGORICAL:
        raw, valid = raw[keep], valid[keep]
    # 2) deterministic order
    order = np.lexsort((raw, valid, obs, anchor_row))
    anchor_row, obs, raw, valid = anchor_row[order], obs[order], raw[order], valid[order]
    # 3) statistics and encoding
    if stype == SemanticType.NUMERICAL:
        ms = MomentStats(bounds=NUMBER_BOUNDS)
        ms.add(raw, valid)
        ms.finish()
        target_stats = ms.to_json()
        stats = column_stats if (cell_masking and column_stats) else target_stats
        values = z_scores(raw, valid, stats["mean"], stats["std"]).astype(np.float32)
    elif stype == SemanticType.TIMESTAMP:
        ms = MomentStats(bounds=TIME_BOUNDS)
        ms.add(raw, valid)
        ms.finish()
        target_stats = ms.to_json()
        stats = column_stats if (cell_masking and column_stats) else target_stats
        values = enc.encode_timestamp(raw, ts_mean, ts_std)
        values[~valid] = 0.0
    elif stype == SemanticType.BOOLEAN:
        bs = BoolStats()
        bs.add(raw, valid)
        target_stats = bs.to_json()
        stats = column_stats if (cell_masking and column_stats) else target_stats
        values = pack_bits(raw & valid)
    else:
        block = column_block if column_block is not None else new_block
        target_stats = {"null_count": int(len(valid) - np.count_nonzero(valid)), "categories": block.strings,
                        "cat_emb_start": block.start, "k": len(block.values)}
        stats = target_stats
        values = raw.astype(np.uint32)
    return TaskResult(
        anchor_row=anchor_row.astype(np.int64), obs_time=obs.astype(np.int64), target_values=values,
        target_valid=pack_bits(valid), stats=stats, target_stats=target_stats,
        observation_time=observation_time, unmatched_anchor_keys=unmatched, new_block=new_block,
    )


def _named(task: TaskMeta, fn: Callable[[], T]) -> T:
    """Run an encoder on the task's result; its errors name the task and the result column and row."""
    try:
        return fn()
    except DataError as exc:
        msg = str(exc).replace(f"table '{_RESULT}', column", f"task '{task.name}', result column")
        raise DataError(msg) from None
