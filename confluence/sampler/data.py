"""`SamplerData`: the plain arrays the numba kernels read, built from a processed `Store`.

The kernels need homogeneous arrays, so the per-column value files are gathered into one pool per storage kind
(f32 z-scores, `[n, 15]` f32 timestamps, u32 categorical / text indices, packed bits for booleans and validity)
with a per-column offset. The graph arrays and the text embedding table stay memory-mapped (no copy).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numba
import numpy as np

from confluence.errors import StoreError
from confluence.store.format import MEAN_VALUE_STYPES, NULL_TIME, STATIC_TIME
from confluence.stypes import D_TIME, US_PER_DAY, SemanticType
from confluence.targets import kind


def readonly(a: np.ndarray, dtype: Any) -> np.ndarray:
    """A C-contiguous read-only view (or copy) of `a` with `dtype`; keeps numba signatures uniform."""
    out = np.ascontiguousarray(np.asarray(a), dtype=dtype)
    if out.flags.writeable:
        out = out.view()
        out.flags.writeable = False
    return out


@dataclass
class TaskData:
    """One task's seeds and targets, as the kernels read them."""

    name: str
    index: int
    target_stype: int
    target_col: int
    is_derived: bool
    exclude_cols: np.ndarray  # int32
    cut_cols: np.ndarray  # int32: exclude_cols and the target column; the anchor's parent edges through them are cut
    cat_block_start: int
    cat_count: int
    obs_col: int  # column of the anchor row's observation-time cell, -1 for none
    anchor_row: np.ndarray  # i64[n]
    obs_time: np.ndarray  # i64[n]
    tgt_f32: np.ndarray  # f32[n] (numerical) or f32[1]
    tgt_ts: np.ndarray  # f32[n, 15] (timestamp) or f32[1, 15]
    tgt_u32: np.ndarray  # u32[n] (categorical) or u32[1]
    tgt_bits: np.ndarray  # u8 packed bits (boolean) or u8[1]
    tgt_valid: np.ndarray  # u8 packed bits
    obs_ts: np.ndarray  # f32[n, 15]: the encoded observation time (obs_col >= 0) or f32[1, 15]
    # i64[n]: what each seed's random numbers are keyed on, None for the seed index itself (a served task). An
    # ad-hoc anchor task (`Sampler.anchor_task`) keys an anchor that is a seed of its task on that seed's index, so
    # the same (anchor, observation time) gets the same context draws however it is asked for
    seed_keys: np.ndarray | None = None
    # the task's waits on its train split, in epoch z-units (`confluence.sampler.waits`; 0, 0: none)
    wait_median: float = 0.0
    wait_scale: float = 0.0

    @property
    def num_seeds(self) -> int:
        return int(self.anchor_row.shape[0])


@dataclass(frozen=True)
class ChildSegments:
    """Child edges grouped into time-sorted segments: row r's segments are seg_ptr[r]..seg_ptr[r+1]; segment s
    covers c_idx[seg_off[s]:seg_off[s+1]] (child rows) and c_time (their times)."""

    seg_ptr: np.ndarray  # i64[N+1]
    seg_off: np.ndarray  # i64[n_seg+1]
    c_idx: np.ndarray  # i64[E]
    c_time: np.ndarray  # i64[E]
    max_segs: int
    seg_col: np.ndarray  # i32[n_seg]: the foreign-key column of each segment (-1: a row's mixed children)


# the "window" of a count column that shows the days since the parent's latest child instead of a count
LATEST = -1


@dataclass(frozen=True)
class ChildCounts:
    """The child-count cells (`SamplerConfig.child_counts`): count k shows, on each row of its parent table, how
    many rows reference that row through foreign-key column `fk[k]` and existed at the observation time, as
    `(log1p(count) - mean[k]) / std[k]` in the numerical cell of column `col[k]`; a windowed count (`window[k]`
    > 0) counts only those of the last `window[k]` µs, and one with `window[k]` < 0 shows instead
    `(log1p(days since the latest of them) - mean[k]) / std[k]` (NULL without one). Table t's counts are
    `tab_ptr[t]..tab_ptr[t+1]`. `mean` and `std` are those of log1p(final count) over the parent table's rows, from
    the whole graph, for a windowed count those of log1p(the windowed count at each referencing row's own time), and
    for the latest child's days those of log1p(the gap between a parent's consecutive children): fixed per
    database, like a column's z-score."""

    tab_ptr: np.ndarray  # i64[T+1]
    col: np.ndarray  # i32[K]: the derived count column (its embedding names the cell)
    fk: np.ndarray  # i32[K]: the child table's foreign-key column that is counted
    window: np.ndarray  # i64[K]: µs; count only rows of the last `window` before the observation time (0: all;
    # < 0: the days since the latest)
    mean: np.ndarray  # f32[K]
    std: np.ndarray  # f32[K]

    @property
    def num(self) -> int:
        return int(self.col.shape[0])


