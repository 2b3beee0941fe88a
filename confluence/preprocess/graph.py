"""Foreign keys resolved to rows, and the FK graph as CSR in both directions.

Parent edges (F->P) are ordered by (child row, FK column order); child edges (P->F) by (parent, child time,
child row, FK column order), so "children that existed at time t" is a prefix found by binary search.
A non-null foreign key that matches no parent row is dangling: its edge is dropped and counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from confluence.errors import DataError


class KeyIndex:
    """The primary-key column of one table in row order; maps key values to local rows."""

    def __init__(self, table: str, column: str, keys: pa.Array):
        self.table, self.column = table, column
        if pa.types.is_dictionary(keys.type):
            keys = keys.dictionary_decode()
        if keys.null_count:
            row = int(np.flatnonzero(~np.asarray(keys.is_valid().to_numpy(zero_copy_only=False)))[0])
            raise DataError(f"table '{table}', column '{column}', row {row}: primary key is NULL")
        if pa.types.is_floating(keys.type):
            finite = np.asarray(pc.is_finite(keys).to_numpy(zero_copy_only=False), dtype=bool)
            if not finite.all():
                row = int(np.flatnonzero(~finite)[0])
                raise DataError(f"table '{table}', column '{column}', row {row}: primary key is {keys[row].as_py()}")
        if len(pc.unique(keys)) != len(keys):
            counts = pc.value_counts(keys)
            dup = counts.filter(pc.greater(counts.field("counts"), 1))[0]["values"].as_py()
            raise DataError(f"table '{table}', column '{column}': primary key value {dup!r} occurs more than once")
        self.keys = keys

    def lookup(self, fk: pa.Array, where: str) -> np.ndarray:
        """Local parent row per FK value: -1 where the FK is NULL or dangling."""
        if pa.types.is_dictionary(fk.type):
            fk = fk.dictionary_decode()
        if fk.type != self.keys.type:
            try:
                fk = pc.cast(fk, self.keys.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise DataError(
                    f"{where}: foreign key values of type {fk.type} do not convert to the type {self.keys.type} of"
                    f" '{self.table}.{self.column}' ({exc})"
                ) from None
        idx = pc.index_in(fk, value_set=self.keys)
        return np.asarray(idx.fill_null(-1).to_numpy(), dtype=np.int64)


@dataclass
class Graph:
    """Both CSR directions over global rows."""

    parent_indptr: np.ndarray
    parent_indices: np.ndarray
    parent_column: np.ndarray
    child_indptr: np.ndarray
    child_indices: np.ndarray
    child_time: np.ndarray
    child_column: np.ndarray


def table_edges(parents: list[np.ndarray], column_idxs: list[int], row_offset: int) -> tuple[np.ndarray, ...]:
    """Edges of one table from its FK columns' global parent rows (-1 = none), in (child row, column) order.

    Returns (child global rows, parent global rows, FK global column indices).
    """
    if not parents:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, np.zeros(0, dtype=np.int32)
    mat = np.stack(parents, axis=1)
    mask = mat >= 0
    n = mat.shape[0]
    child = np.repeat(np.arange(row_offset, row_offset + n, dtype=np.int64), mask.sum(axis=1))
    parent = mat[mask]
    column = np.broadcast_to(np.asarray(column_idxs, dtype=np.int32), mat.shape)[mask]
    return child, parent, column


def build_graph(num_rows: int, child: np.ndarray, parent: np.ndarray, column: np.ndarray,
                row_time: np.ndarray) -> Graph:
    """CSR both ways from edges given in (child row, column) order."""
    parent_indptr = np.zeros(num_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(child, minlength=num_rows), out=parent_indptr[1:])
    ctime = row_time[child]
    order = np.lexsort((ctime, parent))  # stable: ties keep (child row, column) order
    child_indptr = np.zeros(num_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(parent, minlength=num_rows), out=child_indptr[1:])
    return Graph(
        parent_indptr=parent_indptr,
        parent_indices=parent.astype(np.int64, copy=False),
        parent_column=column.astype(np.int32, copy=False),
        child_indptr=child_indptr,
        child_indices=child[order],
        child_time=ctime[order],
        child_column=column[order].astype(np.int32, copy=False),
    )
