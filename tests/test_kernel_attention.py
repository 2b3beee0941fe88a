"""The block-sparse kernel (Pallas interpreter on CPU) against the reference: outputs and dq / dk / dv."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from confluence.model.attention import MASK_KINDS, dense_mask, reference_attention
from confluence.model.kernels import (
    attend_block_sparse,
    block_sparse_attention,
    block_structure,
    synthetic_structure,
)
from confluence.model.kernels.block_sparse import fast_words
from tests.fixtures.kernel import assert_close_to_reference, random_qkv, random_unsorted, run_both


def empty_queries(kind, struct) -> np.ndarray:
    """[B, S] True where a query sees no key at all."""
    return ~np.asarray(dense_mask(kind, *(jnp.asarray(x) for x in struct))).any(-1)


@pytest.mark.parametrize("kind", MASK_KINDS)
def test_sampler_like_structure_bf16(kind):
    struct = synthetic_structure(11, kind, 2, 100)  # S=100 is not a multiple of the 32 tile
    q, k, v, do = random_qkv(0, 2, 100, 2, 16)
    results = run_both(kind, struct, q, k, v, do, block=32)
    assert_close_to_reference(results)
    empty = empty_queries(kind, struct)
    assert empty.any()  # padding at least
    assert np.all(results[0][0][empty] == 0.0)


@pytest.mark.parametrize("kind", MASK_KINDS)
def test_unsorted_structure_with_scattered_padding_and_odd_head_dim(kind):
    row, col, pad, adj = random_unsorted(7, 2, 117, 200)
    pad[1, :] = True  # a filler sequence: all padding
    struct = (row, col, pad, adj)
    if kind != "column":  # ranks scattered over 3 bit words: the dynamic word loop
        st = block_structure(kind, *(jnp.asarray(x) for x in struct), 16)
        assert int(jnp.max(st.whi - st.wlo)) >= fast_words(16)
    q, k, v, do = random_qkv(1, 2, 117, 3, 12)
    results = run_both(kind, struct, q, k, v, do, block=16)
    assert_close_to_reference(results)
    assert np.all(results[0][0][1] == 0.0)
    assert all(np.all(g[1] == 0.0) for g in results[0][1])


def test_empty_inbound_rows_give_exact_zero_and_finite_grads():
    struct = synthetic_structure(2, "inbound", 1, 64, fill=1.0)
    empty = empty_queries("inbound", struct)
    assert empty[0, ~struct.is_padding[0]].any(), "the structure must contain childless rows"
    q, k, v, do = random_qkv(2, 1, 64, 2, 16)
    results = run_both("inbound", struct, q, k, v, do, block=16)
    out, (dq, dk, dv) = results[0]
    assert np.all(out[empty] == 0.0)
    assert np.all(dq[empty] == 0.0)
    assert all(np.all(np.isfinite(g)) for g in (dq, dk, dv))
    assert_close_to_reference(results)


@pytest.mark.parametrize("kind", MASK_KINDS)
def test_float32_matches_reference_tightly(kind):
    struct = synthetic_structure(5, kind, 2, 50)
    q, k, v, do = random_qkv(3, 2, 50, 2, 16, dtype=jnp.float32)
    with jax.default_matmul_precision("highest"):  # no TF32 in the reference on a GPU
        (ko, kg), _, (fo, fg) = run_both(kind, struct, q, k, v, do, block=16)
    for got, want in zip([ko, *kg], [fo, *fg], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(want).max())))


def test_jit_is_deterministic():
    struct = tuple(jnp.asarray(x) for x in synthetic_structure(9, "outbound", 1, 40))
    q, k, v, _ = random_qkv(4, 1, 40, 1, 16)
    fn = jax.jit(lambda q, k, v: block_sparse_attention(q, k, v, "outbound", *struct, block=16))
    a, b = np.asarray(fn(q, k, v), np.float32), np.asarray(fn(q, k, v), np.float32)
    np.testing.assert_array_equal(a, b)
    ref = np.asarray(reference_attention(q, k, v, "outbound", *struct), np.float32)
    assert np.max(np.abs(a - ref)) < 0.05


@pytest.mark.parametrize(
    "kwargs,match",
    [({"block": 24}, "power of two"), ({"block": 8}, "power of two")],
)
def test_bad_block_size_is_rejected(kwargs, match):
    struct = tuple(jnp.asarray(x) for x in synthetic_structure(0, "column", 1, 16))
    q, k, v, _ = random_qkv(0, 1, 16, 1, 16)
    with pytest.raises(ValueError, match=match):
        block_sparse_attention(q, k, v, "column", *struct, **kwargs)


def test_mismatched_shapes_name_the_argument():
    row, col, pad, adj = (jnp.asarray(x) for x in synthetic_structure(0, "column", 1, 16))
    q, k, v, _ = random_qkv(0, 1, 16, 1, 16)
    with pytest.raises(ValueError, match="col_ids"):
        block_sparse_attention(q, k, v, "column", row, col[:, :8], pad, adj)


@pytest.mark.slow
@pytest.mark.parametrize("kind", MASK_KINDS)
def test_default_tile_at_longer_sequence(kind):
    struct = synthetic_structure(13, kind, 2, 300)  # 5 tiles of 64, the last one partial
    q, k, v, do = random_qkv(5, 2, 300, 1, 32)
    results = run_both(kind, struct, q, k, v, do, block=64)
    assert_close_to_reference(results)


@pytest.mark.parametrize("kind", ["outbound", "inbound"])
def test_contiguous_rows_whose_tiles_straddle_bit_words(kind):
    """Many one-cell rows: each tile of 16 spans ranks across two 32-bit words (the unrolled word path)."""
    rng = np.random.default_rng(3)
    s, r = 90, 84
    row = np.concatenate([[0] * 7, np.arange(1, r)]).astype(np.int32)[
        None, :s
    ]  # row 0 has 7 cells, then one each
    adj = np.zeros((1, r, r), bool)
    adj[0, np.arange(1, r), np.arange(r - 1)] = True  # a chain: each row points at the previous one
    adj[0, rng.integers(0, r, 30), rng.integers(0, r, 30)] = True
    struct = (row, np.zeros_like(row), np.zeros_like(row, bool), adj)
    st = block_structure(kind, *(jnp.asarray(x) for x in struct), 16)
    span = np.asarray(st.whi - st.wlo)
    assert span.max() == 1 and span.max() < fast_words(16)  # some tiles touch two words, none three
    q, k, v, do = random_qkv(6, 1, s, 2, 16)
    assert_close_to_reference(run_both(kind, struct, q, k, v, do, block=16))


@pytest.mark.parametrize("kind", MASK_KINDS)
def test_heads_per_program_give_the_same_bits(kind):
    """Several heads per program share a tile's list, loads and mask: the same numbers as one head per program,
    bit for bit (the dynamic word loop included: unsorted structure, tiles of 16)."""
    struct = tuple(jnp.asarray(x) for x in random_unsorted(4, 2, 70, 90))
    q, k, v, do = random_qkv(7, 2, 70, 4, 16)

    def value_and_grads(heads, warps):
        def loss(q, k, v):
            out = block_sparse_attention(q, k, v, kind, *struct, block=16, heads=heads, warps=warps)
            return jnp.sum(out.astype(jnp.float32) * do)

        val, grads = jax.jit(jax.value_and_grad(loss, (0, 1, 2)))(q, k, v)
        return [np.asarray(val), *(np.asarray(g) for g in grads)]

    one = value_and_grads(1, 4)
    for heads, warps in ((2, 4), (4, 8)):
        for a, b in zip(one, value_and_grads(heads, warps), strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    ("heads", "warps", "match"),
    [(3, 4, "power of two"), (8, 4, "must divide"), (2, 3, "warps per program")],
)
def test_bad_launch_is_rejected(heads, warps, match):
    struct = synthetic_structure(1, "column", 1, 32)
    q, k, v, _ = random_qkv(0, 1, 32, 4, 16)
    with pytest.raises(ValueError, match=match):
        block_sparse_attention(q, k, v, "column", *struct, block=16, heads=heads, warps=warps)


@pytest.mark.parametrize(("kind", "block"), [("outbound", 16), ("inbound", 32), ("outbound", 64), ("inbound", 64),
                                             ("outbound", 128)])
def test_contiguous_rows_promise(kind, block):
    """`contiguous_rows=True` (the model's launch) runs only the bit-window mask: the same bits as the `lax.cond`
    dispatch (unrolled or dynamic word loop) on rows kept contiguous, whose ranks cross 32-bit words at every
    offset, and NaN, never a silently wrong answer, when an input breaks the promise."""
    struct = tuple(jnp.asarray(x) for x in synthetic_structure(11, kind, 2, 520))  # over 64 rows: 3+ words of ranks
    q, k, v, do = random_qkv(0, 2, 520, 2, 16)
    st = block_structure(kind, *struct, block)
    assert int(jnp.max(st.whi)) >= 2

    def run(st, contiguous, q, k, v, do, heads=1):
        def loss(q, k, v):
            out = attend_block_sparse(q, k, v, kind, st, contiguous_rows=contiguous, heads=heads)
            return jnp.sum(out.astype(jnp.float32) * do)

        val, grads = jax.jit(jax.value_and_grad(loss, (0, 1, 2)))(q, k, v)
        return [np.asarray(val), *(np.asarray(g) for g in grads)]

    window = run(st, True, q, k, v, do)
    for a, b in zip(run(st, False, q, k, v, do), window, strict=True):
        np.testing.assert_array_equal(a, b)
    if block == 64:  # two heads per program share the window mask: the same bits
        for a, b in zip(window, run(st, True, q, k, v, do, heads=2), strict=True):
            np.testing.assert_array_equal(a, b)
    row, col, pad, adj = random_unsorted(7, 2, 117, 200)  # ranks scattered: tiles span more words
    st = block_structure(kind, *(jnp.asarray(x) for x in (row, col, pad, adj)), 16)
    assert int(jnp.max(st.whi - st.wlo)) >= fast_words(16)
    assert all(np.isnan(x).all() for x in run(st, True, *random_qkv(1, 2, 117, 2, 16)))


@pytest.mark.parametrize("kind", ["inbound", "column"])
def test_sink_matches_the_reference_sink_in_float32(kind):
    """The kernel's sink (composed from its output and log-sum-exp, outside the kernels) gives the reference sink
    attention's output and gradients, the sink logits' gradient included; empty and padded queries stay 0."""
    from confluence.model.attention import sink_attention

    struct = synthetic_structure(5, kind, 2, 50, fill=0.6)
    args = tuple(jnp.asarray(x) for x in struct)
    q, k, v, do = random_qkv(3, 2, 50, 2, 16, dtype=jnp.float32)
    sink = jnp.array([0.5, -1.5])
    mask = dense_mask(kind, *args)
    st = block_structure(kind, *args, 16)

    def loss(fn, q, k, v, sink):
        return jnp.sum(fn(q, k, v, sink) * do)

    kern = lambda q, k, v, sink: attend_block_sparse(q, k, v, kind, st, sink=sink)  # noqa: E731
    ref = lambda q, k, v, sink: sink_attention(q, k, v, mask, sink)  # noqa: E731
    with jax.default_matmul_precision("highest"):
        got = jax.jit(jax.value_and_grad(lambda *a: loss(kern, *a), argnums=(0, 1, 2, 3)))(q, k, v, sink)
        want = jax.jit(jax.value_and_grad(lambda *a: loss(ref, *a), argnums=(0, 1, 2, 3)))(q, k, v, sink)
        out = kern(q, k, v, sink)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        b = np.asarray(b)
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(b).max())))
    assert float(jnp.abs(got[1][3]).min()) > 1e-3  # the sink's gradient is exercised
    assert np.all(np.asarray(out)[empty_queries(kind, struct)] == 0.0)
