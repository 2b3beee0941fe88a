"""Linearization: visited rows -> the cell tensors of seed 000 sections 1-3 and the F->P edge list (numba, nogil).

Order: the target cell first (so it always fits in S), then the observation-time cell of a task that has one,
then the anchor row's other cells (excluded columns hidden), then every other row in visit order, each row's
cells in column order followed by its child-count cells (`SamplerConfig.child_counts`, the all-time counts, the
windowed ones of `child_count_windows`, then with `child_latest` the days since the latest child) and, on the
anchor row and the rows it references, its children's-mean cells (`SamplerConfig.child_means`). Every cell of a row
carries the row's age at the observation time (`row_age`, days) and, for a row reached as a child, its recency
rank among its parent's children through that foreign key (`child_rank`: 0 = the latest at the observation time), and
every row but the anchor the foreign key it was reached through (`arrival`, `batch.arrival_code`). The last row may
be cut at S.
Text cells hold GLOBAL text indices here; `textgather` rewrites them batch-locally.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from confluence.batch import ARRIVAL_NONE, CHILD_RANK_MAX, CHILD_RANK_UNKNOWN, ROW_AGE_UNKNOWN
from confluence.sampler.groups import Cells, Counts, Graph, Segments, Sequences, Target, Visits
from confluence.sampler.walk import VIA_CHILD, VIA_PARENT, bit, child_mean, is_cut
from confluence.store.format import NO_CUTOFF, NULL_TIME, STATIC_TIME
from confluence.stypes import D_TIME, US_PER_DAY, SemanticType

_IDENT = int(SemanticType.IDENTIFIER)
_NUM = int(SemanticType.NUMERICAL)
_TS = int(SemanticType.TIMESTAMP)
_BOOL = int(SemanticType.BOOLEAN)
_CAT = int(SemanticType.CATEGORICAL)
_TEXT = int(SemanticType.TEXT)
_UNKNOWN = np.float32(ROW_AGE_UNKNOWN)
_UNKNOWN_RANK = np.int16(CHILD_RANK_UNKNOWN)


@njit(nogil=True, cache=True, inline="always")
def _slot(key: int, cap: int) -> int:
    return int((np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)) & (cap - 1)


@njit(nogil=True, cache=True)
def row_map(rows: np.ndarray, b: int, nr: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Sequence b's first `nr` rows as a small open-addressing hash table (global row -> sequence-local index):
    (keys, values, capacity), read with `local_row`."""
    cap = 16
    while cap < 2 * nr:
        cap *= 2
    hkeys = np.full(cap, -1, dtype=np.int64)
    hvals = np.empty(cap, dtype=np.int32)
    for i in range(nr):
        h = _slot(rows[b, i], cap)
        while hkeys[h] != -1:
            h = (h + 1) & (cap - 1)
        hkeys[h] = rows[b, i]
        hvals[h] = i
    return hkeys, hvals, cap


@njit(nogil=True, cache=True, inline="always")
def local_row(hkeys: np.ndarray, hvals: np.ndarray, cap: int, row: int) -> int:
    """Sequence-local index of global `row` in a `row_map`, -1 when it is not in the context."""
    h = _slot(row, cap)
    while hkeys[h] != -1:
        if hkeys[h] == row:
            return hvals[h]
        h = (h + 1) & (cap - 1)
    return -1


@njit(nogil=True, cache=True, inline="always")
def linking_fk(child: int, parent: int, skip_cut: bool, p_ptr: np.ndarray, p_idx: np.ndarray, p_col: np.ndarray,
               cut_cols: np.ndarray) -> int:
    """The foreign-key column through which `child` references `parent` (its first such edge, skipping the task's
    cut columns when `skip_cut`: the anchor's edges the walk did not follow); -1 when no edge links them. The one
    scan behind a row's recency rank and its `arrival` (`batch.arrival_code`: 2 x this column, + 1 as a child)."""
    for e in range(p_ptr[child], p_ptr[child + 1]):
        if p_idx[e] == parent and not (skip_cut and is_cut(p_col[e], cut_cols)):
            return p_col[e]
    return -1


