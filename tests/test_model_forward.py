"""Whole forward pass: output structure, padding never changes a non-padding output, target values never leak."""

import dataclasses

import jax
import numpy as np
import pytest

from confluence.model.heads import ModelOutput
from confluence.model.inputs import batch_to_inputs
from tests.fixtures.model import TINY, tables, tiny_batch, tiny_db, tiny_model


def _forward(model, batch, db):
    col, cat = tables(db)
    return jax.jit(lambda m, i: m(i, col, cat))(model, batch_to_inputs(batch))


def _pad_batch(batch, extra, rng):
    """Append `extra` padding positions full of garbage values; permutations keep padding last."""
    b, s = batch.semantic_types.shape
    new = {}
    for f in dataclasses.fields(batch):
        x = getattr(batch, f.name)
        if isinstance(x, np.ndarray) and x.ndim >= 2 and x.shape[:2] == (b, s) and f.name != "fk_adj":
            if f.name in ("col_perm", "out_perm", "in_perm"):
                tail = np.tile(np.arange(s, s + extra, dtype=x.dtype), (b, 1))
            elif f.name == "is_padding":
                tail = np.ones((b, extra), bool)
            elif f.name == "is_target":
                tail = np.zeros((b, extra), bool)
            elif x.dtype == bool:
                tail = rng.random((b, extra) + x.shape[2:]) < 0.5
            elif f.name == "semantic_types":
                tail = rng.integers(0, 6, (b, extra)).astype(x.dtype)
            elif f.name == "seq_row_ids":
                tail = rng.integers(0, batch.num_rows, (b, extra)).astype(x.dtype)
            elif np.issubdtype(x.dtype, np.integer):
                tail = rng.integers(0, 3, (b, extra) + x.shape[2:]).astype(x.dtype)
            else:
                tail = (rng.standard_normal((b, extra) + x.shape[2:]) * 50).astype(x.dtype)
            x = np.concatenate([x, tail], axis=1)
        new[f.name] = x
    out = type(batch)(**new)
    out.validate()
    return out


def test_output_structure_and_dtypes():
    db = tiny_db()
    batch = tiny_batch(db, task=3)
    out = _forward(tiny_model(), batch, db)
    assert isinstance(out, ModelOutput)
    b, s = batch.semantic_types.shape
    assert out.h.shape == (b, s, TINY.d_model) and out.cat_preds.shape == (b, s, TINY.d_model)
    assert out.null_logits.shape == out.num_preds.shape == out.bool_logits.shape == (b, s)
    assert out.ts_preds.shape == (b, s, 15)
    # the copy head and the time reference run at the target cells only (`at_targets`)
    assert out.cat_copy is None and out.ts_epoch_head is None
    for x in (f for f in out if f is not None):
        assert x.dtype == np.float32 and np.all(np.isfinite(np.asarray(x)))


def test_padding_never_changes_a_non_padding_output():
    db = tiny_db()
    rng = np.random.default_rng(0)
    batch = tiny_batch(db, task=0, seed=3, s=32, r=3)
    assert batch.is_padding.any()  # the batch already has padding; also fill it with garbage
    garbage = dataclasses.replace(batch, numeric_values=np.where(batch.is_padding, 99.0, batch.numeric_values)
                                  .astype(np.float32),
                                  column_ids=np.where(batch.is_padding, 2, batch.column_ids).astype(np.int32))
    longer = _pad_batch(batch, 16, rng)
    model = tiny_model()
    ref = _forward(model, batch, db)
    for other in (_forward(model, garbage, db), _forward(model, longer, db)):
        keep = ~batch.is_padding
        for name, a, c in zip(ModelOutput._fields, ref, other, strict=True):
            if a is None:  # cat_copy: at the target cells only
                continue
            np.testing.assert_allclose(np.asarray(a)[keep], np.asarray(c)[:, :32][keep], rtol=2e-5, atol=2e-5,
                                       err_msg=name)


def _with_other_truth(batch):
    """The batch with another value and the opposite nullness in every target cell (every value slot changed)."""
    t = batch.is_target
    return dataclasses.replace(
        batch, numeric_values=np.where(t, 123.0, batch.numeric_values).astype(np.float32),
        timestamp_values=np.where(t[..., None], 7.0, batch.timestamp_values).astype(np.float32),
        bool_values=batch.bool_values ^ t, categorical_embed_ids=np.where(t, 3, batch.categorical_embed_ids)
        .astype(np.uint32), is_null=batch.is_null ^ t)


