"""Every hand-written gradient of the model equals JAX's autodiff of the plain formula (the oracle): `matmul`,
`split`, `rms_norm`, `scaled_l2norm`, `permute`, and the value encoder's one-product form against the seed's
per-type encoders."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from confluence.model.block import inverse_permutation, permute, scaled_l2norm
from confluence.toolkit.layers import matmul, rms_norm, split

KEYS = jax.random.split(jax.random.key(11), 8)


def _check(f_custom, f_plain, args, rtol=1e-5, atol=1e-6):
    out_c, vjp_c = jax.vjp(f_custom, *args)
    out_p, vjp_p = jax.vjp(f_plain, *args)
    for a, b in zip(jax.tree.leaves(out_c), jax.tree.leaves(out_p), strict=True):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=rtol, atol=atol)
    cot = jax.tree.map(lambda o: jax.random.normal(KEYS[7], o.shape, jnp.float32).astype(o.dtype), out_p)
    for a, b in zip(jax.tree.leaves(vjp_c(cot)), jax.tree.leaves(vjp_p(cot)), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        scale = max(1.0, float(jnp.max(jnp.abs(b.astype(jnp.float32)))))
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=rtol, atol=atol * scale)


def test_matmul():
    x = jax.random.normal(KEYS[0], (3, 5, 8))
    w = jax.random.normal(KEYS[1], (8, 6))
    _check(matmul, lambda x, w: x @ w, (x, w))


def test_matmul_bf16_rounds_the_fp32_product_once():
    x = jax.random.normal(KEYS[0], (4, 64)).astype(jnp.bfloat16)
    w = jax.random.normal(KEYS[1], (64, 3)).astype(jnp.bfloat16)
    want = (x.astype(jnp.float32) @ w.astype(jnp.float32)).astype(jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(matmul(x, w), np.float32), np.asarray(want, np.float32))


@pytest.mark.parametrize("axis", [-1, 1])
def test_split(axis):
    x = jax.random.normal(KEYS[2], (2, 6, 9))
    sizes = (2, 3, 4) if axis == -1 else (1, 5)

    def plain(x):
        cuts = np.cumsum((0, *sizes))
        return tuple(jax.lax.slice_in_dim(x, int(a), int(b), axis=axis) for a, b in zip(cuts[:-1], cuts[1:], strict=True))

    _check(lambda x: split(x, sizes, axis), plain, (x,))
    with pytest.raises(ValueError, match="do not add up"):
        split(x, (1, 1), axis)


def test_rms_norm():
    x = jax.random.normal(KEYS[3], (4, 7, 16)) * 3
    gamma = jax.random.normal(KEYS[4], (16,)) * 0.1

    def plain(x, g):
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * (1 + g)

    _check(lambda x, g: rms_norm(x, g, 1e-6), plain, (x, gamma), rtol=1e-5, atol=1e-5)


def test_scaled_l2norm():
    x = jax.random.normal(KEYS[5], (2, 9, 6 * 4))
    scale = jnp.linspace(0.5, 3.0, 6)

    def plain(x, s):
        xh = x.reshape(2, 9, 6, 4)
        return (xh * jax.lax.rsqrt(jnp.sum(xh * xh, axis=-1, keepdims=True) + 1e-6) * s[:, None]).reshape(x.shape)

    _check(scaled_l2norm, plain, (x, scale), rtol=1e-5, atol=1e-5)


def test_permute_gradient_is_the_inverse_permutation():
    x = jax.random.normal(KEYS[6], (3, 10, 4))
    perm = jnp.stack([jax.random.permutation(k, 10) for k in jax.random.split(KEYS[0], 3)]).astype(jnp.int32)
    inv = inverse_permutation(perm)
    _check(lambda x: permute(x, perm, inv), lambda x: jnp.take_along_axis(x, perm[..., None], axis=1), (x,))


@pytest.mark.parametrize("impl", ["reference", "reference_permuted"])
def test_no_scatter_add_in_the_training_gradient(impl):
    """The training gradient holds no scatter-add (autodiff's gradient of a gather: into embedding tables, the
    permuted order, the target cells, the categorical logits), the backward-pass waste the training-speed work
    removed. With an implementation in the permuted order the only scatters are the forward pass's inverse
    permutations (a set, not an add)."""
    import dataclasses

    from confluence.model.attention import Attention, reference_attention, register_attention
    from confluence.model.inputs import DbTables, batch_to_inputs
    from confluence.training.step import Trainer
    from tests.fixtures.model import MAX_K, TINY, tiny_batch, tiny_db, tiny_model, tiny_run_config

    register_attention("reference_permuted", Attention.from_function("reference_permuted", reference_attention))
    cfg = tiny_run_config()
    db = tiny_db()
    tb = DbTables.build(db.name, db.column_embeddings, db.categorical_embeddings, db.max_k, MAX_K)
    model = tiny_model(dataclasses.replace(TINY, attention_impl=impl))
    tr = Trainer(model, cfg.optim.for_run(cfg.loop.max_steps), cfg.loss)
    params, _ = tr.init_state(model)
    inputs = batch_to_inputs(tiny_batch(db, task=3))
    jaxpr = str(jax.jit(tr._grads).trace(params, inputs, tb.column_embeddings, tb.categorical_embeddings).jaxpr)
    assert "scatter-add" not in jaxpr
    assert ("scatter" in jaxpr) == (impl == "reference_permuted")


def test_sink_attention_equals_a_virtual_zero_valued_key():
    """The sink's written-out gradient equals autodiff of the plain formula: softmax over the visible keys plus one
    virtual key per head whose logit is the learned sink and whose value is 0; a query that sees nothing gets 0."""
    from confluence.model.attention import sink_attention

    b, s, h, dh = 2, 7, 3, 4
    q, k, v = (jax.random.normal(KEYS[i], (b, s, h, dh)) for i in range(3))
    mask = jax.random.bernoulli(KEYS[3], 0.5, (b, s, s)).at[:, 0, :].set(False)  # query 0 sees no key
    sink = jnp.array([0.3, -1.0, 2.0])

    def plain(q, k, v, sink):
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k)
        logits = jnp.where(mask[:, None], logits, -jnp.inf)
        full = jnp.concatenate([logits, jnp.broadcast_to(sink[None, :, None, None], (b, h, s, 1))], axis=-1)
        p = jax.nn.softmax(full, axis=-1)[..., :s]
        return jnp.einsum("bhqk,bkhd->bqhd", p, v)

    _check(lambda q, k, v, sink: sink_attention(q, k, v, mask, sink), plain, (q, k, v, sink), rtol=1e-5, atol=1e-6)
    out = sink_attention(q, k, v, mask, sink)
    assert float(jnp.abs(out[:, 0]).max()) == 0.0
    # the output's size now counts: one visible key with logit 0 and sink 0 gives half of its value
    one = jnp.zeros((1, 2, 2), bool).at[0, 0, 1].set(True)
    qq = jnp.zeros((1, 2, 1, 2))
    vv = jnp.ones((1, 2, 1, 2))
    np.testing.assert_allclose(np.asarray(sink_attention(qq, qq, vv, one, jnp.zeros(1)))[0, 0, 0], [0.5, 0.5])
