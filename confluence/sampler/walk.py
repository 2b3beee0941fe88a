"""The context-window walk (spec/sampling.md), compiled with numba and run outside the GIL.

Frontier: a FIFO of rows reached through parent edges (always served first) and a binary min-heap of child
EDGES keyed by `(hops << 32) | random32`, so the pop is "fewest hops, ties at random". The heap is lazy: a child
row is read and checked (visited?) only when its edge is popped, which saves two cache misses per pushed child;
a row reached through k sampled child edges at the same hop count holds k keys (so it is more likely to come
first, by design: it is better connected to the context). With `recent > 0` the key's low bits rank the `recent`
latest children of each row latest first (a random tie-break among equal ranks) ahead of the uniform ones, so a
short context holds the newest history; `recent = 0` keeps the spec's key exactly.
A row's children come in segments: one per row (the spec: `width` children per row), or one per child foreign-key
column (`SamplerConfig.width_per_fk`: `width` per row and child FK column, as heterogeneous GNN samplers do per
edge type), each sorted by time.
Per-sequence state lives in a per-worker int32 `mark` array over all rows (3 flag bits + a stamp that increases
per sequence), so it is never cleared between sequences (O(rows visited) per sequence, not O(database)); it is
zeroed once every 2**28 sequences when the stamp wraps.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from confluence.sampler.rng import below, next_u64
from confluence.stypes import SemanticType

VIA_SEED = 0
VIA_PARENT = 1
VIA_CHILD = 2

_F_VISITED = 1
_F_PARENT_Q = 2
_IDENT = int(SemanticType.IDENTIFIER)
_STAMP_MAX = (1 << 28) - 1


@njit(nogil=True, cache=True, inline="always")
def bit(bits: np.ndarray, byte_off: int, i: int) -> bool:
    """Bit `i` of a little-endian packed bit array that starts at byte `byte_off`."""
    return (bits[byte_off + (i >> 3)] >> (i & 7)) & 1 == 1


@njit(nogil=True, cache=True, inline="always")
def is_cut(col: int, cut_cols: np.ndarray) -> bool:
    """Whether `col` is one of the task's cut columns (a handful: a linear scan)."""
    for k in range(cut_cols.shape[0]):
        if cut_cols[k] == col:
            return True
    return False


@njit(nogil=True, cache=True)
def anchor_cell_count(
    anchor: int,
    tab_row_off: np.ndarray,
    tab_col_ptr: np.ndarray,
    tab_cols: np.ndarray,
    col_stype: np.ndarray,
    col_voff: np.ndarray,
    valid_bits: np.ndarray,
    exclude_cols: np.ndarray,
    target_col: int,
    is_derived: bool,
    obs_col: int,
) -> int:
    """Cells the anchor row contributes: its visible cells minus excluded columns, plus a derived target and the
    observation-time cell (obs_col >= 0)."""
    t = np.searchsorted(tab_row_off, anchor, side="right") - 1
    lr = anchor - tab_row_off[t]
    n = (1 if is_derived else 0) + (1 if obs_col >= 0 else 0)
    for k in range(tab_col_ptr[t], tab_col_ptr[t + 1]):
        c = tab_cols[k]
        if c == target_col:
            n += 1
            continue
        skip = False
        for e in range(exclude_cols.shape[0]):
            if exclude_cols[e] == c:
                skip = True
        if skip:
            continue
        if col_stype[c] == _IDENT and not bit(valid_bits, col_voff[c], lr):
            continue
        n += 1
    return n


@njit(nogil=True, cache=True)
def anchor_cells_chunk(
    lo: int,
    hi: int,
    anchors: np.ndarray,
    tab_row_off: np.ndarray,
    tab_col_ptr: np.ndarray,
    tab_cols: np.ndarray,
    col_stype: np.ndarray,
    col_voff: np.ndarray,
    valid_bits: np.ndarray,
    exclude_cols: np.ndarray,
    target_col: int,
    is_derived: bool,
    obs_col: int,
    out: np.ndarray,
) -> None:
    """`anchor_cell_count` for sequences lo..hi-1."""
    for b in range(lo, hi):
        out[b] = anchor_cell_count(
            anchors[b], tab_row_off, tab_col_ptr, tab_cols, col_stype, col_voff, valid_bits, exclude_cols,
            target_col, is_derived, obs_col,
        )


