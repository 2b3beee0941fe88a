"""The three attention permutations of seed 000 section 4 (numba, nogil), padding always last.

* `col_perm`: cells grouped by global column id (ascending; with `tile > 0` possibly another order of the groups,
  below), original order within a column (a stable counting sort, O(S + distinct columns)).
* `out_perm` / `in_perm`: cells grouped by row, rows in Cuthill-McKee order of the symmetrized row graph, so
  the outbound (`I + fk_adj`) and inbound (`fk_adj^T`) masks keep their non-zeros near the diagonal. The two
  orders differ in where each component starts and how ties break: outbound starts from rows with the fewest
  parents (dimension rows, followed by the rows pointing at them), inbound from rows with the fewest children.
  The forward order is kept (its reverse has the same bandwidth and reads less naturally).

With `tile > 0` (the default, `SamplerConfig.perm_tile`) the orders are chosen by what the block-sparse kernel's
work follows, the `tile` x `tile` tiles a mask visits. `col_perm` orders the column groups to fill tile after tile
(the largest group that fits the room left, `_pack_groups`) when that visits fewer tiles than ascending ids. Each of
the two row orders is the candidate whose mask visits the fewest tiles: the Cuthill-McKee order above, the walk's
own row order, the walk's order with each row followed by its parents that fewer than h rows point at (h = 1..4;
rows with more children first), and the rows with children first (fewest children first, or in the walk's order
with the leaves grouped by their lowest parent). Ties keep Cuthill-McKee, so the result never visits more tiles
than seed 000's order. `tile = 0` is seed 000's orders alone.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from confluence.sampler.groups import Cells, Visits


@njit(nogil=True, cache=True)
def _cuthill_mckee(nbr_ptr: np.ndarray, nbr: np.ndarray, key: np.ndarray, n: int, order: np.ndarray) -> None:
    """Cuthill-McKee over nodes 0..n-1 (CSR neighbours); components start at the smallest `key`."""
    seen = np.zeros(n, dtype=np.bool_)
    head = 0
    tail = 0
    while tail < n:
        start = -1
        for i in range(n):
            if not seen[i] and (start < 0 or key[i] < key[start]):
                start = i
        seen[start] = True
        order[tail] = start
        tail += 1
        while head < tail:
            u = order[head]
            head += 1
            first = tail
            for e in range(nbr_ptr[u], nbr_ptr[u + 1]):
                v = nbr[e]
                if not seen[v]:
                    seen[v] = True
                    # insertion by key keeps the newly found neighbours sorted
                    j = tail
                    while j > first and key[order[j - 1]] > key[v]:
                        order[j] = order[j - 1]
                        j -= 1
                    order[j] = v
                    tail += 1


@njit(nogil=True, cache=True)
def _follow_parents(
    par_ptr: np.ndarray, par: np.ndarray, n_chi: np.ndarray, nr: int, hub_min: int, stack: np.ndarray,
    order: np.ndarray,
) -> None:
    """Rows with >= `hub_min` children first (by id), then every other row in id order, each followed (depth
    first) by its not yet placed parents that are not such hubs: a row's own parents land beside it."""
    placed = np.zeros(nr, dtype=np.bool_)
    t = 0
    for r in range(nr):
        if n_chi[r] >= hub_min:
            placed[r] = True
            order[t] = r
            t += 1
    for x in range(nr):
        if placed[x]:
            continue
        sp = 0
        stack[sp] = x
        sp += 1
        while sp > 0:
            sp -= 1
            u = stack[sp]
            if placed[u]:
                continue
            placed[u] = True
            order[t] = u
            t += 1
            for e in range(par_ptr[u + 1] - 1, par_ptr[u] - 1, -1):  # reversed: the lowest id comes out first
                v = par[e]
                if not placed[v] and n_chi[v] < hub_min:
                    stack[sp] = v
                    sp += 1


@njit(nogil=True, cache=True)
def _csr(edges_b: np.ndarray, ne: int, counts: np.ndarray, nr: int, both: bool) -> tuple[np.ndarray, np.ndarray]:
    """CSR of the row graph from the edge list (child << 16 | parent; self-edges left out), in edge order: each row's
    parents (`both=False`, `counts` = parents per row), or its parents and children (`both=True`, `counts` = both)."""
    ptr = np.zeros(nr + 1, dtype=np.int64)
    for i in range(nr):
        ptr[i + 1] = ptr[i] + counts[i]
    out = np.empty(ptr[nr], dtype=np.int64)
    fill = ptr[:nr].copy()
    for k in range(ne):
        i = edges_b[k] >> 16
        j = edges_b[k] & 0xFFFF
        if i == j:
            continue
        out[fill[i]] = j
        fill[i] += 1
        if both:
            out[fill[j]] = i
            fill[j] += 1
    return ptr, out


