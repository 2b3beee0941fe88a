"""Tile structure (keys, bit rows, tile lists, statistics) against the dense mask of the reference path."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from confluence.model.attention import MASK_KINDS, dense_mask
from confluence.model.kernels import block_structure, synthetic_structure, tile_stats
from tests.fixtures.kernel import random_unsorted


def structures():
    for kind in MASK_KINDS:
        yield kind, synthetic_structure(3, kind, 3, 150), 32
        yield kind, random_unsorted(4, 2, 77, 40), 16


def decode_mask(kind, st, s):
    """The [B, S, S] mask that the kernel computes tile by tile, rebuilt from the structure in NumPy."""
    qkey, kkey = np.asarray(st.qkey)[:, :s], np.asarray(st.kkey)[:, :s]
    if kind == "column":
        return qkey[:, :, None] == kkey[:, None, :]
    bits = np.asarray(st.qbits).view(np.uint32)[:, :, :s]  # [B, W, S]
    word = np.clip(kkey >> 5, 0, bits.shape[1] - 1)
    b_idx = np.arange(bits.shape[0])[:, None, None]
    w = bits[b_idx, word[:, None, :], np.arange(s)[None, :, None]]  # [B, Sq, Sk]
    hit = (w >> (kkey[:, None, :] & 31).astype(np.uint32)) & 1
    return (hit == 1) & (kkey[:, None, :] >= 0)


@pytest.mark.parametrize("kind,struct,block", list(structures()))
def test_keys_and_bits_reproduce_dense_mask(kind, struct, block):
    row, col, pad, adj = (jnp.asarray(x) for x in struct)
    s = row.shape[1]
    st = block_structure(kind, row, col, pad, adj, block)
    want = np.asarray(dense_mask(kind, row, col, pad, adj))
    np.testing.assert_array_equal(decode_mask(kind, st, s), want)


@pytest.mark.parametrize("kind,struct,block", list(structures()))
def test_key_tile_words_and_span(kind, struct, block):
    """wlo / whi (the words a key tile's ranks touch) and kspan (its highest minus lowest rank: what the bit-window
    mask relies on) from the keys directly; -1 for a tile without keys and for the column kind."""
    row, col, pad, adj = (jnp.asarray(x) for x in struct)
    st = block_structure(kind, row, col, pad, adj, block)
    keys = np.asarray(st.kkey).reshape(row.shape[0], -1, block)
    for b in range(keys.shape[0]):
        for t in range(keys.shape[1]):
            k = keys[b, t][keys[b, t] >= 0]
            span = -1 if kind == "column" or k.size == 0 else int(k.max() - k.min())
            assert int(st.kspan[b, t]) == span
            if kind != "column" and k.size:
                assert (int(st.wlo[b, t]), int(st.whi[b, t])) == (int(k.min()) >> 5, int(k.max()) >> 5)


@pytest.mark.parametrize("kind,struct,block", list(structures()))
def test_tile_counts_and_lists_match_dense_mask(kind, struct, block):
    row, col, pad, adj = (jnp.asarray(x) for x in struct)
    b, s = row.shape
    st = block_structure(kind, row, col, pad, adj, block)
    nt = -(-s // block)
    dense = np.zeros((b, nt * block, nt * block), bool)
    dense[:, :s, :s] = np.asarray(dense_mask(kind, row, col, pad, adj))
    want = dense.reshape(b, nt, block, nt, block).sum(axis=(2, 4))
    np.testing.assert_array_equal(np.asarray(st.tile_nnz), want)
    kv_list, kv_cnt = np.asarray(st.kv_list), np.asarray(st.kv_cnt)
    q_list, q_cnt = np.asarray(st.q_list), np.asarray(st.q_cnt)
    for bi in range(b):
        for t in range(nt):
            np.testing.assert_array_equal(kv_list[bi, t, : kv_cnt[bi, t]], np.flatnonzero(want[bi, t]))
            np.testing.assert_array_equal(q_list[bi, t, : q_cnt[bi, t]], np.flatnonzero(want[bi, :, t]))


@pytest.mark.parametrize("kind", MASK_KINDS)
def test_permuted_structures_are_sparse_at_tile_level(kind):
    stats = tile_stats(kind, *synthetic_structure(5, kind, 2, 512), block=32)
    assert 0 < stats["nonempty"] < stats["tiles"]
    assert stats["tile_density"] < 0.5, stats
    assert stats["elem_density"] <= stats["tile_density"]


def test_tile_stats_counts_full_partial_and_empty_tiles():
    # two columns of 32 cells each, then 32 padding cells: 2 full diagonal tiles of 9
    col = np.repeat(np.array([[1, 2, 0]], np.int32), 32, axis=1)
    pad = np.zeros((1, 96), bool)
    pad[0, 64:] = True
    row = np.zeros((1, 96), np.int32)
    adj = np.zeros((1, 1, 1), bool)
    stats = tile_stats("column", row, col, pad, adj, block=32)
    assert (stats["tiles"], stats["nonempty"], stats["full"], stats["partial"]) == (9, 2, 2, 0)
    assert stats["fill"] == 1.0
    assert stats["mean_kv_tiles"] == 1.0
    assert stats["elem_density"] == pytest.approx(2 * 32 * 32 / 96**2)


def test_unknown_kind_is_rejected_with_the_accepted_kinds():
    row, col, pad, adj = random_unsorted(0, 1, 8, 4)
    with pytest.raises(ValueError, match="outbound"):
        block_structure(
            "sideways", jnp.asarray(row), jnp.asarray(col), jnp.asarray(pad), jnp.asarray(adj), 16
        )
