"""Link-task materialization: run a link task's query, map its anchor and target keys to store rows, and group the
links by seed (anchor row, observation time) into a compressed list of target rows.

A link task's seeds are the distinct (anchor row, observation time) pairs of its query; the target rows of one seed
are its answer, a set (a link named twice counts once). Seeds are sorted by (anchor row, observation time) and each
seed's target rows ascending, so the result does not depend on the order DuckDB returns rows in.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import numpy as np
import pyarrow as pa

from confluence.errors import DataError
from confluence.preprocess import encode as enc
from confluence.preprocess.graph import KeyIndex
from confluence.preprocess.source import arrow_table, quote
from confluence.schema.metadata import LinkTaskMeta
from confluence.sources.sandbox import check_task_query, task_subquery

_RESULT = "<link task result>"


@dataclass
class LinkResult:
    """What preprocessing writes for one link task: seeds (anchor_row, obs_time) and, per seed, the target rows
    `targets[offsets[i]:offsets[i + 1]]` (global store rows of the target table)."""

    anchor_row: np.ndarray  # int64 [n]
    obs_time: np.ndarray  # int64 [n], epoch microseconds
    offsets: np.ndarray  # int64 [n + 1]
    targets: np.ndarray  # int64 [m]
    query_rows: int  # rows the query returned
    duplicates: int  # rows naming a link already named for the same seed


def link_query(con: duckdb.DuckDBPyConnection, task: LinkTaskMeta) -> pa.Table:
    """The link task's anchor key, observation time and target key columns, as Arrow. The query must be one
    read-only SELECT of the database's tables (`check_task_query`: nothing runs otherwise)."""
    query = task.query.strip().rstrip(";")
    check_task_query(con, task.name, query)
    cols = (task.anchor_key, task.observation_time_column, task.target_key)
    select = ", ".join(quote(c) for c in cols)
    try:
        return arrow_table(con, f"SELECT {select} FROM {task_subquery(query)} AS task_result")
    except duckdb.Error as exc:
        raise DataError(f"link task '{task.name}': query failed or lacks the columns {list(cols)}: "
                        f"{str(exc).splitlines()[0]}") from None


def materialize_link(con: duckdb.DuckDBPyConnection, task: LinkTaskMeta, *, anchor_index: KeyIndex,
                     anchor_offset: int, target_index: KeyIndex, target_offset: int) -> LinkResult:
    """Run one link task and group its links by seed. A key that matches no row, or a NULL observation time, is a
    DataError naming the task, column and result row (validation reports them all first)."""
    table = link_query(con, task).combine_chunks()
    anchor_local = anchor_index.lookup(table.column(0).combine_chunks(), f"link task '{task.name}' anchor_key")
    target_local = target_index.lookup(table.column(2).combine_chunks(), f"link task '{task.name}' target_key")
    for local, field, key in ((anchor_local, "anchor_key", task.anchor_key),
                              (target_local, "target_key", task.target_key)):
        if (local < 0).any():
            row = int(np.flatnonzero(local < 0)[0])
            value = table.column(0 if field == "anchor_key" else 2)[row].as_py()
            raise DataError(f"link task '{task.name}', result column '{key}', row {row}: {field} {value!r} matches"
                            f" no row of '{task.anchor_table if field == 'anchor_key' else task.target_table}'")
    try:
        obs, valid = enc.to_epoch_us(table.column(1).combine_chunks(), _RESULT, task.observation_time_column, 0)
    except DataError as exc:
        raise DataError(str(exc).replace(f"table '{_RESULT}', column", f"link task '{task.name}', result column")
                        ) from None
    if not valid.all():
        row = int(np.flatnonzero(~valid)[0])
        raise DataError(f"link task '{task.name}', observation_time_column '{task.observation_time_column}', "
                        f"result row {row}: observation time is NULL")
    anchor_row = anchor_local.astype(np.int64) + anchor_offset
    target_row = target_local.astype(np.int64) + target_offset
    return group_links(anchor_row, obs.astype(np.int64), target_row)


def group_links(anchor_row: np.ndarray, obs_time: np.ndarray, target_row: np.ndarray) -> LinkResult:
    """Links (one per element) -> seeds sorted by (anchor row, time), each with its distinct target rows
    ascending."""
    n = len(anchor_row)
    order = np.lexsort((target_row, obs_time, anchor_row))
    a, t, g = anchor_row[order], obs_time[order], target_row[order]
    same_link = np.zeros(n, dtype=bool)
    if n:
        same_link[1:] = (a[1:] == a[:-1]) & (t[1:] == t[:-1]) & (g[1:] == g[:-1])
    a, t, g = a[~same_link], t[~same_link], g[~same_link]
    new_seed = np.ones(len(a), dtype=bool)
    if len(a):
        new_seed[1:] = (a[1:] != a[:-1]) | (t[1:] != t[:-1])
    starts = np.flatnonzero(new_seed)
    offsets = np.append(starts, len(a)).astype(np.int64)
    return LinkResult(anchor_row=a[starts].astype(np.int64), obs_time=t[starts].astype(np.int64), offsets=offsets,
                      targets=g.astype(np.int64), query_rows=n, duplicates=int(same_link.sum()))
