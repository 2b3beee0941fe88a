"""`child_rank`: every cell of a row reached as a child carries how many of its parent's children through the same
foreign key are newer and visible at the observation time (0: the latest), exactly; unknown (-1) on the anchor,
parents, labelled rows, rows without a time and every cell of a timestamp cell task; all unknown unless
`sampler.child_rank` (which a run whose model reads ranks turns on). And the model's encoding."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confluence.batch import CHILD_RANK_UNKNOWN
from confluence.sampler import Sampler
from confluence.sampler.labels import VIA_LABEL
from confluence.sampler.walk import VIA_CHILD
from confluence.store import Store
from confluence.store.format import NO_CUTOFF, NULL_TIME, STATIC_TIME
from confluence.stypes import SemanticType
from tests.fixtures.configs import seed_sampler
from tests.fixtures.graphs import random_store

CFG = seed_sampler(batch_size=8, seq_len=256, max_rows=48, recent=8, child_rank=True)


@pytest.fixture(scope="module")
def store(small_planted_store) -> Store:
    return small_planted_store


def _brute_rank(store: Store, row: int, parent: int, obs: int) -> int:
    """Rows referencing `parent` through the first foreign key that links `row` to it, with a time in (row's time,
    obs] (every time but NULL without a cut-off), from the parent CSR."""
    pc = np.asarray(store.parent_column)
    ptr, idx = np.asarray(store.parent_indptr), np.asarray(store.parent_indices)
    fk = next(int(pc[e]) for e in range(ptr[row], ptr[row + 1]) if idx[e] == parent)
    rt = np.asarray(store.row_time)
    hi = obs if obs != NO_CUTOFF else NULL_TIME - 1
    n = 0
    for r in range(store.num_rows):
        for e in range(ptr[r], ptr[r + 1]):
            if idx[e] == parent and pc[e] == fk and rt[row] < rt[r] <= hi:
                n += 1
    return n


def _check(store: Store, res, ages_on: bool = True) -> int:
    """Every real cell's rank equals the brute-force rank of its row (unknown where the rule says so); returns how
    many known ranks were checked."""
    batch, checked = res.batch, 0
    rt = np.asarray(store.row_time)
    for b in range(batch.batch_size):
        obs = int(batch.obs_times[b])
        for i in range(int(res.nrows[b])):
            cells = (batch.seq_row_ids[b] == i) & ~batch.is_padding[b]
            cells[0] = False  # the target cell: no row of its own
            if not cells.any():
                continue
            r = int(res.rows[b, i])
            got = np.unique(batch.child_rank[b, cells])
            assert got.size == 1, (b, i)  # one rank per row
            if (ages_on and res.via[b, i] == VIA_CHILD and rt[r] not in (STATIC_TIME, NULL_TIME)):
                want = _brute_rank(store, r, int(res.rows[b, res.src[b, i]]), obs)
                assert got[0] == want, (b, i, got[0], want)
                checked += 1
            else:
                assert got[0] == CHILD_RANK_UNKNOWN, (b, i)
        assert (batch.child_rank[b, batch.is_padding[b]] == CHILD_RANK_UNKNOWN).all()
        assert batch.child_rank[b, 0] == CHILD_RANK_UNKNOWN
    return checked


def test_ranks_are_exact_and_the_latest_child_is_zero(store):
    s = Sampler([store], CFG)
    res = s.builders[0].build(s.entry("customer_last_channel").task, np.arange(8))
    assert res.batch.child_rank.dtype == np.int16 and res.batch.child_rank.shape == res.batch.semantic_types.shape
    assert _check(store, res) > 8
    # with recent = 8 each customer's latest order at the observation time is in the context, with rank 0
    for b in range(8):
        kids = np.flatnonzero((res.via[b, : res.nrows[b]] == VIA_CHILD) & (res.src[b, : res.nrows[b]] == 0))
        if kids.size:
            ranks = {int(res.batch.child_rank[b, np.flatnonzero(res.batch.seq_row_ids[b] == i)[0]]) for i in kids}
            assert 0 in ranks and ranks == set(range(len(ranks)))  # latest first: 0, 1, 2, ...


def test_ranks_are_off_unless_asked_for_and_a_model_that_reads_them_asks(store):
    from confluence.model.config import ModelConfig
    from confluence.training.config import RunConfig

    off = dataclasses.replace(CFG, child_rank=False)
    s = Sampler([store], off)
    on = Sampler([store], CFG)
    a = s.build("customer_last_channel", np.arange(8))
    b = on.build("customer_last_channel", np.arange(8))
    assert (a.batch.child_rank == CHILD_RANK_UNKNOWN).all() and (b.batch.child_rank >= 0).any()
    for f in dataclasses.fields(a.batch):  # the same batch otherwise
        if f.name != "child_rank":
            np.testing.assert_array_equal(getattr(a.batch, f.name), getattr(b.batch, f.name), err_msg=f.name)
    # without counts or ranks the builder keeps no per-foreign-key copy of the child lists
    assert s.builders[0]._cnt_segs is s.builders[0]._segs
    assert RunConfig(model=ModelConfig(child_rank=True), sampler=off).sampler.child_rank
    assert not RunConfig(sampler=off).sampler.child_rank
    with pytest.raises(Exception, match="child_rank"):
        seed_sampler(child_rank="yes")


def test_timestamp_cell_tasks_and_labels_have_no_ranks(store):
    s = Sampler([store], dataclasses.replace(CFG, labels=4))
    task = s.entry("orders.late").task
    ts_task = dataclasses.replace(task, target_stype=int(SemanticType.TIMESTAMP), is_derived=False)
    batch = s.builders[0].build(ts_task, np.arange(8)).batch
    assert (batch.child_rank == CHILD_RANK_UNKNOWN).all()
    res = s.build("customer_mean_amount", np.arange(8))
    assert _check(store, res) > 0
    labelled = res.via[np.arange(8)[:, None], res.batch.seq_row_ids] == VIA_LABEL
    labelled &= ~res.batch.is_padding
    assert labelled.any() and (res.batch.child_rank[labelled] == CHILD_RANK_UNKNOWN).all()


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 23), width=st.integers(1, 4), recent=st.integers(0, 1), per_fk=st.booleans())
def test_ranks_equal_brute_force_on_random_databases(seed, width, recent, per_fk):
    store = random_store(seed)
    cfg = seed_sampler(batch_size=6, seq_len=128, width=width, recent=min(recent, width), max_rows=64,
                        row_buckets=(8, 64), text_buckets=(8,), width_per_fk=per_fk, child_rank=True)
    s = Sampler([store], cfg)
    rng = np.random.default_rng(seed)
    for e in s.entries:
        ids = rng.integers(0, e.task.num_seeds, min(6, e.task.num_seeds))
        res = s.build(e.task.name, ids)
        ts_cell = not e.task.is_derived and int(e.task.target_stype) == int(SemanticType.TIMESTAMP)
        _check(store, res, ages_on=not ts_cell)


def test_rank_buckets_and_the_encoder_reads_them():
    import jax
    import jax.numpy as jnp

    from confluence.model.config import ModelConfig
    from confluence.model.encoding import N_RANK_BUCKETS, ValueEncoder, rank_buckets

    r = jnp.array([-1, 0, 1, 7, 8, 15, 16, 31, 32, 63, 64, 1000, 32767])
    oh = rank_buckets(r, jnp.float32)
    assert oh.sum(-1).tolist() == [0] + [1] * 12
    assert oh.argmax(-1).tolist()[1:] == [0, 1, 7, 8, 8, 9, 9, 10, 10, 11, 11, 11] and N_RANK_BUCKETS == 12
    cfg = ModelConfig(d_model=16, n_layers=1, n_heads=2, d_t=8, child_rank=True, compute_dtype="float32",
                      arrival=False)
    enc = ValueEncoder(cfg, key=jax.random.key(0))
    assert ValueEncoder(dataclasses.replace(cfg, child_rank=False), key=jax.random.key(0)).child_rank_emb is None
    b, s_ = 1, 3
    inputs = {"semantic_types": jnp.full((b, s_), int(SemanticType.IDENTIFIER), jnp.int8),
              "is_padding": jnp.zeros((b, s_), bool), "is_null": jnp.zeros((b, s_), bool),
              "is_target": jnp.zeros((b, s_), bool), "column_ids": jnp.zeros((b, s_), jnp.int32),
              "categorical_embed_ids": jnp.zeros((b, s_), jnp.int32), "text_embed_ids": jnp.zeros((b, s_), jnp.int32),
              "text_batch_embeddings": jnp.zeros((4, 8)), "numeric_values": jnp.zeros((b, s_)),
              "timestamp_values": jnp.zeros((b, s_, cfg.d_time)), "bool_values": jnp.zeros((b, s_), bool),
              "row_age": jnp.full((b, s_), -1.0), "child_rank": jnp.array([[-1, 0, 9]], jnp.int16)}
    h = enc(inputs, jnp.zeros((2, 8)), jnp.zeros((2, 8)))
    base = h[0, 0]
    np.testing.assert_allclose(h[0, 1] - base, enc.child_rank_emb[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h[0, 2] - base, enc.child_rank_emb[8], rtol=1e-5, atol=1e-6)


def test_sample_show_prints_each_child_rows_rank(store):
    from confluence.sampler.show import render_sequence

    s = Sampler([store], CFG)
    res = s.build("customer_last_channel", np.arange(8))
    text = render_sequence(res, s.data[0], 0, "customer_last_channel")
    rows = [line for line in text.splitlines() if line.startswith("  r")]
    child = [line for line in rows if " child " in line and " orders " in line]
    assert child and all("rank " in line for line in child) and any("rank 0 " in line for line in child)
    assert not any("rank" in line for line in rows if " parent " in line or " seed " in line)