@dataclass(frozen=True)
class ChildMeans:
    """The children's-mean cells (`SamplerConfig.child_means`): mean k shows, on the anchor row and the rows it
    references when they belong to its parent table, the mean of the child table's column `val[k]` over the latest
    `SamplerConfig.child_mean_rows` rows that reference the row through foreign-key column `fk[k]` and whose time is
    before the observation time (never the anchor row itself), in the numerical cell of column `col[k]`. A number
    averages its stored z-score, a boolean its share of true (as 2 share - 1). Table t's means are
    `tab_ptr[t]..tab_ptr[t+1]`; `child_tab[k]` is the child table (its rows hold the values)."""

    tab_ptr: np.ndarray  # i64[T+1]
    col: np.ndarray  # i32[K]: the derived mean column (its embedding names the cell)
    fk: np.ndarray  # i32[K]: the child table's foreign-key column
    val: np.ndarray  # i32[K]: the child table's averaged column
    child_tab: np.ndarray  # i32[K]

    @property
    def num(self) -> int:
        return int(self.col.shape[0])


@numba.njit(cache=True, nogil=True)
def fk_segments(indptr: np.ndarray, column: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split each row's time-sorted child edges by foreign-key column (a stable sort within the row, so each
    segment stays time-sorted). Returns (edge order, seg_ptr[N+1], seg_off[n_seg+1]); O(E) for rows whose
    children all come through one column."""
    n = indptr.shape[0] - 1
    n_edges = indptr[n]
    order = np.empty(n_edges, dtype=np.int64)
    seg_ptr = np.zeros(n + 1, dtype=np.int64)
    seg_off = np.zeros(n_edges + 1, dtype=np.int64)
    nseg = 0
    for p in range(n):
        a, b = indptr[p], indptr[p + 1]
        if b > a:
            same = True
            for e in range(a + 1, b):
                if column[e] != column[a]:
                    same = False
                    break
            if same:
                for e in range(a, b):
                    order[e] = e
            else:
                idx = np.argsort(column[a:b], kind="mergesort")
                for i in range(b - a):
                    order[a + i] = a + idx[i]
            for e in range(a, b):
                if e == a or column[order[e]] != column[order[e - 1]]:
                    seg_off[nseg] = e
                    nseg += 1
        seg_ptr[p + 1] = nseg
    seg_off[nseg] = n_edges
    return order, seg_ptr, seg_off[: nseg + 1].copy()


@numba.njit(cache=True, nogil=True)
def _edges_in(seg_off: np.ndarray, segs: np.ndarray) -> int:
    """How many child edges the segments `segs` hold."""
    n = 0
    for s in segs:
        n += seg_off[s + 1] - seg_off[s]
    return n


@numba.njit(cache=True, nogil=True)
def windowed_counts(seg_off: np.ndarray, c_time: np.ndarray, segs: np.ndarray, window: int) -> np.ndarray:
    """For every child edge of the time-sorted segments `segs` (rows with a NULL time left out): how many edges of
    its segment have a time in (its time - window, its time] (the count at the child's own time, itself included:
    never 0). The distribution a windowed count column's z-score is fitted on (docs/design/decisions.md, "Windowed count
    scaling")."""
    out = np.empty(_edges_in(seg_off, segs), dtype=np.int64)
    m = 0
    for s in segs:
        a, b = seg_off[s], seg_off[s + 1]
        times = c_time[a:b]
        for e in range(a, b):
            t = c_time[e]
            if t == NULL_TIME:
                continue
            out[m] = np.searchsorted(times, t, side="right") - np.searchsorted(times, t - window, side="right")
            m += 1
    return out[:m]