@njit(nogil=True, cache=True)
def recency_rank(r: int, parent: int, rt: int, obs: int, p_ptr: np.ndarray, p_idx: np.ndarray, p_col: np.ndarray,
                 seg_ptr: np.ndarray, seg_off: np.ndarray, seg_col: np.ndarray, c_time: np.ndarray) -> int:
    """How many rows referencing `parent` through the foreign key that links row `r` (time `rt`) to it have a
    time in (rt, obs]: 0 for the parent's latest child at the observation time (ties share a rank). Read from
    the parent's time-sorted per-foreign-key child segment; CHILD_RANK_UNKNOWN when no edge links them."""
    fk = linking_fk(r, parent, False, p_ptr, p_idx, p_col, p_col[:0])
    if fk < 0:
        return CHILD_RANK_UNKNOWN
    hi = obs if obs != NO_CUTOFF else NULL_TIME - 1  # without a cut-off: every child with a time
    for sg in range(seg_ptr[parent], seg_ptr[parent + 1]):
        if seg_col[sg] == fk:
            times = c_time[seg_off[sg] : seg_off[sg + 1]]
            n = np.searchsorted(times, hi, side="right") - np.searchsorted(times, rt, side="right")
            return min(max(n, 0), CHILD_RANK_MAX)
    return CHILD_RANK_UNKNOWN


