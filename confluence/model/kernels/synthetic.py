"""Mask structures for tests and benchmarks: random ones shaped like the sampler's, or read off a `TrainingBatch`.

A synthetic sequence is a small relational subgraph: rows of a few tables (each table has its own global column
ids, one cell per column), FK edges from a row to one or two earlier rows (so some rows have no child and get an
empty inbound mask), cells grouped by row and rows ordered by reverse Cuthill-McKee for the row kinds, cells sorted
by column for the column kind, padding last (seed 000, section 4).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import reverse_cuthill_mckee

from confluence.model.attention import MaskKind
from confluence.model.kernels.structure import check_kind


class PermutedStructure(NamedTuple):
    """The compact mask inputs of one sublayer, already in its permuted order (NumPy)."""

    row_ids: np.ndarray  # int32 [B, S]
    col_ids: np.ndarray  # int32 [B, S]
    is_padding: np.ndarray  # bool [B, S]
    fk_adj: np.ndarray  # bool [B, R, R]


def _sequence(rng: np.random.Generator, seq_len: int, num_rows: int, fill: float):
    """One unpermuted sequence: (row ids, column ids, fk_adj [R, R]) of its valid cells."""
    num_tables = 4
    width = rng.integers(3, 10, size=num_tables)
    col_base = np.concatenate([[0], np.cumsum(width)[:-1]]) + 1
    adj = np.zeros((num_rows, num_rows), bool)
    rows, cols = [], []
    budget = int(seq_len * fill)
    for r in range(num_rows):
        t = int(rng.integers(num_tables))
        if len(rows) + width[t] > budget:
            break
        rows += [r] * int(width[t])
        cols += list(range(int(col_base[t]), int(col_base[t] + width[t])))
        if r > 0 and rng.random() < 0.9:
            adj[r, rng.integers(r)] = True
        if r > 1 and rng.random() < 0.25:
            adj[r, rng.integers(r)] = True
    return np.asarray(rows, np.int32), np.asarray(cols, np.int32), adj


def _row_order(adj: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Rows present in the sequence in reverse Cuthill-McKee order of the symmetrised adjacency."""
    sym = adj | adj.T | np.eye(len(adj), dtype=bool)
    order = reverse_cuthill_mckee(csr_matrix(sym.astype(np.int8)), symmetric_mode=True)
    return order[np.isin(order, present)]


def _permute(kind: MaskKind, rows: np.ndarray, cols: np.ndarray, adj: np.ndarray) -> np.ndarray:
    if kind == "column":
        return np.argsort(cols, kind="stable")
    order = _row_order(adj, np.unique(rows))
    pos_of_row = np.empty(len(adj), np.int64)
    pos_of_row[order] = np.arange(len(order))
    return np.argsort(pos_of_row[rows], kind="stable")


def synthetic_structure(
    seed: int, kind: MaskKind, batch: int, seq_len: int, num_rows: int | None = None, fill: float = 0.9
) -> PermutedStructure:
    """Random sampler-like structures: `batch` sequences of `seq_len` positions, about `fill` of them cells.

    Sequence 0 is full (`fill` ignored) when `batch > 1`; the last sequence is half padding.
    """
    check_kind(kind)
    rng = np.random.default_rng(seed)
    r = num_rows if num_rows is not None else max(2, seq_len // 4)
    row_ids = np.zeros((batch, seq_len), np.int32)
    col_ids = np.zeros((batch, seq_len), np.int32)
    pad = np.ones((batch, seq_len), bool)
    fk_adj = np.zeros((batch, r, r), bool)
    for b in range(batch):
        f = 1.0 if (b == 0 and batch > 1) else (0.5 if b == batch - 1 else fill)
        rows, cols, adj = _sequence(rng, seq_len, r, f)
        perm = _permute(kind, rows, cols, adj)
        n = len(rows)
        row_ids[b, :n] = rows[perm]
        col_ids[b, :n] = cols[perm]
        pad[b, :n] = False
        fk_adj[b] = adj
    return PermutedStructure(row_ids, col_ids, pad, fk_adj)


def batch_structure(batch, kind: MaskKind) -> PermutedStructure:
    """The permuted mask inputs of one sublayer of a `TrainingBatch` (as the model gathers them)."""
    check_kind(kind)
    perm = {"outbound": batch.out_perm, "inbound": batch.in_perm, "column": batch.col_perm}[kind].astype(
        np.int64
    )
    return PermutedStructure(
        np.take_along_axis(batch.seq_row_ids.astype(np.int32), perm, axis=1),
        np.take_along_axis(batch.column_ids.astype(np.int32), perm, axis=1),
        np.take_along_axis(batch.is_padding, perm, axis=1),
        batch.fk_adj.astype(bool),
    )
