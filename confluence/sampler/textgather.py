"""Phase 2 of batch construction: batch-wide text dedup and gather (seed 000 section 6), numba, nogil."""

from __future__ import annotations

import numpy as np
from numba import njit

from confluence.stypes import SemanticType

_TEXT = int(SemanticType.TEXT)


@njit(nogil=True, cache=True)
def dedup_text(semantic_types: np.ndarray, is_null: np.ndarray, text_ids: np.ndarray) -> np.ndarray:
    """Rewrite global text indices of non-null text cells to batch-local 0..U-1; return the U global indices."""
    b_n, s_n = semantic_types.shape
    tmp = np.empty(b_n * s_n, dtype=np.uint32)
    k = 0
    for b in range(b_n):
        for p in range(s_n):
            if semantic_types[b, p] == _TEXT and not is_null[b, p]:
                tmp[k] = text_ids[b, p]
                k += 1
    srt = np.sort(tmp[:k])
    u = 0
    for i in range(k):
        if i == 0 or srt[i] != srt[i - 1]:
            srt[u] = srt[i]
            u += 1
    uniq = srt[:u].copy()
    for b in range(b_n):
        for p in range(s_n):
            if semantic_types[b, p] == _TEXT and not is_null[b, p]:
                text_ids[b, p] = np.searchsorted(uniq, text_ids[b, p])
    return uniq


@njit(nogil=True, cache=True)
def gather_rows(table: np.ndarray, idx: np.ndarray, out: np.ndarray) -> None:
    """out[i] = table[idx[i]] for the first len(idx) rows of `out` (the rest stays as allocated)."""
    d = table.shape[1]
    for i in range(idx.shape[0]):
        r = idx[i]
        for j in range(d):
            out[i, j] = table[r, j]
