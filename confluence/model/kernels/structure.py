"""Tile structure of the three relational attention masks, derived on the device from the compact inputs.

Nothing here builds a `[B, S, S]` array. The masks are described through *keys* (seed 000, section 4):

* row kinds ("outbound", "inbound"): each sequence's rows are relabelled by the order in which they first appear in
  the permuted sequence (their *rank*), so that rows, which the sampler's permutations keep contiguous, get
  increasing labels. A query at position `i` carries the bit-packed row `A[rank_i, :]` of the kind's row-level
  adjacency in rank space (`fk_adj | I` for outbound, `fk_adj^T` for inbound), a key carries its rank; the cell mask
  is bit `rank_j` of the query's bit row. A key tile's ranks span few 32-bit words, which the kernel visits.
* column kind: each position carries the dense rank of its column id; the cell mask is key equality.

Padding positions carry no bits (queries) and the key -1 (keys), so they never match. Tile-pair occupancy comes
from per-tile label counts `C [B, T, L]`: `nnz = C A C^T` (row kinds) or `C C^T` (column), a pair of small
matmuls, from which the kernel's tile lists (non-empty key tiles per query tile, and the transpose for dK/dV) and
the density statistics follow.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from confluence.model.attention import MASK_KINDS, MaskKind

WORD_BITS = 32


class BlockStructure(NamedTuple):
    """What the kernel reads besides q / k / v (all int32, S padded to `num_tiles * block`)."""

    qkey: jax.Array  # [B, Sp] column rank (column kind) or row rank (row kinds); -2 at padding
    kkey: jax.Array  # [B, Sp] same labels; -1 at padding
    qbits: jax.Array  # [B, W, Sp] bit-packed adjacency row of each query (row kinds; zeros for column)
    wlo: jax.Array  # [B, nT] first 32-bit word touched by the key tile's ranks (row kinds)
    whi: jax.Array  # [B, nT] last such word; whi < wlo for an all-padding tile
    kspan: jax.Array  # [B, nT] highest minus lowest rank of the key tile's keys (row kinds); -1 without any
    kv_list: jax.Array  # [B, nT, nT] per query tile: non-empty key tiles first, ascending
    kv_cnt: jax.Array  # [B, nT] number of non-empty key tiles per query tile
    q_list: jax.Array  # [B, nT, nT] per key tile: non-empty query tiles first, ascending
    q_cnt: jax.Array  # [B, nT]
    tile_nnz: jax.Array  # [B, nT, nT] visible (query, key) pairs per tile pair


def check_kind(kind: str) -> None:
    """Raise a ValueError naming the accepted kinds when `kind` is not one of them."""
    if kind not in MASK_KINDS:
        raise ValueError(f"unknown attention kind {kind!r}; expected one of {MASK_KINDS}")


def padded_length(seq_len: int, block: int) -> int:
    """S rounded up to a multiple of the tile size."""
    return -(-seq_len // block) * block


def _pad_seq(x: jax.Array, sp: int, value: int | bool) -> jax.Array:
    s = x.shape[1]
    if s == sp:
        return x
    return jnp.pad(x, ((0, 0), (0, sp - s)), constant_values=value)


def _row_ranks(row_ids: jax.Array, valid: jax.Array, num_rows: int) -> tuple[jax.Array, jax.Array]:
    """(rank per position (-1 at padding) [B, S], order: rank -> original row id [B, R])."""
    b, s = row_ids.shape
    bidx = jnp.arange(b)[:, None]
    pos = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
    rid = jnp.where(valid, row_ids, num_rows)
    first = jnp.full((b, num_rows + 1), s, jnp.int32).at[bidx, rid].min(pos)[:, :num_rows]
    order = jnp.argsort(first, axis=1, stable=True).astype(jnp.int32)
    rank_of_row = (
        jnp.zeros((b, num_rows), jnp.int32).at[bidx, order].set(jnp.arange(num_rows, dtype=jnp.int32))
    )
    pos_rank = jnp.take_along_axis(rank_of_row, jnp.clip(row_ids, 0, num_rows - 1), axis=1)
    return jnp.where(valid, pos_rank, -1), order


def _column_ranks(col_ids: jax.Array, valid: jax.Array) -> jax.Array:
    """Dense rank of each position's column id within its sequence; -1 at padding. [B, S]"""
    b, s = col_ids.shape
    bidx = jnp.arange(b)[:, None]
    c = jnp.where(valid, col_ids, jnp.iinfo(jnp.int32).max)
    order = jnp.argsort(c, axis=1, stable=True)
    cs = jnp.take_along_axis(c, order, axis=1)
    new = jnp.concatenate([jnp.ones((b, 1), jnp.int32), (cs[:, 1:] != cs[:, :-1]).astype(jnp.int32)], axis=1)
    rank_sorted = jnp.cumsum(new, axis=1, dtype=jnp.int32) - 1
    rank = jnp.zeros((b, s), jnp.int32).at[bidx, order].set(rank_sorted)
    return jnp.where(valid, rank, -1)


