"""`row_age`: every cell carries its row's age at the observation time, in days, exactly; unknown (-1) where a row
has no time, a sequence has no cut-off, or the task's target is a timestamp cell. And the model's encoding of it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from confluence.batch import ROW_AGE_UNKNOWN
from confluence.sampler import Sampler
from confluence.store import Store
from confluence.store.format import NO_CUTOFF, NULL_TIME, STATIC_TIME
from confluence.stypes import SemanticType
from tests.fixtures.configs import seed_sampler

CFG = seed_sampler(batch_size=8, seq_len=256, max_rows=48, recent=8)


@pytest.fixture(scope="module")
def store(small_planted_store) -> Store:
    return small_planted_store


def _expected(store: Store, res, b: int) -> tuple[np.ndarray, np.ndarray]:
    """Each cell's expected age (from the store's row times and the observation time) and which cells to check."""
    batch = res.batch
    rows = res.rows[b, batch.seq_row_ids[b]]
    rt = np.asarray(store.row_time)[rows]
    obs = batch.obs_times[b]
    has = (rt != STATIC_TIME) & (rt != NULL_TIME) & (obs != NO_CUTOFF)
    want = np.where(has, (obs - rt) / 86_400_000_000.0, ROW_AGE_UNKNOWN).astype(np.float32)
    real = ~batch.is_padding[b]
    real[0] = False  # the target cell has no row of its own; checked below
    return want, real


def test_derived_task_ages_are_exact_and_never_negative(store):
    s = Sampler([store], CFG)
    res = s.builders[0].build(s.entry("customer_orders_30d").task, np.arange(8))
    batch = res.batch
    assert batch.row_age.dtype == np.float32 and batch.row_age.shape == batch.semantic_types.shape
    seen_known = 0
    for b in range(8):
        want, real = _expected(store, res, b)
        np.testing.assert_allclose(batch.row_age[b, real], want[real], rtol=1e-6, atol=1e-4)
        known = batch.row_age[b][batch.row_age[b] != ROW_AGE_UNKNOWN]
        assert (known >= 0).all()  # no row after the observation time is ever shown
        seen_known += known.size
        assert (batch.row_age[b, batch.is_padding[b]] == ROW_AGE_UNKNOWN).all()
    assert seen_known > 0  # the orders of the context have ages


def test_no_cutoff_and_timestamp_cell_tasks_have_no_ages(store):
    s = Sampler([store], CFG)
    static = s.builders[0].build(s.entry("customers.tier").task, np.arange(8)).batch
    assert (static.obs_times == NO_CUTOFF).all()
    assert (static.row_age == ROW_AGE_UNKNOWN).all()
    # a timestamp cell task: its observation time is the anchor's own time, which may be the target itself
    task = s.entry("orders.late").task
    ts_task = dataclasses.replace(task, target_stype=int(SemanticType.TIMESTAMP), is_derived=False)
    batch = s.builders[0].build(ts_task, np.arange(8)).batch
    assert (batch.row_age == ROW_AGE_UNKNOWN).all()
    # the same task as it is (a boolean cell task of a temporal table) has ages, 0 on the anchor row
    own = s.builders[0].build(task, np.arange(8)).batch
    anchor = (own.seq_row_ids == 0) & ~own.is_padding & ~own.is_target
    assert (own.row_age[anchor] == 0).all()


def test_age_features_ramp_between_knots_and_vanish_when_unknown():
    import jax.numpy as jnp

    from confluence.model.encoding import AGE_KNOTS_DAYS, N_AGE_FEATURES, age_features

    f = np.asarray(age_features(jnp.asarray([ROW_AGE_UNKNOWN, 0.0, 29.0, 31.0, 1e5], jnp.float32)))
    assert f.shape == (5, N_AGE_FEATURES)
    assert (f[0] == 0).all()  # unknown: no contribution at all (seed behaviour on static rows)
    assert f[1, -1] == 1 and (f[1, :-1] == 0).all()
    i30 = AGE_KNOTS_DAYS.index(30.0)
    assert f[2, i30] == 0 and f[3, i30] > 0  # "older than 30 days" is one feature's threshold
    assert (f[4, : len(AGE_KNOTS_DAYS) - 1] == 1).all() and f[4, -2] > f[3, -2]
    assert (np.diff(f[1:, :-1], axis=0) >= 0).all()  # monotone in the age
