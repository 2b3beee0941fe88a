"""The three attention permutations of seed 000 section 4 (numba, nogil), padding always last.

* `col_perm`: cells grouped by global column id (ascending), original order within a column (a stable
  counting sort, O(S + distinct columns)).
* `out_perm` / `in_perm`: cells grouped by row, rows in Cuthill-McKee order of the symmetrized row graph, so
  the outbound (`I + fk_adj`) and inbound (`fk_adj^T`) masks keep their non-zeros near the diagonal. The two
  orders differ in where each component starts and how ties break: outbound starts from rows with the fewest
  parents (dimension rows, followed by the rows pointing at them), inbound from rows with the fewest children.
  The forward order is kept (its reverse has the same bandwidth and reads less naturally).
"""

from __future__ import annotations

import numpy as np
from numba import njit


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
def perms_chunk(
    lo: int,
    hi: int,
    column_ids: np.ndarray,
    seq_row_ids: np.ndarray,
    n_real: np.ndarray,
    nrows: np.ndarray,
    edges: np.ndarray,
    n_edges: np.ndarray,
    num_columns: int,
    col_perm: np.ndarray,
    out_perm: np.ndarray,
    in_perm: np.ndarray,
) -> None:
    """Fill `col_perm`, `out_perm`, `in_perm` of sequences lo..hi-1 (row graph from the fk_adj edge list)."""
    s_len = column_ids.shape[1]
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
        ptr = np.zeros(nr + 1, dtype=np.int64)
        for i in range(nr):
            ptr[i + 1] = ptr[i] + deg[i]
        nbr = np.empty(ptr[nr], dtype=np.int64)
        fill = ptr[:nr].copy()
        for k in range(ne):
            i = edges[b, k] >> 16
            j = edges[b, k] & 0xFFFF
            if i == j:
                continue
            nbr[fill[i]] = j
            fill[i] += 1
            nbr[fill[j]] = i
            fill[j] += 1
        big = nr + 1
        key = np.empty(nr, dtype=np.int64)
        order = np.empty(nr, dtype=np.int64)
        rank = np.empty(nr, dtype=np.int64)
        for which in range(2):
            for i in range(nr):
                first = n_par[i] if which == 0 else n_chi[i]
                key[i] = (first * big + deg[i]) * big + i
            _cuthill_mckee(ptr, nbr, key, nr, order)
            for k in range(nr):
                rank[order[k]] = k
            if which == 0:
                _group_rows(seq_row_ids[b], n, nr, rank, out_perm[b])
            else:
                _group_rows(seq_row_ids[b], n, nr, rank, in_perm[b])