@njit(nogil=True, cache=True, inline="always")
def _heap_push(hkey: np.ndarray, hrow: np.ndarray, size: int, key: int, row: int) -> int:
    i = size
    hkey[i] = key
    hrow[i] = row
    while i > 0:
        p = (i - 1) >> 1
        if hkey[p] <= hkey[i]:
            break
        hkey[p], hkey[i] = hkey[i], hkey[p]
        hrow[p], hrow[i] = hrow[i], hrow[p]
        i = p
    return size + 1


@njit(nogil=True, cache=True, inline="always")
def _heap_pop(hkey: np.ndarray, hrow: np.ndarray, size: int) -> int:
    """Remove the root (the caller read it first); returns the new size."""
    size -= 1
    hkey[0] = hkey[size]
    hrow[0] = hrow[size]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= size:
            break
        m = left
        if left + 1 < size and hkey[left + 1] < hkey[left]:
            m = left + 1
        if hkey[i] <= hkey[m]:
            break
        hkey[m], hkey[i] = hkey[i], hkey[m]
        hrow[m], hrow[i] = hrow[i], hrow[m]
        i = m
    return size


@njit(nogil=True, cache=True)
def walk_chunk(
    lo: int,
    hi: int,
    anchors: np.ndarray,  # i64[B]
    obs_times: np.ndarray,  # i64[B]
    anchor_cells: np.ndarray,  # i32[B]
    states: np.ndarray,  # u64[B] per-sequence generator state (advanced in place)
    seq_len: int,
    width: int,
    recent: int,  # of the `width` children kept, this many are the most recent ones (0: all uniform)
    max_rows: int,
    row_ncells: np.ndarray,
    row_time: np.ndarray,
    p_ptr: np.ndarray,
    p_idx: np.ndarray,
    p_col: np.ndarray,  # i32[E]: the foreign-key column of each parent edge
    cut_cols: np.ndarray,  # i32: the anchor row's parent edges through these columns are cut (exclude_columns)
    seg_ptr: np.ndarray,  # i64[N+1]: each row's child segments (one per row, or one per child FK column)
    seg_off: np.ndarray,  # i64[n_seg+1]: each segment's range in c_idx / c_time (time-sorted within a segment)
    c_idx: np.ndarray,
    c_time: np.ndarray,
    max_parents: int,
    max_segs: int,  # the most child segments of any row (sizes the heap)
    tab_row_off: np.ndarray,  # i64[T+1]
    tab_extra: np.ndarray,  # i32[T]: child-count cells per row of each table (empty: none)
    mark: np.ndarray,  # i32[N] per-worker scratch
    stamp: np.ndarray,  # i64[1] per-worker scratch
    out_rows: np.ndarray,  # i64[B, max_rows]
    out_hops: np.ndarray,  # i32[B, max_rows]
    out_via: np.ndarray,  # i8[B, max_rows]
    out_src: np.ndarray,  # i32[B, max_rows]: local index of the row whose edge reached it (-1: the seed)
    out_nrows: np.ndarray,  # i32[B]
) -> None:
    """Walk sequences lo..hi-1: visit rows parents-first, then fewest hops (random tie-break), until S cells."""
    heap_cap = max_rows * max(width, 1) * max(max_segs, 1) + 1
    hkey = np.empty(heap_cap, dtype=np.int64)
    hrow = np.empty(heap_cap, dtype=np.int64)  # entry id into erow / esrc
    erow = np.empty(heap_cap, dtype=np.int64)  # child edge (index into c_idx)
    esrc = np.empty(heap_cap, dtype=np.int32)
    q_cap = max_rows * max(max_parents, 1) + 1
    qrow = np.empty(q_cap, dtype=np.int64)
    qhop = np.empty(q_cap, dtype=np.int32)
    qsrc = np.empty(q_cap, dtype=np.int32)
    chosen = np.empty(max(width, 1), dtype=np.int64)
    st = np.empty(1, dtype=np.uint64)
    for b in range(lo, hi):
        if stamp[0] >= _STAMP_MAX:
            mark[:] = 0
            stamp[0] = 0
        stamp[0] += 1
        cur = np.int32(stamp[0])
        tag = np.int32(stamp[0] << 3)
        st[0] = states[b]
        obs = obs_times[b]
        hsize = 0
        n_entries = 0
        src = -1
        qhead = 0
        qtail = 0
        nrows = 0
        cells = 0
        row = anchors[b]
        hop = 0
        via = VIA_SEED
        while True:
            # visit `row`
            m = mark[row]
            flags = (m & 7) if (m >> 3) == cur else 0
            mark[row] = tag | flags | _F_VISITED
            out_rows[b, nrows] = row
            out_hops[b, nrows] = hop
            out_via[b, nrows] = via
            out_src[b, nrows] = src
            nrows += 1
            if nrows == 1:
                cells += anchor_cells[b]
            else:
                cells += row_ncells[row]
                if tab_extra.shape[0] > 0:
                    cells += tab_extra[np.searchsorted(tab_row_off, row, side="right") - 1]
            if cells >= seq_len or nrows >= max_rows:
                break
            # parents: all of them, unconditionally (but never a row from after the observation time)
            for e in range(p_ptr[row], p_ptr[row + 1]):
                p = p_idx[e]
                if row_time[p] > obs:
                    continue
                if nrows == 1 and is_cut(p_col[e], cut_cols):
                    continue  # an excluded foreign key of the anchor row: its parent is not reached through it
                pm = mark[p]
                pf = (pm & 7) if (pm >> 3) == cur else 0
                if pf & (_F_VISITED | _F_PARENT_Q):
                    continue
                mark[p] = tag | pf | _F_PARENT_Q
                qrow[qtail] = p
                qhop[qtail] = hop + 1
                qsrc[qtail] = nrows - 1
                qtail += 1
            # children that existed at the observation time: a prefix of each time-sorted segment, of which at
            # most `width` are kept (per row, or per child foreign-key column when the segments are split so)
            for sg in range(seg_ptr[row], seg_ptr[row + 1]):
                c0 = seg_off[sg]
                c1 = c0 + np.searchsorted(c_time[c0 : seg_off[sg + 1]], obs, side="right")
                cnt = c1 - c0
                if cnt == 0 or width == 0:
                    continue
                if cnt <= width:
                    k = cnt
                    for j in range(cnt):
                        chosen[j] = c0 + j
                else:
                    # the `recent` latest children (the end of the time-sorted prefix), then Floyd's algorithm:
                    # a uniform subset of `width - recent` of the `cnt - recent` older ones
                    k = 0
                    for j in range(c1 - recent, c1):
                        chosen[k] = j
                        k += 1
                    pool = cnt - recent
                    for j in range(pool - (width - recent), pool):
                        t = below(st, j + 1)
                        dup = False
                        for q in range(recent, k):
                            if chosen[q] == c0 + t:
                                dup = True
                                break
                        chosen[k] = c0 + (j if dup else t)
                        k += 1
                # lazy: the heap holds child *edges*; the child row is read (and checked) only when popped.
                # Key: hops, then (recent > 0) the `recent` latest children latest first, then at random.
                for j in range(k):
                    r32 = np.int64(next_u64(st) >> np.uint64(32))
                    if recent > 0:
                        age = c1 - 1 - chosen[j]  # 0 = the latest child that existed at the observation time
                        prio = np.int64(min(age, 254) if age < recent else 255)
                        key = (np.int64(hop + 1) << 32) | (prio << 24) | (r32 >> 8)
                    else:
                        key = (np.int64(hop + 1) << 32) | r32
                    erow[n_entries] = chosen[j]
                    esrc[n_entries] = nrows - 1
                    hsize = _heap_push(hkey, hrow, hsize, key, n_entries)
                    n_entries += 1
            # next row: parents first, then the child heap
            found = False
            while qhead < qtail:
                r = qrow[qhead]
                h = qhop[qhead]
                sr = qsrc[qhead]
                qhead += 1
                if (mark[r] & _F_VISITED) == 0 or (mark[r] >> 3) != cur:
                    row = r
                    hop = h
                    src = sr
                    via = VIA_PARENT
                    found = True
                    break
            while not found and hsize > 0:
                r = c_idx[erow[hrow[0]]]
                sr = esrc[hrow[0]]
                h = np.int32(hkey[0] >> 32)
                hsize = _heap_pop(hkey, hrow, hsize)
                if (mark[r] & _F_VISITED) == 0 or (mark[r] >> 3) != cur:
                    row = r
                    hop = h
                    src = sr
                    via = VIA_CHILD
                    found = True
            if not found:
                break
        out_nrows[b] = nrows
        states[b] = st[0]
