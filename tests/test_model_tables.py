"""A run's per-database tables padded to one shape (`pad_alike`) and the validation subset of a corpus run."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

import confluence.model.inputs as inputs
from confluence.model.inputs import DbTables, batch_to_inputs, pad_alike
from confluence.training.loop import val_subset
from tests.fixtures.model import MAX_K, tiny_batch, tiny_db, tiny_run_config, tiny_trainer


def _tables(db) -> DbTables:
    return DbTables.build(db.name, db.column_embeddings, db.categorical_embeddings, db.max_k, MAX_K)


def _grown(t: DbTables, columns: int, categories: int) -> DbTables:
    """`t` as if its database had more columns and categories (its tables padded further by hand)."""
    col = np.zeros((columns, t.column_embeddings.shape[1]), np.float16)
    col[: t.column_embeddings.shape[0]] = t.column_embeddings
    cat = np.zeros((categories, t.categorical_embeddings.shape[1]), np.float16)
    cat[: t.categorical_embeddings.shape[0]] = t.categorical_embeddings
    return dataclasses.replace(t, name="bigger", column_embeddings=col, categorical_embeddings=cat)


def test_pad_alike_gives_one_shape_and_keeps_every_row():
    small = _tables(tiny_db(0))
    big = _grown(_tables(tiny_db(1)), small.column_embeddings.shape[0] * 4, small.categorical_embeddings.shape[0] * 2)
    out = pad_alike([small, big])
    assert {t.column_embeddings.shape for t in out} == {big.column_embeddings.shape}
    assert {t.categorical_embeddings.shape for t in out} == {big.categorical_embeddings.shape}
    c, v = small.column_embeddings.shape[0], small.categorical_embeddings.shape[0]
    assert np.array_equal(out[0].column_embeddings[:c], small.column_embeddings)
    assert np.array_equal(out[0].categorical_embeddings[:v], small.categorical_embeddings)
    assert not out[0].column_embeddings[c:].any() and not out[0].categorical_embeddings[v:].any()
    assert out[1].column_embeddings is big.column_embeddings  # already the largest: not copied
    assert (out[0].num_columns, out[0].num_categories, out[0].max_k) == (small.num_columns, small.num_categories,
                                                                          small.max_k)
    assert pad_alike([]) == []


def test_pad_alike_leaves_tables_alone_when_one_database_is_far_larger(monkeypatch):
    monkeypatch.setattr(inputs, "PAD_ALIKE_MIN_BYTES", 1)
    small = [_tables(tiny_db(i)) for i in range(4)]
    huge = _grown(small[0], small[0].column_embeddings.shape[0], small[0].categorical_embeddings.shape[0] * 64)
    out = pad_alike([*small, huge])
    assert [t.categorical_embeddings.shape for t in out] == [t.categorical_embeddings.shape for t in [*small, huge]]


def test_padded_tables_give_the_same_loss():
    """Padding rows are zeros no id points at: the loss of a batch is the same with the run's common shape."""
    cfg = tiny_run_config()
    tr = tiny_trainer(cfg)
    db = tiny_db()
    t = _tables(db)
    grown = pad_alike([t, _grown(t, t.column_embeddings.shape[0] * 2, t.categorical_embeddings.shape[0] * 4)])[0]
    assert grown.categorical_embeddings.shape[0] > t.categorical_embeddings.shape[0]
    from confluence.model.transformer import RelationalTransformer

    params, _ = tr.init_state(RelationalTransformer(cfg.model, key=jax.random.key(0)))
    for task in range(3):
        x = batch_to_inputs(tiny_batch(db, task=task))
        a, wa = tr.eval_loss(params, x, t.column_embeddings, t.categorical_embeddings)
        b, wb = tr.eval_loss(params, x, grown.column_embeddings, grown.categorical_embeddings)
        assert float(wa) == float(wb) > 0
        assert float(a) == pytest.approx(float(b), rel=1e-6, abs=1e-7)


def test_val_subset_is_evenly_spaced_and_bounded():
    assert val_subset(10, 0) is None and val_subset(10, 10) is None and val_subset(3, 16) is None
    assert val_subset(10, 4) == {0, 2, 5, 7}
    picked = val_subset(393, 16)
    assert len(picked) == 16 and min(picked) == 0 and max(picked) < 393