@numba.njit(cache=True, nogil=True)
def latest_gaps(seg_off: np.ndarray, c_time: np.ndarray, segs: np.ndarray) -> np.ndarray:
    """For every child edge of the time-sorted segments `segs` that follows an earlier one with a time: the days
    since that earlier one (what the "days since the latest child" cell shows at the child's own time). The
    distribution its z-score is fitted on, as the windowed counts' is fitted at their children's times."""
    out = np.empty(_edges_in(seg_off, segs), dtype=np.float64)
    m = 0
    for s in segs:
        for e in range(seg_off[s] + 1, seg_off[s + 1]):
            t, prev = c_time[e], c_time[e - 1]
            if t == NULL_TIME or prev == STATIC_TIME:
                continue
            out[m] = (t - prev) / US_PER_DAY
            m += 1
    return out[:m]


@dataclass
class SamplerData:
    """One database in the form the sampler kernels read (see module docstring)."""

    name: str
    d_t: int
    num_rows: int
    table_names: list[str]
    column_names: list[str]  # by global column index ("table.column" or "task.target")
    tab_row_off: np.ndarray  # i64[T+1]
    tab_col_ptr: np.ndarray  # i64[T+1] into tab_cols
    tab_cols: np.ndarray  # i32, global column ids of each table's non-ignored columns, in order
    col_stype: np.ndarray  # i8[C]
    col_off: np.ndarray  # i64[C]: element offset into the column's pool (byte offset for booleans)
    col_voff: np.ndarray  # i64[C]: byte offset into valid_bits
    num_pool: np.ndarray  # f32
    ts_pool: np.ndarray  # f32[., 15]
    u32_pool: np.ndarray  # u32 (categorical and text indices)
    bool_bits: np.ndarray  # u8
    valid_bits: np.ndarray  # u8
    row_ncells: np.ndarray  # i32[N]: cells a row contributes (non-ignored columns minus NULL identifiers)
    row_time: np.ndarray  # i64[N]
    parent_indptr: np.ndarray
    parent_indices: np.ndarray
    parent_column: np.ndarray  # i32[E]: the foreign-key column of each parent edge
    child_indptr: np.ndarray
    child_indices: np.ndarray
    child_time: np.ndarray
    child_column: np.ndarray  # i32[E]: the foreign-key column of each child edge
    max_parents: int
    text_embeddings: np.ndarray  # f16[Vt, D_t], memory-mapped
    tasks: list[TaskData]
    # child-count columns of the store, (column, foreign-key column, parent table index, window in days, 0 for
    # all time or LATEST for the days since the latest child), parent-table order
    count_columns: list[tuple[int, int, int, int]] = field(default_factory=list)
    # the count windows (days) that the store has for its temporal foreign keys; None: a store preprocessed
    # before windowed counts existed
    count_windows: tuple[int, ...] | None = ()
    # whether the store has the "days since the latest child" columns (False: preprocessed before they existed, or
    # no foreign key of a temporal table)
    count_latest: bool = False
    has_foreign_keys: bool = False
    # children's-mean columns of the store, (column, foreign-key column, averaged column, parent table index, child
    # table index), parent-table order; `mean_candidates`: whether the store's tables call for any (a temporal table
    # with a foreign key and a numerical or boolean column), so a store preprocessed before they existed is told
    mean_columns: list[tuple[int, int, int, int, int]] = field(default_factory=list)
    mean_candidates: bool = False
    # the store's metadata (its tasks' horizons and splits), so a sampler built from SamplerData alone (the
    # sampler benchmark) reads what one built from the store reads
    meta: dict[str, Any] | None = None
    # the store's timestamp z-score (mean, std), so observation-time cells of new anchors encode alike from either
    timestamp_stats: tuple[float, float] | None = None
    _segments: dict[bool, ChildSegments] = field(default_factory=dict, repr=False)
    _counts: dict[tuple[bool, tuple[int, ...], bool], ChildCounts] = field(default_factory=dict, repr=False)

    def child_segments(self, per_fk: bool) -> ChildSegments:
        """The child lists as the walk reads them: one segment per row (`per_fk` False, the store's arrays as they
        are) or one per (row, child foreign-key column), each still time-sorted. Built once, on first use."""
        if per_fk not in self._segments:
            n = self.num_rows
            if not per_fk:
                seg = ChildSegments(readonly(np.arange(n + 1), np.int64), self.child_indptr, self.child_indices,
                                    self.child_time, 1, readonly(np.full(n, -1), np.int32))
            else:
                order, seg_ptr, seg_off = fk_segments(self.child_indptr, self.child_column)
                seg = ChildSegments(readonly(seg_ptr, np.int64), readonly(seg_off, np.int64),
                                    readonly(self.child_indices[order], np.int64),
                                    readonly(self.child_time[order], np.int64),
                                    int(np.max(np.diff(seg_ptr))) if n else 1,
                                    readonly(self.child_column[order][seg_off[:-1]], np.int32))
            self._segments[per_fk] = seg
        return self._segments[per_fk]

    def child_counts(self, enabled: bool, windows: tuple[int, ...] = (), latest: bool = False) -> ChildCounts:
        """The child-count cells' arrays (no counts at all when not `enabled`): the all-time counts, the
        windowed ones of `windows` (days), each z-scored over the counts at its children's own times, and with
        `latest` the days since the latest child (z-scored log1p, over the gaps between a parent's children).
        Built once per setting, on first use, from the per-foreign-key child segments. Raises StoreError for a
        store preprocessed before count columns (or windows, or the latest child's days) existed."""
        key = (bool(enabled), tuple(windows) if enabled else (), bool(enabled and latest))
        if key not in self._counts:
            n_tab = len(self.table_names)
            cols = ([c for c in self.count_columns if c[3] == 0 or c[3] in key[1] or (key[2] and c[3] == LATEST)]
                    if enabled else [])
            if enabled and not cols and self.has_foreign_keys:
                raise StoreError(f"database {self.name!r}: the store has no child-count columns (it was "
                                 "preprocessed before they existed); run `confluence preprocess` again to use "
                                 "sampler.child_counts")
            if key[1] and self.count_windows is None:
                raise StoreError(f"database {self.name!r}: the store has no windowed child-count columns (it was "
                                 "preprocessed before they existed); run `confluence preprocess` again to use "
                                 "sampler.child_count_windows")
            # a store with temporal foreign keys (windowed columns), or one made before windows: made before these
            if key[2] and not self.count_latest and (self.count_windows is None or any(c[3] > 0 for c in self.count_columns)):
                raise StoreError(f"database {self.name!r}: the store has no \"days since the latest child\" columns "
                                 "(it was preprocessed before they existed); run `confluence preprocess` again to use "
                                 "sampler.child_latest")
            per_tab = np.bincount(np.array([t for _, _, t, _ in cols], dtype=np.int64), minlength=n_tab)
            mean = np.zeros(len(cols), np.float32)
            std = np.ones(len(cols), np.float32)
            window = np.array([w * US_PER_DAY for _, _, _, w in cols], dtype=np.int64)
            if cols:
                seg = self.child_segments(True)
                seg_row = np.repeat(np.arange(self.num_rows), np.diff(seg.seg_ptr))
                seg_len = np.diff(seg.seg_off)
                for k, (_, fk, t, w) in enumerate(cols):
                    if w == LATEST:
                        v = np.log1p(latest_gaps(seg.seg_off, seg.c_time, np.flatnonzero(seg.seg_col == fk)))
                    elif window[k]:
                        v = windowed_counts(seg.seg_off, seg.c_time, np.flatnonzero(seg.seg_col == fk), window[k])
                        v = np.log1p(v.astype(np.float64))
                    else:
                        lo, hi = int(self.tab_row_off[t]), int(self.tab_row_off[t + 1])
                        deg = np.zeros(hi - lo, np.float64)
                        sel = seg.seg_col == fk
                        np.add.at(deg, seg_row[sel] - lo, seg_len[sel])
                        v = np.log1p(deg)
                    mean[k] = v.mean() if v.size else 0.0
                    sd = float(v.std()) if v.size else 0.0
                    std[k] = sd if sd > 1e-6 else 1.0
            self._counts[key] = ChildCounts(
                tab_ptr=readonly(np.concatenate([[0], np.cumsum(per_tab)]), np.int64),
                col=readonly(np.array([c for c, _, _, _ in cols], dtype=np.int32), np.int32),
                fk=readonly(np.array([f for _, f, _, _ in cols], dtype=np.int32), np.int32),
                window=readonly(window, np.int64),
                mean=readonly(mean, np.float32), std=readonly(std, np.float32))
        return self._counts[key]

    def child_means(self, enabled: bool) -> ChildMeans:
        """The children's-mean cells' arrays (none when not `enabled`). Raises StoreError for a store preprocessed
        before the mean columns existed."""
        if enabled and not self.mean_columns and self.mean_candidates:
            raise StoreError(f"database {self.name!r}: the store has no children's-mean columns (it was preprocessed "
                             "before they existed); run `confluence preprocess` again to use sampler.child_means")
        cols = self.mean_columns if enabled else []
        per_tab = np.bincount(np.array([c[3] for c in cols], dtype=np.int64), minlength=len(self.table_names))

        def arr(i: int) -> np.ndarray:
            return readonly(np.array([c[i] for c in cols], dtype=np.int32), np.int32)

        return ChildMeans(tab_ptr=readonly(np.concatenate([[0], np.cumsum(per_tab)]), np.int64), col=arr(0),
                          fk=arr(1), val=arr(2), child_tab=arr(4))

    def task(self, name: str) -> TaskData:
        for t in self.tasks:
            if t.name == name:
                return t
        known = ", ".join(t.name for t in self.tasks) or "none"
        raise StoreError(f"database {self.name!r} has no task {name!r} (tasks: {known})")

    def table_of_row(self, row: int) -> int:
        return int(np.searchsorted(self.tab_row_off, row, side="right") - 1)

    @classmethod
    def from_store(cls, store: Any) -> SamplerData:
        """Build the kernel arrays from a `confluence.store.Store` (or any object with its reader API)."""
        n_cols = int(store.num_columns)
        col_stype = np.full(n_cols, int(SemanticType.IGNORED), dtype=np.int8)
        col_off = np.zeros(n_cols, dtype=np.int64)
        col_voff = np.zeros(n_cols, dtype=np.int64)
        column_names = [""] * n_cols
        table_index = {t.name: i for i, t in enumerate(store.tables)}
        count_columns: list[tuple[int, int, int, int]] = []
        mean_columns: list[tuple[int, int, int, int, int]] = []
        windows: set[int] = set()
        old_counts = False  # an all-time count column without its "windows": preprocessed before windows existed
        has_latest = False  # a "days since the latest child" column: preprocessed since they exist
        table_of = {int(c.column_idx): c.table for c in store.columns}

        def child_column(c: Any, what: str, idx: Any, table: str | None) -> int:
            """A count / mean column's `idx` (a column of the child table it reads), checked: the kernels index
            arrays with it unchecked, so a store naming a column out of range must not reach them."""
            if isinstance(idx, bool) or not isinstance(idx, int) or idx not in table_of or (
                    table is not None and table_of[idx] != table):
                raise StoreError(f"column {c.column_idx} ({c.name!r}): its {what} {idx!r} is not a column of "
                                 f"{'the store' if table is None else repr(table)}; run confluence preprocess again")
            return idx

        for c in store.columns:
            col_stype[c.column_idx] = int(c.stype)
            count_of = getattr(c, "count_of", None)
            mean_of = getattr(c, "mean_of", None)
            if mean_of:
                for key in ("parent_table", "child_table"):
                    if mean_of.get(key) not in table_index:
                        raise StoreError(f"column {c.column_idx} ({c.name!r}): averages rows of a table "
                                         f"{mean_of.get(key)!r} that the store does not have")
                column_names[c.column_idx] = f"{mean_of['parent_table']}.{c.name}"
                child = mean_of["child_table"]
                mean_columns.append((int(c.column_idx), child_column(c, "foreign key", mean_of.get("column_idx"), child),
                                     child_column(c, "averaged column", mean_of.get("value_column_idx"), child),
                                     table_index[mean_of["parent_table"]], table_index[child]))
            elif count_of:
                if count_of.get("parent_table") not in table_index:
                    raise StoreError(f"column {c.column_idx} ({c.name!r}): counts rows of a table "
                                     f"{count_of.get('parent_table')!r} that the store does not have")
                column_names[c.column_idx] = f"{count_of['parent_table']}.{c.name}"
                w = LATEST if count_of.get("latest") else int(count_of.get("window_days", 0))
                count_columns.append((int(c.column_idx), child_column(c, "foreign key", count_of.get("column_idx"), None),
                                      table_index[count_of["parent_table"]], w))
                if w > 0:
                    windows.add(w)
                elif w == 0 and "windows" not in count_of:
                    old_counts = True
                elif w == LATEST:
                    has_latest = True
            else:
                column_names[c.column_idx] = f"{c.table}.{c.name}" if c.table else f"{c.task}.{c.name}"
        count_columns.sort(key=lambda x: (x[2], x[0]))
        mean_columns.sort(key=lambda x: (x[3], x[0]))
        mean_candidates = any(
            t.temporal_column is not None and any(getattr(c, "foreign_key", None) for c in t.columns)
            and any(not getattr(c, "foreign_key", None) and SemanticType(int(c.stype)) in
                    MEAN_VALUE_STYPES for c in t.columns)
            for t in store.tables)
        num, ts, u32, bools, valid = [], [], [], [], []
        sizes = {"num": 0, "ts": 0, "u32": 0, "bool": 0, "valid": 0}
        tab_row_off = [0]
        tab_col_ptr = [0]
        tab_cols: list[int] = []
        row_ncells = np.zeros(int(store.num_rows), dtype=np.int32)
        for t in store.tables:
            if int(t.row_offset) != tab_row_off[-1]:
                raise StoreError(f"table {t.name!r}: row_offset {t.row_offset} does not follow the previous tables")
            n = int(t.num_rows)
            cells = np.zeros(n, dtype=np.int32)
            for c in t.columns:
                st = SemanticType(int(c.stype))
                if st == SemanticType.IGNORED:
                    continue
                ci = int(c.column_idx)
                tab_cols.append(ci)
                v = np.asarray(store.validity(t.name, c.name))
                if v.shape[0] != (n + 7) // 8:
                    raise StoreError(f"column {t.name}.{c.name}: validity has {v.shape[0]} bytes, expected {(n + 7) // 8}")
                col_voff[ci] = sizes["valid"]
                valid.append(v)
                sizes["valid"] += v.shape[0]
                if st == SemanticType.IDENTIFIER:
                    cells += np.unpackbits(v, count=n, bitorder="little").astype(np.int32)
                    continue
                cells += 1
                vals = np.asarray(store.values(t.name, c.name))
                kind, want = {
                    SemanticType.NUMERICAL: ("num", (n,)),
                    SemanticType.TIMESTAMP: ("ts", (n, D_TIME)),
                    SemanticType.BOOLEAN: ("bool", ((n + 7) // 8,)),
                    SemanticType.CATEGORICAL: ("u32", (n,)),
                    SemanticType.TEXT: ("u32", (n,)),
                }[st]
                if tuple(vals.shape) != want:
                    raise StoreError(f"column {t.name}.{c.name}: values have shape {vals.shape}, expected {want}")
                col_off[ci] = sizes[kind]
                sizes[kind] += vals.shape[0]
                {"num": num, "ts": ts, "u32": u32, "bool": bools}[kind].append(vals)
            row_ncells[tab_row_off[-1] : tab_row_off[-1] + n] = cells
            tab_row_off.append(tab_row_off[-1] + n)
            tab_col_ptr.append(len(tab_cols))

        def pool(parts: list[np.ndarray], dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
            return readonly(np.concatenate(parts) if parts else np.zeros(shape, dtype=dtype), dtype)

        parent_indptr = readonly(store.parent_indptr, np.int64)
        tasks = [_task_data(store, ti) for ti in store.tasks]
        return cls(
            name=str(store.name),
            d_t=int(store.d_t),
            num_rows=int(store.num_rows),
            table_names=[t.name for t in store.tables],
            column_names=column_names,
            tab_row_off=readonly(tab_row_off, np.int64),
            tab_col_ptr=readonly(tab_col_ptr, np.int64),
            tab_cols=readonly(np.array(tab_cols, dtype=np.int32), np.int32),
            col_stype=readonly(col_stype, np.int8),
            col_off=readonly(col_off, np.int64),
            col_voff=readonly(col_voff, np.int64),
            num_pool=pool(num, np.float32, (1,)),
            ts_pool=pool(ts, np.float32, (1, D_TIME)),
            u32_pool=pool(u32, np.uint32, (1,)),
            bool_bits=pool(bools, np.uint8, (1,)),
            valid_bits=pool(valid, np.uint8, (1,)),
            row_ncells=readonly(row_ncells, np.int32),
            row_time=readonly(store.row_time, np.int64),
            parent_indptr=parent_indptr,
            parent_indices=readonly(store.parent_indices, np.int64),
            parent_column=readonly(store.parent_column, np.int32),
            child_indptr=readonly(store.child_indptr, np.int64),
            child_indices=readonly(store.child_indices, np.int64),
            child_time=readonly(store.child_time, np.int64),
            child_column=readonly(store.child_column, np.int32),
            max_parents=int(np.max(np.diff(parent_indptr))) if parent_indptr.shape[0] > 1 else 0,
            text_embeddings=readonly(store.text_embeddings, np.float16),
            tasks=tasks,
            count_columns=count_columns,
            count_windows=None if old_counts else tuple(sorted(windows)),
            count_latest=has_latest,
            has_foreign_keys=any(getattr(c, "foreign_key", None) for c in store.columns),
            mean_columns=mean_columns,
            mean_candidates=mean_candidates,
            meta=getattr(store, "meta", None),
            timestamp_stats=tuple(float(x) for x in store.timestamp_stats),
        )


def obs_time_cells(store: Any, obs_col: int, obs_time: np.ndarray) -> np.ndarray:
    """The encoded observation times of a task's seeds (f32[n, 15], with the store's timestamp z-score); a task
    without the cell (obs_col < 0) gets an unread [1, 15] array of zeros, like the other unused target slots,
    because the kernels take the same argument types for every task."""
    from confluence.preprocess.encode import encode_timestamp

    if obs_col < 0:
        return readonly(np.zeros((1, D_TIME), np.float32), np.float32)
    return readonly(encode_timestamp(np.asarray(obs_time, dtype=np.int64), *store.timestamp_stats), np.float32)


def _task_data(store: Any, info: Any) -> TaskData:
    arrs = store.task_arrays(info.name)
    st = SemanticType(int(info.target_stype))
    if not st.can_be_target:
        raise StoreError(f"task {info.name!r}: target stype {st.label} cannot be a target")
    vals = np.asarray(arrs.target_values)
    n = int(np.asarray(arrs.anchor_row).shape[0])
    tgt = kind(st).target_arrays(vals)
    valid = np.asarray(arrs.target_valid)
    obs_col = int(getattr(info, "obs_column_idx", -1))
    if valid.shape[0] != (n + 7) // 8:
        raise StoreError(f"task {info.name!r}: target validity has {valid.shape[0]} bytes for {n} seeds")
    return TaskData(
        name=str(info.name),
        index=int(info.index),
        target_stype=int(st),
        target_col=int(info.target_column_idx),
        is_derived=bool(info.is_derived),
        exclude_cols=readonly(np.array(list(info.exclude_column_idxs), dtype=np.int32), np.int32),
        cut_cols=readonly(np.array(sorted({*map(int, info.exclude_column_idxs), int(info.target_column_idx)}),
                                   dtype=np.int32), np.int32),
        cat_block_start=int(info.cat_block_start),
        cat_count=int(info.cat_count),
        obs_col=obs_col,
        anchor_row=readonly(arrs.anchor_row, np.int64),
        obs_time=readonly(arrs.obs_time, np.int64),
        tgt_f32=readonly(tgt["f32"], np.float32),
        tgt_ts=readonly(tgt["ts"], np.float32),
        tgt_u32=readonly(tgt["u32"], np.uint32),
        tgt_bits=readonly(tgt["bits"], np.uint8),
        tgt_valid=readonly(valid, np.uint8),
        obs_ts=obs_time_cells(store, obs_col, arrs.obs_time),
    )