@njit(nogil=True, cache=True)
def linearize_chunk(lo: int, hi: int, seq_len: int, sequences: tuple, visits: tuple, target: tuple, graph: tuple,
                    counts: tuple, segments: tuple, ages_on: bool, ranks_on: bool, cells: tuple) -> None:
    """Fill the cell tensors and the F->P edge list of sequences lo..hi-1 (outputs must hold their fill values).

    Groups as plain tuples (`confluence.sampler.groups`): reads `Sequences` (seed ids, observation times), the
    walk's `Visits` (rows, via, src, nrows), the task's `Target`, the `Graph`, the `Counts` (child counts and
    children's means) and the per-foreign-key `Segments` they and the recency ranks read; writes `Cells` and the `Visits` n_real, edges (the fk_adj edges as
    (r1 << 16) | r2, see `fill_adjacency`) and n_edges. `ages_on`: fill `row_age` (False: every cell
    ROW_AGE_UNKNOWN, e.g. a timestamp cell task); `ranks_on`: fill `child_rank` where `ages_on` (False: every
    cell CHILD_RANK_UNKNOWN, its cost saved)."""
    sq, vis, tgt, g, cn, sg_, out = Sequences(*sequences), Visits(*visits), Target(*target), Graph(*graph), \
        Counts(*counts), Segments(*segments), Cells(*cells)
    seed_ids, obs_times = sq.seed_ids, sq.obs
    rows, nrows, via, src, n_real, edges, n_edges = vis.rows, vis.nrows, vis.via, vis.src, vis.n_real, vis.edges, vis.n_edges
    target_stype, target_col, exclude_cols, cut_cols, obs_col = tgt.stype, tgt.col, tgt.exclude_cols, \
        tgt.cut_cols, tgt.obs_col
    tgt_f32, tgt_ts, tgt_u32, tgt_bits, tgt_valid, obs_ts = tgt.f32, tgt.ts, tgt.u32, tgt.bits, tgt.valid, \
        tgt.obs_ts
    tab_row_off, tab_col_ptr, tab_cols, col_stype, col_off, col_voff = g.tab_row_off, g.tab_col_ptr, g.tab_cols, \
        g.col_stype, g.col_off, g.col_voff
    num_pool, ts_pool, u32_pool, bool_bits, valid_bits = g.num_pool, g.ts_pool, g.u32_pool, g.bool_bits, \
        g.valid_bits
    p_ptr, p_idx, p_col, row_time = g.p_ptr, g.p_idx, g.p_col, g.row_time
    cnt_all_rows, cnt_tab_ptr, cnt_col, cnt_fk, cnt_window = cn.all_rows, cn.tab_ptr, cn.col, cn.fk, cn.window
    cnt_shown, cnt_mean, cnt_std = cn.shown, cn.mean, cn.std
    seg_ptr, seg_off, seg_col, c_time = sg_.seg_ptr, sg_.seg_off, sg_.seg_col, sg_.c_time
    semantic_types, column_ids, seq_row_ids, is_null = out.semantic_types, out.column_ids, out.seq_row_ids, \
        out.is_null
    numeric_values, timestamp_values, bool_values = out.numeric_values, out.timestamp_values, out.bool_values
    categorical_embed_ids, text_embed_ids, is_target = out.categorical_embed_ids, out.text_embed_ids, out.is_target
    is_padding, row_age, child_rank, arrival = out.is_padding, out.row_age, out.child_rank, out.arrival
    for b in range(lo, hi):
        nr = nrows[b]
        ne = 0
        hkeys, hvals, cap = row_map(rows, b, nr)  # sequence-local row map (global row -> local id)
        # the target cell
        sid = seed_ids[b]
        semantic_types[b, 0] = target_stype
        column_ids[b, 0] = target_col
        is_target[b, 0] = True
        if not bit(tgt_valid, 0, sid):
            is_null[b, 0] = True
        elif target_stype == _NUM:
            numeric_values[b, 0] = tgt_f32[sid]
        elif target_stype == _TS:
            for k in range(D_TIME):
                timestamp_values[b, 0, k] = tgt_ts[sid, k]
        elif target_stype == _BOOL:
            bool_values[b, 0] = bit(tgt_bits, 0, sid)
        else:
            categorical_embed_ids[b, 0] = tgt_u32[sid]
        pos = 1
        if obs_col >= 0 and pos < seq_len:
            # the observation time, a timestamp cell of the anchor row right after the target
            semantic_types[b, pos] = _TS
            column_ids[b, pos] = obs_col
            for k in range(D_TIME):
                timestamp_values[b, pos, k] = obs_ts[sid, k]
            pos += 1
        for i in range(nr):
            if pos >= seq_len:
                break
            r = rows[b, i]
            t = np.searchsorted(tab_row_off, r, side="right") - 1
            lr = r - tab_row_off[t]
            age = _UNKNOWN
            rt = row_time[r]
            if ages_on and obs_times[b] != NO_CUTOFF and rt != STATIC_TIME and rt != NULL_TIME:
                age = np.float32((obs_times[b] - rt) / US_PER_DAY)
            rank = _UNKNOWN_RANK
            if ranks_on and ages_on and via[b, i] == VIA_CHILD and rt != STATIC_TIME and rt != NULL_TIME:
                rank = recency_rank(r, rows[b, src[b, i]], rt, obs_times[b], p_ptr, p_idx, p_col, seg_ptr, seg_off,
                                    seg_col, c_time)
            arr = ARRIVAL_NONE  # batch.arrival_code of the key the row came in through
            if via[b, i] == VIA_PARENT:  # the row it came from references it
                fk = linking_fk(rows[b, src[b, i]], r, src[b, i] == 0, p_ptr, p_idx, p_col, cut_cols)
                arr = ARRIVAL_NONE if fk < 0 else 2 * fk
            elif via[b, i] == VIA_CHILD:  # it references the row it came from
                fk = linking_fk(r, rows[b, src[b, i]], False, p_ptr, p_idx, p_col, cut_cols)
                arr = ARRIVAL_NONE if fk < 0 else 2 * fk + 1
            for kk in range(tab_col_ptr[t], tab_col_ptr[t + 1]):
                if pos >= seq_len:
                    break
                c = tab_cols[kk]
                if i == 0:
                    if c == target_col:
                        continue
                    hidden = False
                    for e in range(exclude_cols.shape[0]):
                        if exclude_cols[e] == c:
                            hidden = True
                    if hidden:
                        continue
                s = col_stype[c]
                valid = bit(valid_bits, col_voff[c], lr)
                if s == _IDENT and not valid:
                    continue  # a NULL identifier (e.g. a NULL foreign key) has no cell
                semantic_types[b, pos] = s
                column_ids[b, pos] = c
                seq_row_ids[b, pos] = i
                row_age[b, pos] = age
                child_rank[b, pos] = rank
                arrival[b, pos] = arr
                if not valid:
                    is_null[b, pos] = True
                elif s == _NUM:
                    numeric_values[b, pos] = num_pool[col_off[c] + lr]
                elif s == _TS:
                    for k in range(D_TIME):
                        timestamp_values[b, pos, k] = ts_pool[col_off[c] + lr, k]
                elif s == _BOOL:
                    bool_values[b, pos] = bit(bool_bits, col_off[c], lr)
                elif s == _CAT:
                    categorical_embed_ids[b, pos] = u32_pool[col_off[c] + lr]
                elif s == _TEXT:
                    text_embed_ids[b, pos] = u32_pool[col_off[c] + lr]
                pos += 1
            # child-count cells: how many rows referenced this one through each foreign key at the observation
            # time (a time-sorted segment's prefix)
            k_end = cnt_tab_ptr[t + 1] if (cnt_all_rows or i == 0) else cnt_tab_ptr[t]
            for k in range(cnt_tab_ptr[t], k_end):
                if pos >= seq_len:
                    break
                if not cnt_shown[k]:
                    continue
                w = cnt_window[k]
                cnt = 0
                latest = STATIC_TIME  # the latest referencing row's time at the observation time (w < 0)
                for sg in range(seg_ptr[r], seg_ptr[r + 1]):
                    if seg_col[sg] == cnt_fk[k]:
                        seg_times = c_time[seg_off[sg] : seg_off[sg + 1]]
                        n_before = np.searchsorted(seg_times, obs_times[b], side="right")
                        cnt += n_before
                        if w > 0 and obs_times[b] != NO_CUTOFF:  # only those of (obs - w, obs]
                            cnt -= np.searchsorted(seg_times, obs_times[b] - w, side="right")
                        if n_before > 0 and seg_times[n_before - 1] > latest:
                            latest = seg_times[n_before - 1]
                semantic_types[b, pos] = _NUM
                column_ids[b, pos] = cnt_col[k]
                seq_row_ids[b, pos] = i
                row_age[b, pos] = age
                child_rank[b, pos] = rank
                arrival[b, pos] = arr
                if w > 0 and obs_times[b] == NO_CUTOFF:
                    is_null[b, pos] = True  # no observation time: no window to count in
                elif w < 0:  # the days since the latest: an age, so unknown where row ages are (`ages_on`)
                    if not ages_on or obs_times[b] == NO_CUTOFF or latest == STATIC_TIME or latest == NULL_TIME:
                        is_null[b, pos] = True
                    else:
                        days = np.float64(obs_times[b] - latest) / US_PER_DAY
                        numeric_values[b, pos] = (np.log1p(days) - cnt_mean[k]) / cnt_std[k]
                else:
                    numeric_values[b, pos] = (np.log1p(np.float64(cnt)) - cnt_mean[k]) / cnt_std[k]
                pos += 1
            # children's-mean cells that have a value, on the anchor row and the rows it references (the walk
            # budgets exactly these: `walk.mean_cell_count`)
            if cn.m_tab_ptr[t + 1] > cn.m_tab_ptr[t] and (i == 0 or (via[b, i] == VIA_PARENT and src[b, i] == 0)):
                shown_means = 0
                for k in range(cn.m_tab_ptr[t], cn.m_tab_ptr[t + 1]):
                    if pos >= seq_len or shown_means >= cn.m_cells:
                        break
                    if not cn.m_shown[k]:
                        continue
                    m, n_vals = child_mean(r, rows[b, 0], obs_times[b], k, cn, g, sg_, False)
                    if n_vals == 0:
                        continue  # no earlier referencing row with a value: no cell
                    semantic_types[b, pos] = _NUM
                    column_ids[b, pos] = cn.m_col[k]
                    seq_row_ids[b, pos] = i
                    row_age[b, pos] = age
                    child_rank[b, pos] = rank
                    arrival[b, pos] = arr
                    numeric_values[b, pos] = m
                    shown_means += 1
                    pos += 1
            # F->P edges between rows that are both in the sequence (each distinct pair once)
            row_first = ne
            for e in range(p_ptr[r], p_ptr[r + 1]):
                p = p_idx[e]
                if i == 0 and is_cut(p_col[e], cut_cols):
                    continue  # no anchor -> parent edge through an excluded foreign key, even if reached otherwise
                loc = local_row(hkeys, hvals, cap, p)
                if loc >= 0:
                    code = (i << 16) | loc
                    dup = False
                    for q in range(row_first, ne):
                        if edges[b, q] == code:
                            dup = True
                    if not dup:
                        edges[b, ne] = code
                        ne += 1
        n_real[b] = pos
        n_edges[b] = ne
        for j in range(pos, seq_len):
            is_padding[b, j] = True


@njit(nogil=True, cache=True)
def fill_adjacency(edges: np.ndarray, n_edges: np.ndarray, fk_adj: np.ndarray) -> None:
    """fk_adj[b, r1, r2] = True for every edge (r1 << 16) | r2 of sequence b."""
    for b in range(n_edges.shape[0]):
        for k in range(n_edges[b]):
            fk_adj[b, edges[b, k] >> 16, edges[b, k] & 0xFFFF] = True
