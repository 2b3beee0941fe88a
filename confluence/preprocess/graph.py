"""Foreign keys resolved to rows, and the FK graph as CSR in both directions.

Parent edges (F->P) are ordered by (child row, FK column order); child edges (P->F) by (parent, child time,
child row, FK column order), so "children that existed at time t" is a prefix found by binary search.
A non-null foreign key that matches no parent row is dangling: its edge is dropped and counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
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
        # Integer keys: a dense direct table when the key range is small, else a sorted array for binary search.
        # (pc.index_in would rebuild its hash table of all keys on every batch.)
        self._dense: np.ndarray | None = None
        self._sorted: np.ndarray | None = None
        self._order: np.ndarray | None = None
        self._lo = 0
        if pa.types.is_integer(keys.type) and len(keys):
            k = np.asarray(keys.to_numpy(), dtype=np.int64)
            lo, hi = int(k.min()), int(k.max())
            if hi - lo < 4 * len(k) + 1024:
                self._lo = lo
                self._dense = np.full(hi - lo + 1, -1, dtype=np.int64)
                self._dense[k - lo] = np.arange(len(k), dtype=np.int64)
            else:
                self._order = np.argsort(k, kind="stable")
                self._sorted = k[self._order]

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
        if self._dense is not None or self._sorted is not None:
            valid = np.asarray(fk.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
            x = np.asarray(fk.fill_null(0).to_numpy(), dtype=np.int64)
            if self._dense is not None:
                off = x - self._lo
                inside = valid & (off >= 0) & (off < len(self._dense))
                return np.where(inside, self._dense[np.where(inside, off, 0)], -1)
            pos = np.minimum(np.searchsorted(self._sorted, x), len(self._sorted) - 1)
            hit = valid & (self._sorted[pos] == x)
            return np.where(hit, self._order[pos], -1)
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
    child_indptr = np.zeros(num_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(parent, minlength=num_rows), out=child_indptr[1:])
    order = child_order(parent.astype(np.int64, copy=False), ctime, child_indptr)
    return Graph(
        parent_indptr=parent_indptr,
        parent_indices=parent.astype(np.int64, copy=False),
        parent_column=column.astype(np.int32, copy=False),
        child_indptr=child_indptr,
        child_indices=child[order],
        child_time=ctime[order],
        child_column=column[order].astype(np.int32, copy=False),
    )


@numba.njit(cache=True, nogil=True)
def child_order(parent: np.ndarray, ctime: np.ndarray, child_indptr: np.ndarray) -> np.ndarray:
    """Permutation of the edges sorting them by (parent, child time), stable.

    A counting scatter by parent keeps the input (child row, column) order within each parent; each parent's
    bucket is then sorted by time (insertion sort for small buckets, merge sort for large ones, both stable).
    Equivalent to `np.lexsort((ctime, parent))`, in O(E log b) with b the bucket size.
    """
    n_edges = len(parent)
    fill = child_indptr[:-1].copy()
    order = np.empty(n_edges, dtype=np.int64)
    for e in range(n_edges):
        p = parent[e]
        order[fill[p]] = e
        fill[p] += 1
    for p in range(len(child_indptr) - 1):
        a, b = child_indptr[p], child_indptr[p + 1]
        if b - a < 2:
            continue
        if b - a <= 32:
            for i in range(a + 1, b):
                e = order[i]
                t = ctime[e]
                j = i - 1
                while j >= a and ctime[order[j]] > t:
                    order[j + 1] = order[j]
                    j -= 1
                order[j + 1] = e
        else:
            seg = order[a:b].copy()
            idx = np.argsort(ctime[seg], kind="mergesort")
            for i in range(b - a):
                order[a + i] = seg[idx[i]]
    return order