def _kind_adjacency(kind: MaskKind, fk_adj: jax.Array, order: jax.Array) -> jax.Array:
    """Row-level adjacency of the kind in rank space: A'[i, j] = A[order[i], order[j]]. [B, R, R] bool"""
    bidx = jnp.arange(fk_adj.shape[0])[:, None, None]
    a = fk_adj[bidx, order[:, :, None], order[:, None, :]]
    if kind == "outbound":
        return a | jnp.eye(a.shape[1], dtype=bool)[None]
    return jnp.swapaxes(a, 1, 2)


def _pack_rows(adj: jax.Array) -> jax.Array:
    """Bit-pack the last axis into int32 words, bit `j & 31` of word `j >> 5`. [B, R, W]"""
    b, r, _ = adj.shape
    w = -(-r // WORD_BITS)
    a = jnp.pad(adj, ((0, 0), (0, 0), (0, w * WORD_BITS - r))).reshape(b, r, w, WORD_BITS)
    weights = jnp.left_shift(jnp.uint32(1), jnp.arange(WORD_BITS, dtype=jnp.uint32))
    words = jnp.sum(jnp.where(a, weights, jnp.uint32(0)), axis=-1, dtype=jnp.uint32)
    return jax.lax.bitcast_convert_type(words, jnp.int32)


def _tile_counts(labels: jax.Array, num_labels: int, block: int) -> jax.Array:
    """C[b, t, l] = number of valid positions of tile t with label l (labels -1 are ignored). [B, nT, L] f32"""
    b, sp = labels.shape
    nt = sp // block
    bidx = jnp.arange(b)[:, None]
    tidx = jnp.broadcast_to((jnp.arange(sp) // block)[None, :], (b, sp))
    lab = jnp.where(labels >= 0, labels, num_labels)
    c = jnp.zeros((b, nt, num_labels + 1), jnp.float32).at[bidx, tidx, lab].add(1.0)
    return c[:, :, :num_labels]


def _tile_lists(nonempty: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Non-empty column indices first (ascending), and their count, per row of `nonempty` [B, n, n]."""
    lst = jnp.argsort(~nonempty, axis=-1, stable=True).astype(jnp.int32)
    return lst, jnp.sum(nonempty, axis=-1, dtype=jnp.int32)


def block_structure(
    kind: MaskKind,
    row_ids: jax.Array,
    col_ids: jax.Array,
    is_padding: jax.Array,
    fk_adj: jax.Array,
    block: int,
) -> BlockStructure:
    """Derive the kernel's keys, bit rows and tile lists from the compact mask inputs (see module docstring).

    Inputs are those of the attention interface (`[B, S]` permuted ids and padding, `[B, R, R]` `fk_adj`); row
    ids at non-padding positions must lie in `[0, R)`. S is padded to a multiple of `block` with padding.
    """
    check_kind(kind)
    b, s = row_ids.shape
    sp = padded_length(s, block)
    nt = sp // block
    valid = _pad_seq(~is_padding.astype(bool), sp, False)
    row_ids = _pad_seq(row_ids.astype(jnp.int32), sp, 0)
    col_ids = _pad_seq(col_ids.astype(jnp.int32), sp, 0)
    hp = jax.lax.Precision.HIGHEST
    if kind == "column":
        labels = _column_ranks(col_ids, valid)
        counts = _tile_counts(labels, sp, block)
        nnz = jnp.einsum("btl,bul->btu", counts, counts, precision=hp)
        qbits = jnp.zeros((b, 1, sp), jnp.int32)
        wlo = jnp.zeros((b, nt), jnp.int32)
        whi = jnp.full((b, nt), -1, jnp.int32)
        kspan = jnp.full((b, nt), -1, jnp.int32)
    else:
        num_rows = fk_adj.shape[1]
        if fk_adj.shape != (b, num_rows, num_rows):
            raise ValueError(f"fk_adj must be [B={b}, R, R], got {fk_adj.shape}")
        labels, order = _row_ranks(row_ids, valid, num_rows)
        adj = _kind_adjacency(kind, fk_adj.astype(bool), order)
        words = _pack_rows(adj)  # [B, R, W]
        pos_words = jnp.take_along_axis(words, jnp.clip(labels, 0, num_rows - 1)[:, :, None], axis=1)
        qbits = jnp.swapaxes(jnp.where(valid[:, :, None], pos_words, 0), 1, 2)
        counts = _tile_counts(labels, num_rows, block)
        reach = jnp.einsum("btr,brs->bts", counts, adj.astype(jnp.float32), precision=hp)
        nnz = jnp.einsum("bts,bus->btu", reach, counts, precision=hp)
        kr = labels.reshape(b, nt, block)
        kvalid = valid.reshape(b, nt, block)
        rhi = jnp.max(jnp.where(kvalid, kr, -1), axis=-1).astype(jnp.int32)
        rlo = jnp.min(jnp.where(kvalid, kr, jnp.iinfo(jnp.int32).max), axis=-1)
        rlo = jnp.where(rhi < 0, 0, rlo).astype(jnp.int32)
        whi, wlo = jnp.where(rhi < 0, -1, rhi >> 5), rlo >> 5
        kspan = jnp.where(rhi < 0, -1, rhi - rlo)
    nnz = jnp.round(nnz).astype(jnp.int32)
    nonempty = nnz > 0
    kv_list, kv_cnt = _tile_lists(nonempty)
    q_list, q_cnt = _tile_lists(jnp.swapaxes(nonempty, 1, 2))
    return BlockStructure(
        qkey=jnp.where(valid, labels, -2),
        kkey=labels,
        qbits=qbits,
        wlo=wlo,
        whi=whi,
        kspan=kspan,
        kv_list=kv_list,
        kv_cnt=kv_cnt,
        q_list=q_list,
        q_cnt=q_cnt,
        tile_nnz=nnz,
    )


def tile_stats(
    kind: MaskKind,
    row_ids: jax.Array | np.ndarray,
    col_ids: jax.Array | np.ndarray,
    is_padding: jax.Array | np.ndarray,
    fk_adj: jax.Array | np.ndarray,
    block: int = 64,
) -> dict[str, float | int]:
    """Density statistics of one sublayer's mask at tile granularity (summed over the batch).

    Returns `tiles` (tile pairs in total, B * nT^2), `nonempty`, `full` (every (query, key) pair of the tile is
    valid and visible), `partial`, `tile_density` (nonempty / tiles), `elem_density` (visible pairs / S_pad^2),
    `fill` (visible pairs / (nonempty * block^2): how full the computed tiles are) and `mean_kv_tiles` (non-empty
    key tiles per query tile holding at least one valid query).
    """
    row_ids, col_ids, is_padding, fk_adj = (jnp.asarray(x) for x in (row_ids, col_ids, is_padding, fk_adj))
    st = block_structure(kind, row_ids, col_ids, is_padding, fk_adj, block)
    b, sp = st.kkey.shape
    nt = sp // block
    nnz = np.asarray(st.tile_nnz, dtype=np.int64)
    valid = np.asarray(st.kkey >= 0).reshape(b, nt, block).sum(-1)  # valid positions per tile
    cap = valid[:, :, None] * valid[:, None, :]
    nonempty = nnz > 0
    full = nonempty & (nnz == cap) & (cap == block * block)
    n_nonempty = int(nonempty.sum())
    q_active = valid > 0
    return {
        "block": block,
        "seq_len_padded": sp,
        "tiles": int(b * nt * nt),
        "nonempty": n_nonempty,
        "full": int(full.sum()),
        "partial": n_nonempty - int(full.sum()),
        "tile_density": n_nonempty / (b * nt * nt),
        "elem_density": float(nnz.sum()) / (b * sp * sp),
        "fill": float(nnz.sum()) / max(n_nonempty * block * block, 1),
        "mean_kv_tiles": float(nonempty.sum(-1)[q_active].mean()) if q_active.any() else 0.0,
    }
