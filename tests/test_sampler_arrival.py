"""`arrival`: every cell of a row reached through a foreign key carries that key (a global column id) and which way it
was followed, `batch.arrival_code(fk, as_child)`, brute-forced from the store's parent lists; the anchor, labelled
rows, the target and padding carry ARRIVAL_NONE. An order's two couriers (two foreign keys into one table) come in
through their own keys, and the model's encoding tells them apart."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confluence.batch import ARRIVAL_NONE, arrival_code
from confluence.sampler import Sampler
from confluence.sampler.labels import VIA_LABEL
from confluence.sampler.walk import VIA_CHILD, VIA_PARENT
from confluence.store import Store
from confluence.stypes import SemanticType
from tests.fixtures.configs import seed_sampler
from tests.fixtures.graphs import random_store

CFG = seed_sampler(batch_size=8, seq_len=256, max_rows=48, recent=8)


@pytest.fixture(scope="module")
def couriers_store(tmp_path_factory) -> Store:
    """A small planted database with couriers: every order references two courier rows (`courier_id`,
    `relay_courier_id`)."""
    from confluence.preprocess.pipeline import preprocess
    from confluence.synth.planted import PlantedSpec, write_planted
    from tests.fixtures.bookstore import HashEncoder

    root = tmp_path_factory.mktemp("couriers")
    db = write_planted(root / "db", PlantedSpec(seed=3, customers=80, stores=4, regions=2, orders_per_customer=6.0,
                                                couriers=5))
    return Store.open(preprocess(db / "raw", db / "planted.metadata.json", root / "store",
                                 encoder=HashEncoder(16), progress=False))


def _edges(store: Store, child: int, parent: int, skip: frozenset[int] = frozenset()) -> list[int]:
    """The foreign-key columns through which `child` references `parent`, in edge order (brute force)."""
    pc = np.asarray(store.parent_column)
    ptr, idx = np.asarray(store.parent_indptr), np.asarray(store.parent_indices)
    return [int(pc[e]) for e in range(ptr[child], ptr[child + 1]) if idx[e] == parent and int(pc[e]) not in skip]


def _check(store: Store, res, cut: frozenset[int] = frozenset()) -> int:
    """Every real cell's arrival equals the brute-force code of its row; returns how many rows came through a key."""
    batch, checked = res.batch, 0
    for b in range(batch.batch_size):
        assert batch.arrival[b, 0] == ARRIVAL_NONE  # the target cell
        assert (batch.arrival[b, batch.is_padding[b]] == ARRIVAL_NONE).all()
        for i in range(int(res.nrows[b])):
            cells = (batch.seq_row_ids[b] == i) & ~batch.is_padding[b]
            cells[0] = False
            if not cells.any():
                continue
            got = np.unique(batch.arrival[b, cells])
            assert got.size == 1, (b, i)  # one arrival per row
            via, r = int(res.via[b, i]), int(res.rows[b, i])
            if via == VIA_PARENT:
                came_from = int(res.rows[b, res.src[b, i]])
                want = arrival_code(_edges(store, came_from, r, cut if res.src[b, i] == 0 else frozenset())[0], False)
            elif via == VIA_CHILD:
                want = arrival_code(_edges(store, r, int(res.rows[b, res.src[b, i]]))[0], True)
            else:  # the anchor, a labelled row
                want = ARRIVAL_NONE
            assert got[0] == want, (b, i, via, got[0], want)
            checked += want != ARRIVAL_NONE
    return checked


def test_an_orders_two_couriers_come_in_through_their_own_keys(couriers_store):
    store = couriers_store
    orders = next(t for t in store.tables if t.name == "orders")
    courier, relay = orders.column("courier_id").column_idx, orders.column("relay_courier_id").column_idx
    s = Sampler([store], CFG)
    res = s.build("orders.handover", np.arange(8))
    assert res.batch.arrival.dtype == np.int32 and _check(store, res) > 8
    couriers = next(t for t in store.tables if t.name == "couriers")
    lo, hi = couriers.row_offset, couriers.row_offset + couriers.num_rows
    for b in range(8):
        # the anchor's two courier rows, reached as its parents, each through its own key
        parents = [i for i in range(int(res.nrows[b])) if res.via[b, i] == VIA_PARENT and res.src[b, i] == 0
                   and lo <= res.rows[b, i] < hi]
        codes = {int(res.batch.arrival[b, np.flatnonzero(res.batch.seq_row_ids[b] == i)[-1]]) for i in parents}
        assert codes == {arrival_code(courier, False), arrival_code(relay, False)}, b


