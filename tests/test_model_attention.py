"""Masks derived on the device equal a brute-force construction (bookstore example and random batches);
permuted attention equals unpermuted attention; queries with no visible key get exactly 0 (no NaN)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from confluence.model.attention import (
    MASK_KINDS,
    Attention,
    dense_mask,
    get_attention,
    masked_attention,
    reference_attention,
)
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


def _structure(rows, cols, pad, adj, perms, attention):
    inputs = {"seq_row_ids": rows, "column_ids": cols, "is_padding": pad, "fk_adj": adj,
              "out_perm": perms, "in_perm": perms, "col_perm": perms}
    return Structure.from_inputs({k: jnp.asarray(v) for k, v in inputs.items()}, attention)


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
    # the reference works in the batch's own order; the same math asking for the sublayer's permuted order takes
    # the model's permute / unpermute path (its gradient: the inverse permutation's gather)
    plain = get_attention("reference")
    permuted = Attention.from_function("reference_permuted", reference_attention)
    assert not plain.permuted and permuted.permuted

    def run(fn, p):
        def f(sub, x):
            return sub(x, _structure(rows, cols, pad, adj, p, fn), fn)

        out, vjp = jax.vjp(f, sub, x)
        return out, vjp(jnp.asarray(np.cos(np.arange(out.size)).reshape(out.shape), out.dtype))

    a, grads_a = run(plain, ident)
    for p in (ident, perm):
        got, grads = run(permuted, p)
        np.testing.assert_allclose(np.asarray(got), np.asarray(a), rtol=1e-5, atol=1e-6)
        for ga, gb in zip(jax.tree.leaves(grads_a), jax.tree.leaves(grads), strict=True):
            np.testing.assert_allclose(np.asarray(gb), np.asarray(ga), rtol=1e-4, atol=1e-5)
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
    ref = get_attention("reference")
    assert ref.name == "reference" and not ref.permuted
    assert get_attention("auto") is ref  # no GPU here
    with pytest.raises(ValueError, match="unknown attention_impl 'nope'"):
        get_attention("nope")


def _autodiff_attention(q, k, v, mask):
    """The masked softmax written plainly (differentiated by JAX): the oracle of `masked_attention`'s custom VJP."""
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
    logits = jnp.where(mask[:, None], logits, -jnp.inf)
    m = jnp.max(logits, axis=-1, keepdims=True)
    p = jnp.exp(logits - jnp.where(jnp.isfinite(m), m, 0.0))
    d = jnp.sum(p, axis=-1, keepdims=True)
    p = p / jnp.where(d > 0, d, 1.0)
    return jnp.einsum("bhqk,bkhd->bqhd", p.astype(v.dtype), v, preferred_element_type=jnp.float32).astype(v.dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_masked_attention_custom_vjp_matches_autodiff(dtype):
    ks = jax.random.split(jax.random.key(3), 5)
    b, s, h, dh = 2, 40, 2, 8
    q, k, v, g = (jax.random.normal(kk, (b, s, h, dh)).astype(dtype) for kk in ks[:4])
    mask = jax.random.uniform(ks[4], (b, s, s)) < 0.2
    mask = mask.at[:, 3, :].set(False).at[:, 7, :].set(False).at[:, 7, 7].set(True)  # a blind query, a lone key
    want, vjp_want = jax.vjp(_autodiff_attention, q, k, v, mask)
    got, vjp_got = jax.vjp(masked_attention, q, k, v, mask)
    # f32: equal up to rounding; bf16: within the rounding of the bf16 intermediates both keep
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == jnp.float32 else {"rtol": 0.02, "atol": 0.02}
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), **tol)
    assert np.all(np.asarray(got)[:, 3] == 0.0)
    grads = vjp_got(g)[:3]
    for a, c in zip(vjp_want(g)[:3], grads, strict=True):
        scale = float(jnp.max(jnp.abs(a.astype(jnp.float32))))
        np.testing.assert_allclose(np.asarray(c, np.float32), np.asarray(a, np.float32),
                                   rtol=tol["rtol"], atol=tol["atol"] * scale)
    assert np.all(np.asarray(grads[0])[:, 3] == 0.0)  # a blind query gets no gradient


def test_an_implementation_without_sinks_says_so():
    """A registered one-call implementation has no sinks: asking it for one names the implementations that do."""
    from confluence.model.attention import Attention

    impl = Attention.from_function("plain", lambda q, k, v, kind, *ids: v)
    x = jnp.zeros((1, 2, 1, 2))
    assert impl.attend(x, x, x, "inbound", ()) is x
    with pytest.raises(ValueError, match="'plain' has no attention sinks.*'reference' or 'block_sparse'"):
        impl.attend(x, x, x, "inbound", (), sink=jnp.zeros(1))
