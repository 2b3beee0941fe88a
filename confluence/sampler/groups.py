"""The typed argument groups of the sampler's numba kernels (walk, linearize, labels, permutations).

A kernel takes a few groups instead of dozens of positional arrays: the database (`Graph`), its child segments
(`Segments`), the task's target arrays (`Target`), the child-count and children's-mean cells (`Counts`), the labels a context may show (`Labels`), one batch's sequences (`Sequences`), what the walk visited and how the rows link (`Visits`) and the
batch's cell tensors (`Cells`, whose fields are `batch.SEQ_FIELDS`: the one batch specification).

At the call, each group goes as a plain tuple (`args(group)`) and the kernel names its fields again
(`Graph(*graph)`): numba's dispatcher types a plain tuple of arrays in C, as it does positional arrays, but a
namedtuple element by element in Python, which measured a few µs a call (5 % of the sampler's throughput at batch
16). Inside a kernel the rewrap costs nothing.
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any, NamedTuple

import numpy as np

from confluence.batch import SEQ_FIELDS


class Graph(NamedTuple):
    """A database's arrays as the kernels read them (`SamplerData`): tables, columns, value pools, validity,
    row times and the parent edges."""

    tab_row_off: np.ndarray  # i64[T+1]: each table's first global row
    tab_col_ptr: np.ndarray  # i64[T+1]: each table's columns in tab_cols
    tab_cols: np.ndarray  # i32: global column ids
    col_stype: np.ndarray  # i8[C]: each column's semantic type
    col_off: np.ndarray  # i64[C]: each column's offset in its value pool
    col_voff: np.ndarray  # i64[C]: each column's byte offset in valid_bits
    num_pool: np.ndarray  # f32: z-scored numbers
    ts_pool: np.ndarray  # f32[n, 15]: encoded timestamps
    u32_pool: np.ndarray  # u32: categorical and text indices
    bool_bits: np.ndarray  # u8: packed booleans
    valid_bits: np.ndarray  # u8: packed validity
    row_ncells: np.ndarray  # i32[N]: cells a row contributes
    row_time: np.ndarray  # i64[N]: each row's time (STATIC_TIME / NULL_TIME: none)
    p_ptr: np.ndarray  # i64[N+1]: each row's parent edges
    p_idx: np.ndarray  # i64[E]: the parent row of each edge
    p_col: np.ndarray  # i32[E]: the foreign-key column of each edge
    max_parents: int


class Segments(NamedTuple):
    """Child edges in time-sorted segments (`data.ChildSegments`): row r's segments are seg_ptr[r]..seg_ptr[r+1];
    segment s covers c_idx[seg_off[s]:seg_off[s+1]] (child rows) and c_time (their times)."""

    seg_ptr: np.ndarray
    seg_off: np.ndarray
    c_idx: np.ndarray
    c_time: np.ndarray
    seg_col: np.ndarray  # i32[n_seg]: each segment's foreign-key column (-1: a row's mixed children)
    max_segs: int


class Target(NamedTuple):
    """One task's target as the kernels read it (`data.TaskData`): the target cell's type and column, what the
    anchor row hides, and the targets and observation times by seed index."""

    stype: int
    col: int
    is_derived: bool
    obs_col: int  # the observation-time cell's column, -1 for none
    exclude_cols: np.ndarray  # i32
    cut_cols: np.ndarray  # i32: exclude_cols and the target column
    f32: np.ndarray  # f32[n] (numerical) or f32[1]
    ts: np.ndarray  # f32[n, 15] (timestamp) or f32[1, 15]
    u32: np.ndarray  # u32[n] (categorical) or u32[1]
    bits: np.ndarray  # u8 packed (boolean) or u8[1]
    valid: np.ndarray  # u8 packed
    obs_ts: np.ndarray  # f32[n, 15]: the encoded observation times, or f32[1, 15]


class Counts(NamedTuple):
    """The derived cells of a row: the child counts (`data.ChildCounts`) and the children's means
    (`data.ChildMeans`), which of them the task shows, and on which rows."""

    tab_ptr: np.ndarray  # i64[T+1]: table t's counts
    col: np.ndarray  # i32[K]: the derived count column
    fk: np.ndarray  # i32[K]: the counted foreign-key column
    window: np.ndarray  # i64[K]: µs, 0 = all time
    mean: np.ndarray  # f32[K]
    std: np.ndarray  # f32[K]
    shown: np.ndarray  # bool[K]: the task shows this count (not through its excluded / target columns)
    all_rows: bool  # counts on every row, else on the anchor row only
    # the children's-mean cells (`data.ChildMeans`), on the anchor row and the rows it references
    m_tab_ptr: np.ndarray  # i64[T+1]: table t's means
    m_col: np.ndarray  # i32[M]: the derived mean column
    m_fk: np.ndarray  # i32[M]: the child table's foreign-key column
    m_val: np.ndarray  # i32[M]: the averaged column of the child table
    m_child_tab: np.ndarray  # i32[M]
    m_shown: np.ndarray  # bool[M]: the task shows this mean (not through its excluded / target columns)
    m_rows: int  # the latest this many referencing rows are averaged
    m_cells: int  # at most this many mean cells a row


class Labels(NamedTuple):
    """The labels one phase's contexts may read (`labels.LabelIndex`), by anchor, by label time and by matched
    value; values by seed index of the labels' task."""

    is_cell: bool
    a_lo: int
    a_ptr: np.ndarray
    a_ids: np.ndarray
    a_lt: np.ndarray
    t_ids: np.ndarray
    t_lt: np.ndarray
    anchor_row: np.ndarray
    obs_time: np.ndarray
    label_time: np.ndarray
    f32: np.ndarray
    ts: np.ndarray
    u32: np.ndarray
    bits: np.ndarray
    valid: np.ndarray
    obs_ts: np.ndarray
    m_row_val: np.ndarray
    m_off: np.ndarray
    m_ids: np.ndarray
    m_val: np.ndarray
    m_lt: np.ndarray