@njit(nogil=True, cache=True)
def _row_candidates(edges_b: np.ndarray, ne: int, n_par: np.ndarray, n_chi: np.ndarray, nr: int) -> np.ndarray:
    """[7, nr] row orders to weigh against Cuthill-McKee (module docstring): the walk's order; the walk's order
    following parents, rows with at least h = 1..4 children first; rows with children first, fewest children first,
    then the leaves; rows with children first, then the leaves grouped by their lowest parent."""
    par_ptr, par = _csr(edges_b, ne, n_par, nr, False)
    for i in range(nr):
        par[par_ptr[i]:par_ptr[i + 1]] = np.sort(par[par_ptr[i]:par_ptr[i + 1]])
    cands = np.empty((7, nr), dtype=np.int64)
    for i in range(nr):
        cands[0, i] = i
    stack = np.empty(nr + ne + 1, dtype=np.int64)
    for h in range(4):
        _follow_parents(par_ptr, par, n_chi, nr, h + 1, stack, cands[h + 1])
    big = nr + 1
    kb = np.empty(nr, dtype=np.int64)
    kc = np.empty(nr, dtype=np.int64)
    for i in range(nr):
        if n_chi[i] > 0:
            kb[i] = n_chi[i] * big + i
            kc[i] = i
        else:
            kb[i] = big * big + i
            low = par[par_ptr[i]] if par_ptr[i + 1] > par_ptr[i] else -1
            kc[i] = (low + 2) * big + i
    cands[5] = np.argsort(kb)
    cands[6] = np.argsort(kc)
    return cands


@njit(nogil=True, cache=True)
def _mark_tiles(a0: int, a1: int, c0: int, c1: int, n_tiles: int, stamp: np.ndarray, sid: int) -> int:
    """Mark the tiles (a0..a1) x (c0..c1) as visited in this count (`stamp == sid`); returns how many were new."""
    new = 0
    for a in range(a0, a1 + 1):
        for c in range(c0, c1 + 1):
            idx = a * n_tiles + c
            if stamp[idx] != sid:
                stamp[idx] = sid
                new += 1
    return new


@njit(nogil=True, cache=True)
def _visited_tiles(
    order: np.ndarray, cells: np.ndarray, nr: int, edges_b: np.ndarray, ne: int, inbound: bool, tile: int,
    n_tiles: int, stamp: np.ndarray, sid: int, first: np.ndarray, last: np.ndarray,
) -> int:
    """Tiles of `tile` x `tile` positions that hold at least one visible pair when the rows' cells are grouped in
    `order`: outbound sees the row itself and its parents (I + fk_adj), inbound its children (fk_adj^T)."""
    pos = 0
    for k in range(nr):
        r = order[k]
        first[r] = pos // tile
        last[r] = (pos + cells[r] - 1) // tile
        pos += cells[r]
    count = 0
    n_pairs = ne if inbound else nr + ne
    for k in range(n_pairs):
        if k < ne:
            i = edges_b[k] >> 16
            j = edges_b[k] & 0xFFFF
            q, kk = (j, i) if inbound else (i, j)
        else:
            q = k - ne
            kk = q
        if cells[q] == 0 or cells[kk] == 0:
            continue
        count += _mark_tiles(first[q], last[q], first[kk], last[kk], n_tiles, stamp, sid)
    return count


@njit(nogil=True, cache=True)
def _pack_groups(sizes: np.ndarray, nd: int, tile: int, out: np.ndarray) -> None:
    """An order of the column groups that fills tile after tile: the largest group that fits the room left in the
    current tile, else the largest left (it straddles); ties to the lower column id."""
    used = np.zeros(nd, dtype=np.bool_)
    room = tile
    for t in range(nd):
        best = -1
        for k in range(nd):
            if not used[k] and sizes[k] <= room and (best < 0 or sizes[k] > sizes[best]):
                best = k
        if best < 0:
            for k in range(nd):
                if not used[k] and (best < 0 or sizes[k] > sizes[best]):
                    best = k
        used[best] = True
        out[t] = best
        room = (room - sizes[best]) % tile
        if room <= 0:
            room += tile


@njit(nogil=True, cache=True)
def _group_tiles(
    order: np.ndarray, sizes: np.ndarray, nd: int, tile: int, n_tiles: int, stamp: np.ndarray, sid: int
) -> int:
    """Tiles the column mask visits with its groups contiguous in `order`: each group's square of tiles."""
    pos = 0
    count = 0
    for k in range(nd):
        g = order[k]
        lo = pos // tile
        hi = (pos + sizes[g] - 1) // tile
        pos += sizes[g]
        count += _mark_tiles(lo, hi, lo, hi, n_tiles, stamp, sid)
    return count


@njit(nogil=True, cache=True)
def _group_rows(rows_of: np.ndarray, n_real: int, nr: int, rank: np.ndarray, out: np.ndarray) -> None:
    """Permutation that groups cells by row, rows by `rank`, padding last."""
    start = np.zeros(nr + 1, dtype=np.int64)
    for p in range(n_real):
        start[rank[rows_of[p]] + 1] += 1
    for k in range(nr):
        start[k + 1] += start[k]
    for p in range(n_real):
        k = rank[rows_of[p]]
        out[start[k]] = p
        start[k] += 1
    for p in range(n_real, out.shape[0]):
        out[p] = p


