"""Labelled task rows in the context (in-context learning; docs/design/sampler.md, "Labelled context").

A task's `(anchor, observation time, target)` tuples become rows a context can hold: the target as a visible cell
of the task's own column (the column id of the hidden target cell, so column attention links the query with the
labels), the observation-time cell of a derived task, and an edge to the label's anchor row when that row is in
the context (else to those of its parents that are). A label is known from its **label time**: observation time + the task's `horizon` for a derived task
(its query looks that far ahead), the row's own time for a cell-masking task (always, for a static table).

For each seed, up to `sampler.labels` labels are chosen, in this order: the anchor's own earlier labels (latest
first); the latest label of each other anchor the walk reached; with `sampler.label_match` = m, up to m labels of
rows sharing a value with the anchor row (matches: `match_columns`, the most distinct values first, drawn among
that value's most recent labels); labels of anchors sharing a parent with
the seed's anchor (siblings); then labels drawn at random among the task's most recent ones (all of a static
table's). Never
the seed's own label (same seed, or same anchor and observation time; for a cell-masking task, any label of the
seed's own row), never a label whose label time is after the seed's observation time, and only labels of the
splits a phase may read (`CONTEXT_SPLITS`): training and validation contexts read train labels, test contexts
train and validation labels, predictions for new anchors every label. A cell-masking task's label of a row already in the context is skipped (its cell is already there).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numba import njit

from confluence.batch import ROW_AGE_UNKNOWN
from confluence.errors import ConfluenceError
from confluence.sampler.groups import Cells, Graph, Labels, Segments, Sequences, Target, Visits
from confluence.sampler.linearize import local_row, row_map
from confluence.sampler.rng import below
from confluence.sampler.walk import is_cut
from confluence.schema.metadata import parse_horizon
from confluence.store.format import NO_CUTOFF, NULL_TIME, STATIC_TIME
from confluence.stypes import D_TIME, US_PER_DAY, SemanticType

VIA_LABEL = 3  # `BuildResult.via` of a labelled task row
# which splits' labels a context of each phase may hold ("training": the training stream's batches, the only
# contexts that `labels_off` and `relabel` change; "train": evaluating or predicting the train split; "all":
# predictions for anchors outside the task's seeds)
TRAINING_CONTEXT = "training"
CONTEXT_SPLITS = {TRAINING_CONTEXT: ("train",), "train": ("train",), "val": ("train",), "test": ("train", "val"),
                  "all": ("train", "val", "test")}
_SCAN = 16  # candidates scanned per wanted label in the sibling and recent phases (bounds the work per sequence)
MATCH_COLUMNS = 3  # columns a label may be matched on (`match_columns`), the most distinct values first
_EMPTY_I64 = np.zeros(0, dtype=np.int64)

_NUM = int(SemanticType.NUMERICAL)
_TS = int(SemanticType.TIMESTAMP)
_BOOL = int(SemanticType.BOOLEAN)
_CAT = int(SemanticType.CATEGORICAL)
_UNKNOWN_AGE = np.float32(ROW_AGE_UNKNOWN)


def task_horizon(store: Any, task: str) -> int | None:
    """The horizon (µs) the metadata of `task` declares; 0 for a derived task without an observation-time column
    (a function of its anchor row, observed at the row's time: its label is known then, as a cell's); None when a
    task with an observation time declares none."""
    meta = getattr(store, "meta", None)
    tasks = ((meta or {}).get("database") or {}).get("tasks") or {}
    spec = tasks.get(task) or {}
    text = spec.get("horizon")
    if text is None and spec and not spec.get("observation_time_column"):
        return 0
    return None if text is None else parse_horizon(text)


def label_times(obs_time: np.ndarray, is_derived: bool, horizon_us: int | None, task: str) -> np.ndarray:
    """When each tuple's label became known: observation time + horizon (derived; saturating), the observation
    time (cell masking: the row's own time), or always (a static table's row: STATIC_TIME)."""
    obs = np.asarray(obs_time, dtype=np.int64)
    if not is_derived:
        return np.where(obs == NO_CUTOFF, STATIC_TIME, obs).astype(np.int64)
    if horizon_us is None:
        raise ConfluenceError(
            f"task {task!r} is a derived task without a horizon: labelled context (sampler.labels > 0) must know "
            "when its labels become known. Add \"horizon\": \"30 days\" (how far its query looks past the "
            "observation time; \"0 seconds\" if its target is known at the observation time) to the task in the "
            "metadata and preprocess again, or set sampler.labels=0")
    big = np.iinfo(np.int64).max - horizon_us
    return np.where(obs >= big, NO_CUTOFF, obs + horizon_us).astype(np.int64)


@dataclass(frozen=True)
class LabelIndex:
    """The labels one phase's contexts may read for one task, indexed by anchor and by label time (the numba
    kernels' inputs). Values come from the task's own target arrays (`TaskData`), by seed index."""

    is_cell: bool
    a_lo: int  # first global row of the anchor table
    a_ptr: np.ndarray  # i64[n_anchor_rows + 1]: each anchor row's labels in a_ids
    a_ids: np.ndarray  # i64: pool seeds sorted by (anchor row, label time, seed)
    a_lt: np.ndarray  # i64: their label times
    t_ids: np.ndarray  # i64: pool seeds sorted by (label time, seed)
    t_lt: np.ndarray  # i64
    label_time: np.ndarray  # i64[n]: every seed's label time
    anchor_row: np.ndarray  # i64[n]
    obs_time: np.ndarray  # i64[n]
    tgt_f32: np.ndarray
    tgt_ts: np.ndarray
    tgt_u32: np.ndarray
    tgt_bits: np.ndarray
    tgt_valid: np.ndarray
    obs_ts: np.ndarray
    # matches (`sampler.label_match`): per matched column j, the anchor table's rows' values (-1: NULL) and the pool
    # sorted by (value, label time, seed) in m_ids[m_off[j]:m_off[j + 1]]; no columns: no matches
    m_cols: np.ndarray = field(default_factory=lambda: _EMPTY_I64)  # i64[J]: global column ids
    m_row_val: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))  # i64[J, n_anchor_rows]
    m_off: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))  # i64[J + 1]
    m_ids: np.ndarray = field(default_factory=lambda: _EMPTY_I64)
    m_val: np.ndarray = field(default_factory=lambda: _EMPTY_I64)
    m_lt: np.ndarray = field(default_factory=lambda: _EMPTY_I64)


def match_columns(data: Any, task: Any, table: int, limit: int = MATCH_COLUMNS) -> list[tuple[int, np.ndarray]]:
    """The anchor table's columns a label may be matched on, with each row's value (-1: NULL): its categorical
    columns, and on a static table also its numbers that repeat (at most half as many distinct values as values:
    seats, a year of make), whose equality there says the rows share a specification; on a temporal table equal
    measurements (a pressure, a departure time) are coincidences of time, and its labels have the time's own
    neighbours (siblings). Visible on the anchor row (neither the target nor an excluded column), at least two
    distinct values, the most distinct values first (a shared rare value says more), at most `limit`. `data` is
    the database's `SamplerData`."""
    r0, r1 = int(data.tab_row_off[table]), int(data.tab_row_off[table + 1])
    n = r1 - r0
    static = bool(np.all(np.asarray(data.row_time[r0:r1]) == STATIC_TIME))
    if n == 0:
        return []
    cut = set(int(c) for c in np.asarray(task.cut_cols).tolist())
    found: list[tuple[int, int, np.ndarray]] = []
    for c in np.asarray(data.tab_cols[data.tab_col_ptr[table]: data.tab_col_ptr[table + 1]]).tolist():
        stype = int(data.col_stype[c])
        if not (stype == _CAT or (stype == _NUM and static)) or c in cut:
            continue
        off, voff = int(data.col_off[c]), int(data.col_voff[c])
        valid = np.unpackbits(data.valid_bits[voff: voff + (n + 7) // 8], bitorder="little")[:n].astype(bool)
        if stype == _CAT:
            raw = np.asarray(data.u32_pool[off: off + n], dtype=np.int64)
        else:  # a number's bits: equal numbers match (seats, a year); a continuous column rarely repeats
            raw = np.asarray(data.num_pool[off: off + n], dtype=np.float32).view(np.uint32).astype(np.int64)
        vals = np.where(valid, raw, -1)
        distinct = int(np.unique(vals[valid]).size)
        if 2 <= distinct and (stype == _CAT or distinct <= int(valid.sum()) // 2):
            found.append((distinct, c, vals))
    found.sort(key=lambda x: (-x[0], x[1]))
    return [(c, vals) for _, c, vals in found[:limit]]


def with_matches(index: LabelIndex, columns: list[tuple[int, np.ndarray]]) -> LabelIndex:
    """`index` able to match labels on `columns` (`match_columns`): the pool sorted per column by (value, label
    time, seed)."""
    if not columns:
        return index
    pool = index.t_ids
    lt = index.label_time[pool]
    rows = index.anchor_row[pool] - index.a_lo
    ids, val, times, off = [], [], [], [0]
    for _, vals in columns:
        v = vals[rows]
        keep = v >= 0
        p, v, t = pool[keep], v[keep], lt[keep]
        order = np.lexsort((p, t, v))
        ids.append(p[order])
        val.append(v[order])
        times.append(t[order])
        off.append(off[-1] + int(order.size))
    return replace(index, m_cols=np.array([c for c, _ in columns], dtype=np.int64),
                   m_row_val=np.ascontiguousarray(np.stack([v for _, v in columns])),
                   m_off=np.array(off, dtype=np.int64), m_ids=np.concatenate(ids), m_val=np.concatenate(val),
                   m_lt=np.concatenate(times))


def build_label_index(task: Any, pool: np.ndarray, label_time: np.ndarray, tab_row_off: np.ndarray) -> LabelIndex:
    """The index of `pool` (seed indices of `task`, a `TaskData`) with precomputed `label_time` per seed."""
    anchor = np.asarray(task.anchor_row, dtype=np.int64)
    pool = np.asarray(pool, dtype=np.int64)
    if anchor.shape[0]:
        t = int(np.searchsorted(tab_row_off, anchor[0], side="right") - 1)
    else:
        t = 0
    a_lo, a_hi = int(tab_row_off[t]), int(tab_row_off[t + 1])
    lt = label_time[pool]
    by_anchor = pool[np.lexsort((pool, lt, anchor[pool]))]
    counts = np.bincount(anchor[by_anchor] - a_lo, minlength=a_hi - a_lo)
    a_ptr = np.zeros(a_hi - a_lo + 1, dtype=np.int64)
    np.cumsum(counts, out=a_ptr[1:])
    by_time = pool[np.lexsort((pool, lt))]
    return LabelIndex(
        is_cell=not bool(task.is_derived), a_lo=a_lo, a_ptr=a_ptr, a_ids=by_anchor, a_lt=label_time[by_anchor],
        t_ids=by_time, t_lt=label_time[by_time], label_time=label_time, anchor_row=anchor,
        obs_time=np.asarray(task.obs_time, dtype=np.int64), tgt_f32=task.tgt_f32, tgt_ts=task.tgt_ts,
        tgt_u32=task.tgt_u32, tgt_bits=task.tgt_bits, tgt_valid=task.tgt_valid, obs_ts=task.obs_ts,
    )


@njit(nogil=True, cache=True, inline="always")
def _chosen(out: np.ndarray, b: int, n: int, s: int) -> bool:
    for q in range(n):
        if out[b, q] == s:
            return True
    return False


@njit(nogil=True, cache=True, inline="always")
def _allowed(s: int, b: int, own_seed: np.ndarray, anchors: np.ndarray, obs: np.ndarray, lab_anchor: np.ndarray,
             lab_obs: np.ndarray, is_cell: bool, hkeys: np.ndarray, hvals: np.ndarray, cap: int) -> bool:
    """Not the seed's own label, and for a cell-masking task not a row already in the context."""
    if s == own_seed[b]:
        return False
    a = lab_anchor[s]
    if a == anchors[b] and (is_cell or lab_obs[s] == obs[b]):
        return False
    if is_cell and local_row(hkeys, hvals, cap, a) >= 0:
        return False
    return True


@njit(nogil=True, cache=True, inline="always")
def _latest(a: int, obs_b: int, a_lo: int, a_ptr: np.ndarray, a_ids: np.ndarray, a_lt: np.ndarray) -> int:
    """Position in a_ids of anchor row `a`'s latest label known at `obs_b`, -1 for none."""
    li = a - a_lo
    if li < 0 or li >= a_ptr.shape[0] - 1:
        return -1
    lo, hi = a_ptr[li], a_ptr[li + 1]
    j = lo + np.searchsorted(a_lt[lo:hi], obs_b, side="right") - 1
    return j if j >= lo else -1


@njit(nogil=True, cache=True, inline="always")
def _draw_recent(ids: np.ndarray, lt: np.ndarray, lo: int, hi: int, w: int, want: int, st: np.ndarray,
                 out: np.ndarray, b: int, n: int, k: int, own_seed: np.ndarray, anchors: np.ndarray, obs: np.ndarray,
                 lab_anchor: np.ndarray, lab_obs: np.ndarray, is_cell: bool, hkeys: np.ndarray, hvals: np.ndarray,
                 cap: int) -> int:
    """Draw up to `want` allowed labels at random (stream `st`) among ids[lo:hi], sorted by label time `lt`: the
    latest `w` and those tied in time with the oldest of them; at most _SCAN x k tries. Returns the new count n."""
    window = min(hi - lo, w)
    if window > 0:
        window = hi - (lo + np.searchsorted(lt[lo:hi], lt[hi - window], side="left"))
    budget = _SCAN * k
    got = 0
    while window > 0 and budget > 0 and got < want and n < k:
        budget -= 1
        s = ids[hi - 1 - below(st, window)]
        if not _chosen(out, b, n, s) and _allowed(s, b, own_seed, anchors, obs, lab_anchor, lab_obs, is_cell,
                                                  hkeys, hvals, cap):
            out[b, n] = s
            n += 1
            got += 1
    return n


@njit(nogil=True, cache=True)
def choose_labels_chunk(lo: int, hi: int, k: int, m_quota: int, sequences: tuple, visits: tuple, labels: tuple,
                        graph: tuple, target: tuple, segments: tuple, out: np.ndarray, n_out: np.ndarray) -> None:
    """Choose up to k labels per sequence lo..hi-1 (module doc: own, reached, matches, siblings, recent) into
    `out` (i64[B, k]: label seeds, -1: none) and `n_out` (i32[B]); at most `m_quota` matches
    (`sampler.label_match`).

    Groups as plain tuples (`confluence.sampler.groups`): `Sequences` (anchors, observation times, own seeds, and
    the random states after the walk, which the match and recent draws advance), the walk's `Visits`, the
    `Labels`, the `Graph`'s parent edges, `Target.cut_cols` (the task's excluded / target columns: no sibling
    through them, they could give it away) and the `Segments`."""
    sq, vis, lab, g, sg_ = Sequences(*sequences), Visits(*visits), Labels(*labels), Graph(*graph), Segments(*segments)
    cut_cols = Target(*target).cut_cols
    anchors, obs, own_seed, states = sq.anchors, sq.obs, sq.own, sq.states
    rows, nrows = vis.rows, vis.nrows
    is_cell, a_lo, a_ptr, a_ids, a_lt, t_ids, t_lt = lab.is_cell, lab.a_lo, lab.a_ptr, lab.a_ids, lab.a_lt, \
        lab.t_ids, lab.t_lt
    lab_anchor, lab_obs = lab.anchor_row, lab.obs_time
    m_row_val, m_off, m_ids, m_val, m_lt = lab.m_row_val, lab.m_off, lab.m_ids, lab.m_val, lab.m_lt
    p_ptr, p_idx, p_col = g.p_ptr, g.p_idx, g.p_col
    seg_ptr, seg_off, c_idx, c_time = sg_.seg_ptr, sg_.seg_off, sg_.c_idx, sg_.c_time
    st = np.empty(1, dtype=np.uint64)
    a_hi = a_lo + a_ptr.shape[0] - 1
    for b in range(lo, hi):
        nr = nrows[b]
        hkeys, hvals, cap = row_map(rows, b, nr)
        n = 0
        ob = obs[b]
        st[0] = states[b]
        # 1) the anchor's own earlier labels, latest first
        j = _latest(anchors[b], ob, a_lo, a_ptr, a_ids, a_lt)
        li = anchors[b] - a_lo
        first = a_ptr[li] if 0 <= li < a_ptr.shape[0] - 1 else 0
        while j >= first and j >= 0 and n < k:
            s = a_ids[j]
            if _allowed(s, b, own_seed, anchors, obs, lab_anchor, lab_obs, is_cell, hkeys, hvals, cap):
                out[b, n] = s
                n += 1
            j -= 1
        # 2) the latest label of each anchor the walk reached (a derived task's labels are not in their rows)
        if not is_cell:
            for i in range(1, nr):
                if n >= k:
                    break
                r = rows[b, i]
                if r < a_lo or r >= a_hi:
                    continue
                j = _latest(r, ob, a_lo, a_ptr, a_ids, a_lt)
                if j >= 0:
                    s = a_ids[j]
                    if not _chosen(out, b, n, s) and _allowed(s, b, own_seed, anchors, obs, lab_anchor, lab_obs,
                                                              is_cell, hkeys, hvals, cap):
                        out[b, n] = s
                        n += 1
        # 2b) matches: labels of rows sharing a value with the anchor row (`match_columns`), drawn among that value's
        # 2 x k most recent labels known at the observation time and those tied with the oldest of them (a static
        # table's all tie); the columns with the most distinct values first
        taken = 0
        la = anchors[b] - a_lo
        n_cols = m_off.shape[0] - 1 if 0 <= la < m_row_val.shape[1] else 0
        for jc in range(n_cols):
            if taken >= m_quota or n >= k:
                break
            v = m_row_val[jc, la]
            if v < 0:
                continue
            c0 = m_off[jc]
            c1 = m_off[jc + 1]
            v0 = c0 + np.searchsorted(m_val[c0:c1], v, side="left")
            v1 = c0 + np.searchsorted(m_val[c0:c1], v, side="right")
            t1 = v0 + np.searchsorted(m_lt[v0:v1], ob, side="right")
            before = n
            n = _draw_recent(m_ids, m_lt, v0, t1, 2 * k, m_quota - taken, st, out, b, n, k, own_seed, anchors, obs,
                             lab_anchor, lab_obs, is_cell, hkeys, hvals, cap)
            taken += n - before
        # 3) siblings: anchors sharing a parent with the seed's anchor, latest children first (never through an
        # excluded foreign key: siblings through it would tell the hidden parent, e.g. a flight's carrier)
        a = anchors[b]
        for e in range(p_ptr[a], p_ptr[a + 1]):
            if n >= k:
                break
            if is_cut(p_col[e], cut_cols):
                continue
            p = p_idx[e]
            for sg in range(seg_ptr[p], seg_ptr[p + 1]):
                c0 = seg_off[sg]
                c1 = c0 + np.searchsorted(c_time[c0: seg_off[sg + 1]], ob, side="right")
                budget = _SCAN * k
                q = c1 - 1
                while q >= c0 and budget > 0 and n < k:
                    budget -= 1
                    ch = c_idx[q]
                    q -= 1
                    if ch < a_lo or ch >= a_hi or ch == a:
                        continue
                    j = _latest(ch, ob, a_lo, a_ptr, a_ids, a_lt)
                    if j < 0:
                        continue
                    s = a_ids[j]
                    if not _chosen(out, b, n, s) and _allowed(s, b, own_seed, anchors, obs, lab_anchor, lab_obs,
                                                              is_cell, hkeys, hvals, cap):
                        out[b, n] = s
                        n += 1
        # 4) labels drawn at random among the task's _SCAN * k most recent ones known at the observation time, and
        # those tied in time with the oldest of them (a fixed latest few would show every sequence the same labels,
        # e.g. on a static table, where all labels tie)
        j = np.searchsorted(t_lt, ob, side="right")
        n = _draw_recent(t_ids, t_lt, 0, j, _SCAN * k, k, st, out, b, n, k, own_seed, anchors, obs, lab_anchor,
                         lab_obs, is_cell, hkeys, hvals, cap)
        n_out[b] = n


@njit(nogil=True, cache=True)
def append_labels_chunk(lo: int, hi: int, seq_len: int, sequences: tuple, ages_on: bool, target: tuple,
                        labels: tuple, graph: tuple, chosen: np.ndarray, n_chosen: np.ndarray, visits: tuple,
                        cells: tuple) -> None:
    """Append the chosen labels (`chosen` i64[B, k], `n_chosen` i32[B]) as rows after the walk's cells: the
    visible target cell (the task's column), the observation-time cell (a task with one), an edge to the label's
    anchor row when it is in the context, else to the anchor's parents that are (a sibling's label hangs from the
    parent it shares with the seed's anchor).

    Groups as plain tuples (`confluence.sampler.groups`): `Sequences` (observation times), the task's `Target`
    (the cell's type and columns), the `Labels` (their anchors, times and values), the `Graph`'s parent edges;
    extends the `Visits` (rows, n_real, edges) and writes `Cells`."""
    sq, tgt, lab, g, vis, out = Sequences(*sequences), Target(*target), Labels(*labels), Graph(*graph), \
        Visits(*visits), Cells(*cells)
    obs = sq.obs
    target_stype, target_col, obs_col = tgt.stype, tgt.col, tgt.obs_col
    lab_anchor, label_time, obs_ts = lab.anchor_row, lab.label_time, lab.obs_ts
    tgt_f32, tgt_ts, tgt_u32, tgt_bits, tgt_valid = lab.f32, lab.ts, lab.u32, lab.bits, lab.valid
    p_ptr, p_idx = g.p_ptr, g.p_idx
    rows, hops, via, src, nrows = vis.rows, vis.hops, vis.via, vis.src, vis.nrows
    n_real, edges, n_edges = vis.n_real, vis.edges, vis.n_edges
    semantic_types, column_ids, seq_row_ids, is_null = out.semantic_types, out.column_ids, out.seq_row_ids, \
        out.is_null
    numeric_values, timestamp_values, bool_values = out.numeric_values, out.timestamp_values, out.bool_values
    categorical_embed_ids, is_padding, row_age = out.categorical_embed_ids, out.is_padding, out.row_age
    for b in range(lo, hi):
        nr = nrows[b]
        hkeys, hvals, cap = row_map(rows, b, nr)
        pos = n_real[b]
        ne = n_edges[b]
        for j in range(n_chosen[b]):
            s = chosen[b, j]
            li = nr + j
            a = lab_anchor[s]
            loc = local_row(hkeys, hvals, cap, a)
            rows[b, li] = a
            hops[b, li] = 0
            via[b, li] = VIA_LABEL
            src[b, li] = loc
            age = _UNKNOWN_AGE
            lt = label_time[s]
            if ages_on and obs[b] != NO_CUTOFF and lt != STATIC_TIME and lt != NULL_TIME and lt != NO_CUTOFF:
                age = np.float32((obs[b] - lt) / US_PER_DAY)
            semantic_types[b, pos] = target_stype
            column_ids[b, pos] = target_col
            seq_row_ids[b, pos] = li
            row_age[b, pos] = age
            is_padding[b, pos] = False
            if not (tgt_valid[s >> 3] >> (s & 7)) & 1:
                is_null[b, pos] = True
            elif target_stype == _NUM:
                numeric_values[b, pos] = tgt_f32[s]
            elif target_stype == _TS:
                for q in range(D_TIME):
                    timestamp_values[b, pos, q] = tgt_ts[s, q]
            elif target_stype == _BOOL:
                bool_values[b, pos] = (tgt_bits[s >> 3] >> (s & 7)) & 1 == 1
            else:
                categorical_embed_ids[b, pos] = tgt_u32[s]
            pos += 1
            if obs_col >= 0:
                semantic_types[b, pos] = _TS
                column_ids[b, pos] = obs_col
                seq_row_ids[b, pos] = li
                row_age[b, pos] = age
                is_padding[b, pos] = False
                for q in range(D_TIME):
                    timestamp_values[b, pos, q] = obs_ts[s, q]
                pos += 1
            if loc >= 0:
                edges[b, ne] = (li << 16) | loc
                ne += 1
            else:  # the anchor is not in the context: link the label to the anchor's parents that are
                for e in range(p_ptr[a], p_ptr[a + 1]):
                    pl = local_row(hkeys, hvals, cap, p_idx[e])
                    if pl >= 0:
                        code = (li << 16) | pl
                        if not _chosen(edges, b, ne, code):
                            edges[b, ne] = code
                            ne += 1
        nrows[b] = nr + n_chosen[b]
        n_real[b] = pos
        n_edges[b] = ne
        for q in range(pos, seq_len):
            is_padding[b, q] = True
