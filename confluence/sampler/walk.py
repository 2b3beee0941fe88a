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

from confluence.sampler.groups import Counts, Graph, Segments, Sequences, Target, Visits, WalkLimits
from confluence.sampler.rng import below, next_u64
from confluence.stypes import SemanticType

VIA_SEED = 0
VIA_PARENT = 1
VIA_CHILD = 2

_F_VISITED = 1
_F_PARENT_Q = 2
_IDENT = int(SemanticType.IDENTIFIER)
_BOOL = int(SemanticType.BOOLEAN)
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
def anchor_cell_count(anchor: int, g: Graph, tgt: Target) -> int:
    """Cells the anchor row contributes: its visible cells minus excluded columns, plus a derived target and the
    observation-time cell (obs_col >= 0)."""
    t = np.searchsorted(g.tab_row_off, anchor, side="right") - 1
    lr = anchor - g.tab_row_off[t]
    n = (1 if tgt.is_derived else 0) + (1 if tgt.obs_col >= 0 else 0)
    for k in range(g.tab_col_ptr[t], g.tab_col_ptr[t + 1]):
        c = g.tab_cols[k]
        if c == tgt.col:
            n += 1
            continue
        skip = False
        for e in range(tgt.exclude_cols.shape[0]):
            if tgt.exclude_cols[e] == c:
                skip = True
        if skip:
            continue
        if g.col_stype[c] == _IDENT and not bit(g.valid_bits, g.col_voff[c], lr):
            continue
        n += 1
    return n


@njit(nogil=True, cache=True)
def child_mean(r: int, anchor: int, obs: int, k: int, cn: Counts, g: Graph, sg: Segments,
               first_only: bool) -> tuple[float, int]:
    """(mean, how many values) of mean k on row `r`: the child column `m_val[k]` over the latest `m_rows` rows
    that reference `r` through foreign-key column `m_fk[k]` with a time strictly before `obs` (every row with a time
    when obs is NO_CUTOFF), never the `anchor` row; NULL values are skipped, a boolean counts as 1 / -1. Read from
    the row's time-sorted per-foreign-key child segment. `first_only`: stop at the first value (is there one?)."""
    fk, val, child_tab = cn.m_fk[k], cn.m_val[k], cn.m_child_tab[k]
    total = 0.0
    n = 0
    for s in range(sg.seg_ptr[r], sg.seg_ptr[r + 1]):
        if sg.seg_col[s] != fk:
            continue
        a = sg.seg_off[s]
        hi = a + np.searchsorted(sg.c_time[a : sg.seg_off[s + 1]], obs, side="left")
        lo = max(a, hi - cn.m_rows)
        is_bool = g.col_stype[val] == _BOOL
        for j in range(hi - 1, lo - 1, -1):
            c = sg.c_idx[j]
            if c == anchor:
                continue
            lr = c - g.tab_row_off[child_tab]
            if not bit(g.valid_bits, g.col_voff[val], lr):
                continue
            if is_bool:
                total += 1.0 if bit(g.bool_bits, g.col_off[val], lr) else -1.0
            else:
                total += g.num_pool[g.col_off[val] + lr]
            n += 1
            if first_only:
                break
        break
    return (total / n if n > 0 else 0.0), n


@njit(nogil=True, cache=True)
def mean_cell_count(r: int, t: int, anchor: int, obs: int, cn: Counts, g: Graph, sg: Segments) -> int:
    """How many mean cells row `r` (of table t) gets: its table's shown means that have a value (a mean of nothing
    is no cell), at most `m_cells`; linearization writes exactly these."""
    n = 0
    for k in range(cn.m_tab_ptr[t], cn.m_tab_ptr[t + 1]):
        if n >= cn.m_cells:
            break
        if cn.m_shown[k] and child_mean(r, anchor, obs, k, cn, g, sg, True)[1] > 0:
            n += 1
    return n


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
def walk_chunk(lo: int, hi: int, sequences: tuple, graph: tuple, segments: tuple, target: tuple, limits: tuple,
               counts: tuple, mean_segments: tuple, mark: np.ndarray, stamp: np.ndarray, visits: tuple) -> None:
    """Walk sequences lo..hi-1: visit rows parents-first, then fewest hops (random tie-break), until S cells.

    Groups as plain tuples (`confluence.sampler.groups`): reads `Sequences` (anchors, observation times, the count
    cells the anchor row adds; advances the random states), `Graph`, `Segments`, the `Target` (the anchor row's
    cells, `anchor_cell_count`; its parent edges through `cut_cols` are cut), `WalkLimits` and the `Counts`' mean
    cells of the anchor and the rows it references (`mean_cell_count`, read from the per-foreign-key
    `mean_segments`); writes the `Visits` rows, hops, via, src and nrows. `mark` (i32[N]) and `stamp` (i64[1]) are
    the worker's scratch."""
    sq, g, sg_, lim, out = Sequences(*sequences), Graph(*graph), Segments(*segments), WalkLimits(*limits), \
        Visits(*visits)
    tgt = Target(*target)
    cut_cols = tgt.cut_cols
    anchors, obs_times, anchor_extra, states = sq.anchors, sq.obs, sq.anchor_extra, sq.states
    seq_len, width, recent, max_rows, tab_extra = lim.seq_len, lim.width, lim.recent, lim.max_rows, lim.tab_extra
    cn, msg = Counts(*counts), Segments(*mean_segments)
    means_on = cn.m_tab_ptr[cn.m_tab_ptr.shape[0] - 1] > 0
    row_ncells, row_time, p_ptr, p_idx, p_col = g.row_ncells, g.row_time, g.p_ptr, g.p_idx, g.p_col
    max_parents, tab_row_off = g.max_parents, g.tab_row_off
    seg_ptr, seg_off, c_idx, c_time, max_segs = sg_.seg_ptr, sg_.seg_off, sg_.c_idx, sg_.c_time, sg_.max_segs
    out_rows, out_hops, out_via, out_src, out_nrows = out.rows, out.hops, out.via, out.src, out.nrows
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
                cells += anchor_cell_count(row, g, tgt) + anchor_extra[b]
            else:
                cells += row_ncells[row]
                if tab_extra.shape[0] > 0:
                    cells += tab_extra[np.searchsorted(tab_row_off, row, side="right") - 1]
            if means_on and (nrows == 1 or (via == VIA_PARENT and src == 0)):  # the anchor, a row it references
                cells += mean_cell_count(row, np.searchsorted(tab_row_off, row, side="right") - 1, anchors[b], obs,
                                         cn, g, msg)
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
