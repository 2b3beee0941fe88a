"""Masks derived on the device equal a brute-force construction (bookstore example and random batches);
permuted attention equals unpermuted attention; queries with no visible key get exactly 0 (no NaN)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from confluence.model.attention import MASK_KINDS, dense_mask, get_attention, reference_attention
from confluence.model.block import GatedAttention, Structure, inverse_permutation
from tests.fixtures.model import TINY


def brute_force_mask(kind, rows, cols, pad, adj):
    b, s = rows.shape
    m = np.zeros((b, s, s), bool)
    for bi in range(b):
        for i in range(s):
            for j in range(s):
                if pad[bi, i] or pad[bi, j]:
                    continue
                ri, rj = rows[bi, i], rows[bi, j]
                if kind == "outbound":
                    m[bi, i, j] = ri == rj or adj[bi, ri, rj]
                elif kind == "inbound":
                    m[bi, i, j] = adj[bi, rj, ri]
                else:
                    m[bi, i, j] = cols[bi, i] == cols[bi, j]
    return m


def bookstore():
    """Seed 000's example: rows order1, customer23, book42, order7, order12, order5; two cells per row."""
    adj = np.zeros((1, 6, 6), bool)
    for child, parent in [(0, 1), (0, 2), (3, 1), (4, 1), (5, 2)]:
        adj[0, child, parent] = True
    table_cols = {0: (0, 1), 1: (2, 3), 2: (4, 5), 3: (0, 1), 4: (0, 1), 5: (0, 1)}  # orders: cols 0, 1
    rows = np.array([[r for r in range(6) for _ in range(2)] + [0, 0]], np.int32)
    cols = np.array([[c for r in range(6) for c in table_cols[r]] + [0, 0]], np.int32)
    pad = np.zeros((1, 14), bool)
    pad[0, 12:] = True
    return rows, cols, pad, adj


def visible_rows(mask, rows, i):
    return {int(r) for r in rows[0][mask[0, i]]}


def test_bookstore_masks_match_brute_force_and_the_seed():
    rows, cols, pad, adj = bookstore()
    masks = {k: np.asarray(dense_mask(k, jnp.asarray(rows), jnp.asarray(cols), jnp.asarray(pad), jnp.asarray(adj)))
             for k in MASK_KINDS}
    for k in MASK_KINDS:
        np.testing.assert_array_equal(masks[k], brute_force_mask(k, rows, cols, pad, adj), err_msg=k)
    cell = {r: 2 * r for r in range(6)}  # first cell of each row
    assert visible_rows(masks["outbound"], rows, cell[0]) == {0, 1, 2}  # order 1: itself, customer 23, book 42
    assert visible_rows(masks["outbound"], rows, cell[1]) == {1}  # customer 23: only itself
    assert visible_rows(masks["outbound"], rows, cell[3]) == {3, 1}  # order 7: itself, customer 23
    assert visible_rows(masks["inbound"], rows, cell[1]) == {0, 3, 4}  # customer 23 <- orders 1, 7, 12
    assert visible_rows(masks["inbound"], rows, cell[2]) == {0, 5}  # book 42 <- orders 1, 5
    assert visible_rows(masks["inbound"], rows, cell[3]) == set()  # order 7 has no children
    assert not masks["column"][0, 12:].any() and not masks["column"][0, :, 12:].any()  # padding excluded


@pytest.mark.parametrize("seed", range(4))
def test_random_masks_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    b, s, r = 3, 24, 7
    rows = rng.integers(0, r, (b, s)).astype(np.int32)
    cols = rng.integers(0, 5, (b, s)).astype(np.int32)
    pad = rng.random((b, s)) < 0.2
    adj = rng.random((b, r, r)) < 0.25
    for k in MASK_KINDS:
        got = np.asarray(dense_mask(k, jnp.asarray(rows), jnp.asarray(cols), jnp.asarray(pad), jnp.asarray(adj)))
        np.testing.assert_array_equal(got, brute_force_mask(k, rows, cols, pad, adj), err_msg=k)