class Sequences(NamedTuple):
    """One batch's sequences: each one's anchor, observation time, seed, random state and the count cells its anchor
    row adds."""

    anchors: np.ndarray  # i64[B]: global anchor rows
    obs: np.ndarray  # i64[B]: observation times
    seed_ids: np.ndarray  # i64[B]: seed indices of the task
    own: np.ndarray  # i64[B]: the seed index in the labels' task (-1: an anchor outside its seeds)
    states: np.ndarray  # u64[B]: random states (advanced in place by the walk)
    anchor_extra: np.ndarray  # i32[B]: child-count cells the anchor row adds to its own (`walk.anchor_cell_count`)


class Visits(NamedTuple):
    """What the walk visited, in order, and how the rows link: filled by the walk, linearization and labels."""

    rows: np.ndarray  # i64[B, max_rows]: global rows
    hops: np.ndarray  # i32[B, max_rows]
    via: np.ndarray  # i8[B, max_rows]: how each row was reached (walk.VIA_*, labels.VIA_LABEL)
    src: np.ndarray  # i32[B, max_rows]: the local row whose edge reached it (-1: the seed)
    nrows: np.ndarray  # i32[B]
    n_real: np.ndarray  # i32[B]: real cells
    edges: np.ndarray  # i32[B, E]: the fk_adj edges as (r1 << 16) | r2
    n_edges: np.ndarray  # i32[B]


class WalkLimits(NamedTuple):
    """How far a walk goes: cells, children kept per segment (of which the most recent), rows, and the count
    cells each table's rows add (empty: none)."""

    seq_len: int
    width: int
    recent: int
    max_rows: int
    tab_extra: np.ndarray  # i32[T]


Cells = namedtuple("Cells", list(SEQ_FIELDS))  # the batch's [B, S(, 15)] tensors, in `batch.SEQ_FIELDS` order
Cells.__doc__ = "The batch's cell tensors (`batch.SEQ_FIELDS`), written by the kernels."


def args(group: tuple[Any, ...]) -> tuple[Any, ...]:
    """A group as the kernels take it: a plain tuple (module docstring)."""
    return tuple(group)


def graph_of(data: Any) -> Graph:
    """The `Graph` of a `SamplerData`."""
    d = data
    return Graph(d.tab_row_off, d.tab_col_ptr, d.tab_cols, d.col_stype, d.col_off, d.col_voff, d.num_pool,
                 d.ts_pool, d.u32_pool, d.bool_bits, d.valid_bits, d.row_ncells, d.row_time, d.parent_indptr,
                 d.parent_indices, d.parent_column, int(d.max_parents))


def segments_of(segs: Any) -> Segments:
    """The `Segments` of a `data.ChildSegments`."""
    return Segments(segs.seg_ptr, segs.seg_off, segs.c_idx, segs.c_time, segs.seg_col, int(segs.max_segs))


def target_of(task: Any) -> Target:
    """The `Target` of a `data.TaskData`."""
    t = task
    return Target(int(t.target_stype), int(t.target_col), bool(t.is_derived), int(t.obs_col), t.exclude_cols,
                  t.cut_cols, t.tgt_f32, t.tgt_ts, t.tgt_u32, t.tgt_bits, t.tgt_valid, t.obs_ts)


def counts_of(counts: Any, shown: np.ndarray, all_rows: bool, means: Any, m_shown: np.ndarray, m_rows: int,
              m_cells: int) -> Counts:
    """The `Counts` of a `data.ChildCounts` and a `data.ChildMeans`, with the task's shown counts and means."""
    c, m = counts, means
    return Counts(c.tab_ptr, c.col, c.fk, c.window, c.mean, c.std, shown, bool(all_rows), m.tab_ptr, m.col, m.fk,
                  m.val, m.child_tab, m_shown, int(m_rows), int(m_cells))


def labels_of(index: Any) -> Labels:
    """The `Labels` of a `labels.LabelIndex`."""
    x = index
    return Labels(bool(x.is_cell), int(x.a_lo), x.a_ptr, x.a_ids, x.a_lt, x.t_ids, x.t_lt, x.anchor_row,
                  x.obs_time, x.label_time, x.tgt_f32, x.tgt_ts, x.tgt_u32, x.tgt_bits, x.tgt_valid, x.obs_ts,
                  x.m_row_val, x.m_off, x.m_ids, x.m_val, x.m_lt)