@pytest.mark.parametrize("task", [0, 1, 2, 3])
def test_the_model_inputs_do_not_depend_on_the_target_truth(task):
    """Structural masking: everything the model reads is byte-identical whatever the target cell holds; the truth
    travels only in the `[B]` target fields the loss reads."""
    from confluence.model.inputs import TARGET_FIELDS

    batch = tiny_batch(tiny_db(), task=task, seed=4)
    a, c = batch_to_inputs(batch), batch_to_inputs(_with_other_truth(batch))
    for name in a:
        if name not in TARGET_FIELDS:
            np.testing.assert_array_equal(a[name], c[name], err_msg=name)
    assert any(not np.array_equal(a[f], c[f]) for f in TARGET_FIELDS)
    # the truth is where the loss looks for it
    t = np.argmax(batch.is_target, axis=1)
    rows = np.arange(batch.batch_size)
    np.testing.assert_array_equal(a["target_numeric"], batch.numeric_values[rows, t])
    np.testing.assert_array_equal(a["target_is_null"], batch.is_null[rows, t])
    assert not a["is_null"][batch.is_target].any() and not a["numeric_values"][batch.is_target].any()


def test_target_value_does_not_leak_into_the_outputs():
    db = tiny_db()
    batch = tiny_batch(db, task=0, seed=4)
    model = tiny_model()
    a, c = _forward(model, batch, db), _forward(model, _with_other_truth(batch), db)
    for x, y in zip(a, c, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_bf16_forward_is_close_to_fp32():
    db = tiny_db()
    batch = tiny_batch(db, task=1)
    m32 = tiny_model()
    m16 = dataclasses.replace(m32.cfg, compute_dtype="bfloat16")
    from confluence.model.transformer import RelationalTransformer

    mb = RelationalTransformer(m16, key=jax.random.key(0))
    a, c = _forward(m32, batch, db), _forward(mb, batch, db)
    keep = ~batch.is_padding
    err = np.abs(np.asarray(a.h)[keep] - np.asarray(c.h)[keep]).max()
    assert err < 0.1 and np.all(np.isfinite(np.asarray(c.h)))


def _loss_and_grads(cfg, batch, db):
    from confluence.model.config import LossConfig
    from confluence.model.loss import compute_loss
    from confluence.model.transformer import RelationalTransformer

    col, cat = tables(db)
    model = RelationalTransformer(cfg, key=jax.random.key(0))

    def f(m):
        out = m(batch_to_inputs(batch), col, cat)
        return compute_loss(out, batch_to_inputs(batch), m.encoder, cat, LossConfig(max_k=16)).loss

    import equinox as eqx

    loss, g = eqx.filter_jit(eqx.filter_value_and_grad(f))(model)
    return float(loss), [np.asarray(x) for x in jax.tree.leaves(g)]


@pytest.mark.slow
def test_block_sparse_kernel_and_remat_match_the_reference_through_the_model():
    db = tiny_db()
    batch = tiny_batch(db, task=3, seed=2, r=3)
    ref = _loss_and_grads(TINY, batch, db)
    for variant in (dataclasses.replace(TINY, attention_impl="block_sparse"), dataclasses.replace(TINY, remat=True)):
        got = _loss_and_grads(variant, batch, db)
        assert got[0] == pytest.approx(ref[0], rel=1e-5)
        for a, c in zip(ref[1], got[1], strict=True):
            np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("sink", [(), ("inbound",)])
def test_scanned_layers_match_the_unrolled_loop(sink):
    """`model.scan_layers` (one lax.scan over the stacked blocks) computes the same loss and the same per-block
    gradients as the Python loop, with and without remat and with the block-sparse kernel inside the loop, with
    and without attention sinks; the parameters (and so checkpoints) are the same list."""
    db = tiny_db()
    batch = tiny_batch(db, task=1, seed=3, r=3)
    deep = dataclasses.replace(TINY, n_layers=3, attention_sink=sink)
    ref = _loss_and_grads(dataclasses.replace(deep, scan_layers=False), batch, db)
    for variant in (dataclasses.replace(deep, scan_layers=True), dataclasses.replace(deep, scan_layers=True, remat=True),
                    dataclasses.replace(deep, scan_layers=True, attention_impl="block_sparse")):
        got = _loss_and_grads(variant, batch, db)
        assert got[0] == pytest.approx(ref[0], rel=1e-5)
        assert len(got[1]) == len(ref[1])
        for a, c in zip(ref[1], got[1], strict=True):
            np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-6)


def test_run_layers_refuses_to_scan_layers_of_different_structure():
    from confluence.toolkit.layers import Linear, RMSNorm, run_layers

    layers = [RMSNorm(4, 1e-6), Linear(4, 4, key=jax.random.key(0))]
    with pytest.raises(ValueError, match="one structure"):
        run_layers(layers, jax.numpy.ones((2, 4)), lambda layer, h: layer(h), scan=True)