def test_reference_attention_matches_a_per_query_softmax():
    rng = np.random.default_rng(3)
    b, s, h, dh, r = 2, 12, 2, 4, 5
    q, k, v = (rng.standard_normal((b, s, h, dh)).astype(np.float32) for _ in range(3))
    rows = rng.integers(0, r, (b, s)).astype(np.int32)
    cols = rng.integers(0, 3, (b, s)).astype(np.int32)
    pad = np.zeros((b, s), bool)
    pad[:, -2:] = True
    adj = rng.random((b, r, r)) < 0.3
    for kind in MASK_KINDS:
        out = np.asarray(reference_attention(q, k, v, kind, rows, cols, pad, adj))
        m = brute_force_mask(kind, rows, cols, pad, adj)
        for bi in range(b):
            for i in range(s):
                for hi in range(h):
                    vis = np.nonzero(m[bi, i])[0]
                    if len(vis) == 0:
                        assert np.all(out[bi, i, hi] == 0.0)
                        continue
                    logit = k[bi, vis, hi] @ q[bi, i, hi]
                    p = np.exp(logit - logit.max())
                    p /= p.sum()
                    np.testing.assert_allclose(out[bi, i, hi], p @ v[bi, vis, hi], rtol=1e-5, atol=1e-6)


def _structure(rows, cols, pad, adj, perms):
    inputs = {"seq_row_ids": rows, "column_ids": cols, "is_padding": pad, "fk_adj": adj,
              "out_perm": perms, "in_perm": perms, "col_perm": perms}
    return Structure.from_inputs({k: jnp.asarray(v) for k, v in inputs.items()})


@pytest.mark.parametrize("kind", MASK_KINDS)
def test_permuted_attention_equals_unpermuted(kind):
    rng = np.random.default_rng(5)
    b, s, r = 2, 20, 6
    rows = rng.integers(0, r, (b, s)).astype(np.uint16)
    cols = rng.integers(0, 4, (b, s)).astype(np.int32)
    pad = np.zeros((b, s), bool)
    pad[0, 15:] = True
    adj = rng.random((b, r, r)) < 0.3
    ident = np.tile(np.arange(s, dtype=np.uint16), (b, 1))
    perm = np.stack([rng.permutation(s) for _ in range(b)]).astype(np.uint16)
    sub = GatedAttention(TINY, kind, key=jax.random.key(1))
    x = jnp.asarray(rng.standard_normal((b, s, TINY.d_model)), jnp.float32)
    fn = get_attention("reference")
    a = sub(x, _structure(rows, cols, pad, adj, ident), fn)
    p = sub(x, _structure(rows, cols, pad, adj, perm), fn)
    np.testing.assert_allclose(np.asarray(a), np.asarray(p), rtol=1e-5, atol=1e-6)
    inv = np.asarray(inverse_permutation(jnp.asarray(perm.astype(np.int32))))
    np.testing.assert_array_equal(np.take_along_axis(perm.astype(np.int64), inv, 1), np.tile(np.arange(s), (b, 1)))


def test_no_visible_key_gives_zero_output_and_finite_gradients():
    b, s, h, dh = 1, 4, 1, 2
    rows = jnp.array([[0, 0, 1, 1]], jnp.int32)
    adj = jnp.zeros((1, 2, 2), bool)  # no FK edges: the inbound mask is empty
    pad = jnp.zeros((b, s), bool)
    q = jnp.ones((b, s, h, dh))

    def f(q):
        return reference_attention(q, q, q * 2, "inbound", rows, rows, pad, adj)

    out = f(q)
    assert np.all(np.asarray(out) == 0.0)
    g = jax.grad(lambda q: f(q).sum())(q)
    assert np.all(np.isfinite(np.asarray(g)))


def test_attention_registry():
    assert get_attention("reference") is reference_attention
    with pytest.raises(ValueError, match="unknown attention_impl 'nope'"):
        get_attention("nope")