def test_sample_show_names_the_key_each_row_came_in_through(couriers_store):
    from confluence.sampler.show import render_sequence

    s = Sampler([couriers_store], CFG)
    res = s.build("orders.handover", np.arange(2))
    rows = [line for line in render_sequence(res, s.data[0], 0, "orders.handover").splitlines()
            if line.startswith("  r")]
    assert "through" not in rows[0]  # the anchor
    couriers = [line for line in rows if " couriers " in line and " parent " in line and " r0 " in line]
    assert sorted(line.split("through ")[1] for line in couriers) == ["orders.courier_id", "orders.relay_courier_id"]


def test_labels_and_the_anchor_have_no_arrival(couriers_store):
    s = Sampler([couriers_store], dataclasses.replace(CFG, labels=4))
    res = s.build("customer_mean_amount", np.arange(8))
    assert _check(couriers_store, res) > 0
    row_of = res.batch.seq_row_ids
    labelled = (res.via[np.arange(8)[:, None], row_of] == VIA_LABEL) & ~res.batch.is_padding
    anchor = (row_of == 0) & ~res.batch.is_padding
    assert labelled.any() and (res.batch.arrival[labelled] == ARRIVAL_NONE).all()
    assert (res.batch.arrival[anchor] == ARRIVAL_NONE).all()
    assert (res.via == VIA_CHILD).any()  # the customers' orders came in as children


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 23), width=st.integers(1, 4), per_fk=st.booleans())
def test_arrival_equals_brute_force_on_random_databases(seed, width, per_fk):
    store = random_store(seed)
    cfg = seed_sampler(batch_size=6, seq_len=128, width=width, max_rows=64, row_buckets=(8, 64), text_buckets=(8,),
                       width_per_fk=per_fk)
    s = Sampler([store], cfg)
    rng = np.random.default_rng(seed)
    for e in s.entries:
        ids = rng.integers(0, e.task.num_seeds, min(6, e.task.num_seeds))
        _check(store, s.build(e.task.name, ids), frozenset(int(c) for c in e.task.cut_cols))


def test_the_encoder_tells_two_keys_and_the_two_ways_apart():
    import jax
    import jax.numpy as jnp

    from confluence.model.config import ModelConfig
    from confluence.model.encoding import ValueEncoder

    cfg = ModelConfig(d_model=16, n_layers=1, n_heads=2, d_t=8, compute_dtype="float32", arrival_init=1.0)
    assert cfg.arrival and ValueEncoder(dataclasses.replace(cfg, arrival=False), key=jax.random.key(0)).arrival_weight \
        is None
    enc = ValueEncoder(cfg, key=jax.random.key(0))
    b, s_ = 1, 5
    codes = [ARRIVAL_NONE, arrival_code(1, False), arrival_code(2, False), arrival_code(1, True), ARRIVAL_NONE]
    inputs = {"semantic_types": jnp.full((b, s_), int(SemanticType.IDENTIFIER), jnp.int8),
              "is_padding": jnp.array([[False] * 4 + [True]]), "is_null": jnp.zeros((b, s_), bool),
              "is_target": jnp.zeros((b, s_), bool), "column_ids": jnp.zeros((b, s_), jnp.int32),
              "categorical_embed_ids": jnp.zeros((b, s_), jnp.int32), "text_embed_ids": jnp.zeros((b, s_), jnp.int32),
              "text_batch_embeddings": jnp.zeros((4, 8)), "numeric_values": jnp.zeros((b, s_)),
              "timestamp_values": jnp.zeros((b, s_, cfg.d_time)), "bool_values": jnp.zeros((b, s_), bool),
              "row_age": jnp.full((b, s_), -1.0), "child_rank": jnp.full((b, s_), -1, jnp.int16),
              "arrival": jnp.array([codes], jnp.int32)}
    table = jax.random.normal(jax.random.key(1), (3, 8))  # three columns' name embeddings
    h = enc(inputs, table, jnp.zeros((2, 8)))
    base = h[0, 0]
    np.testing.assert_allclose(h[0, 1] - base, table[1] @ enc.arrival_weight + enc.arrival_emb[0], rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(h[0, 3] - base, table[1] @ enc.arrival_weight + enc.arrival_emb[1], rtol=1e-5,
                               atol=1e-5)
    assert not np.allclose(h[0, 1], h[0, 2]) and not np.allclose(h[0, 1], h[0, 3])
    np.testing.assert_array_equal(h[0, 4], 0)  # padding stays zero
    # by default the encoding starts at zero: the model starts as the one without arrival, cell for cell
    plain = ValueEncoder(dataclasses.replace(cfg, arrival=False), key=jax.random.key(0))
    zero = ValueEncoder(dataclasses.replace(cfg, arrival_init=0.0), key=jax.random.key(0))
    assert ModelConfig().arrival_init == 0.0
    np.testing.assert_array_equal(zero(inputs, table, jnp.zeros((2, 8))), plain(inputs, table, jnp.zeros((2, 8))))