@njit(nogil=True, cache=True)
def perms_chunk(lo: int, hi: int, visits: tuple, num_columns: int, tile: int, cells: tuple) -> None:
    """Fill the `Cells` col_perm, out_perm and in_perm of sequences lo..hi-1 from their column ids, row ids and the
    `Visits` edge list (groups as plain tuples: `confluence.sampler.groups`); with `tile > 0` each row order is the
    candidate whose mask visits the fewest tiles (module docstring)."""
    vis, c_ = Visits(*visits), Cells(*cells)
    column_ids, seq_row_ids, col_perm, out_perm, in_perm = c_.column_ids, c_.seq_row_ids, c_.col_perm, \
        c_.out_perm, c_.in_perm
    n_real, nrows, edges, n_edges = vis.n_real, vis.nrows, vis.edges, vis.n_edges
    s_len = column_ids.shape[1]
    n_tiles = (s_len + tile - 1) // tile if tile > 0 else 1
    stamp = np.zeros(n_tiles * n_tiles, dtype=np.int64)
    sid = 0
    cnt = np.zeros(num_columns + 1, dtype=np.int64)
    distinct = np.empty(s_len, dtype=np.int64)
    for b in range(lo, hi):
        n = n_real[b]
        # --- col_perm: stable counting sort over the distinct columns present
        nd = 0
        for p in range(n):
            c = column_ids[b, p]
            if cnt[c] == 0:
                distinct[nd] = c
                nd += 1
            cnt[c] += 1
        ds = np.sort(distinct[:nd])
        if tile > 0:  # the column groups packed into tiles, when that visits fewer tiles than ascending ids
            sizes = np.empty(nd, dtype=np.int64)
            for k in range(nd):
                sizes[k] = cnt[ds[k]]
            packed = np.empty(nd, dtype=np.int64)
            _pack_groups(sizes, nd, tile, packed)
            ident = np.arange(nd)
            sid += 1
            before = _group_tiles(ident, sizes, nd, tile, n_tiles, stamp, sid)
            sid += 1
            if _group_tiles(packed, sizes, nd, tile, n_tiles, stamp, sid) < before:
                ds = ds[packed]
        acc = 0
        for k in range(nd):
            c = ds[k]
            m = cnt[c]
            cnt[c] = acc
            acc += m
        for p in range(n):
            c = column_ids[b, p]
            col_perm[b, cnt[c]] = p
            cnt[c] += 1
        for k in range(nd):
            cnt[ds[k]] = 0
        for p in range(n, s_len):
            col_perm[b, p] = p
        # --- row graph (symmetrized, CSR) and directed degrees, from the edge list
        nr = nrows[b]
        ne = n_edges[b]
        n_par = np.zeros(nr, dtype=np.int64)
        n_chi = np.zeros(nr, dtype=np.int64)
        for k in range(ne):
            i = edges[b, k] >> 16
            j = edges[b, k] & 0xFFFF
            if i != j:
                n_par[i] += 1
                n_chi[j] += 1
        deg = n_par + n_chi
        ptr, nbr = _csr(edges[b], ne, deg, nr, True)
        big = nr + 1
        key = np.empty(nr, dtype=np.int64)
        order = np.empty(nr, dtype=np.int64)
        rank = np.empty(nr, dtype=np.int64)
        if tile > 0:  # the candidates other than Cuthill-McKee, shared by both kinds
            row_cells = np.zeros(nr, dtype=np.int64)
            for p in range(n):
                row_cells[seq_row_ids[b, p]] += 1
            cands = _row_candidates(edges[b], ne, n_par, n_chi, nr)
            first_t = np.empty(nr, dtype=np.int64)
            last_t = np.empty(nr, dtype=np.int64)
        for which in range(2):
            for i in range(nr):
                first = n_par[i] if which == 0 else n_chi[i]
                key[i] = (first * big + deg[i]) * big + i
            _cuthill_mckee(ptr, nbr, key, nr, order)
            if tile > 0:
                inbound = which == 1
                sid += 1
                best = _visited_tiles(order, row_cells, nr, edges[b], ne, inbound, tile, n_tiles, stamp, sid, first_t,
                                      last_t)
                pick = -1
                for c in range(cands.shape[0]):
                    sid += 1
                    v = _visited_tiles(cands[c], row_cells, nr, edges[b], ne, inbound, tile, n_tiles, stamp, sid,
                                       first_t, last_t)
                    if v < best:
                        best = v
                        pick = c
                if pick >= 0:
                    order[:] = cands[pick]
            for k in range(nr):
                rank[order[k]] = k
            if which == 0:
                _group_rows(seq_row_ids[b], n, nr, rank, out_perm[b])
            else:
                _group_rows(seq_row_ids[b], n, nr, rank, in_perm[b])
