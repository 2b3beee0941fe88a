"""The link kind's LightGBM ranker: its candidates and pair features read only links known at the observation time,
its popularity ranks are the popularity baseline's, and on the bookstore's link task it trains and ranks k rows per
seed, scored beside the baselines with a paired interval."""

from __future__ import annotations

import numpy as np
import pytest

from confluence.cli.eval_cmds import link_results_lines
from confluence.evaluation.link_gbdt import PAIR_FEATURES, candidate_labels, candidate_pairs
from confluence.evaluation.links import link_split_ids, run_link_baselines
from confluence.preprocess.pipeline import preprocess
from confluence.store import Store
from confluence.targets import link as L
from tests.fixtures.bookstore import HashEncoder, write_bookstore, write_metadata
from tests.test_links import meta_with

TASK = "customer_books"


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Store:
    tmp = tmp_path_factory.mktemp("link_gbdt")
    path = preprocess(write_bookstore(tmp, size="small"), write_metadata(tmp, meta_with()), tmp / "store",
                      encoder=HashEncoder(8), progress=False)
    return Store.open(path)


def _args(arr, targets=None):
    return (np.asarray(arr.anchor_row), np.asarray(arr.obs_time), np.asarray(arr.offsets),
            np.asarray(arr.targets if targets is None else targets))


def test_candidate_features_are_leak_free(store):
    """A seed observed at T gets the same candidates and pair features whatever the links of seeds observed after
    T - horizon are. Checked at every test observation time, the later links replaced by random rows."""
    info, arr = store.link_task(TASK), store.link_arrays(TASK)
    test_ids = link_split_ids(store, TASK, "test")
    obs = np.asarray(arr.obs_time)
    books = store.table("books")
    seed_time = np.repeat(obs, np.diff(arr.offsets))
    rng = np.random.default_rng(0)
    for t in np.unique(obs[test_ids]):
        ids = test_ids[obs[test_ids] == t]
        before = candidate_pairs(*_args(arr), info.horizon_us, ids, n_popular=5, n_recent=5)
        targets = np.array(arr.targets).copy()
        future = seed_time > t - info.horizon_us
        assert future.any()
        targets[future] = rng.integers(books.row_offset, books.row_offset + books.num_rows, int(future.sum()))
        after = candidate_pairs(*_args(arr, targets), info.horizon_us, ids, n_popular=5, n_recent=5)
        assert len(before.row) > 0
        np.testing.assert_array_equal(before.group, after.group)
        np.testing.assert_array_equal(before.row, after.row)
        np.testing.assert_array_equal(before.x, after.x)  # NaN == NaN here


def test_popularity_ranks_are_the_baselines(store):
    info, arr = store.link_task(TASK), store.link_arrays(TASK)
    ids = link_split_ids(store, TASK, "val")
    books = store.table("books")
    k = info.k
    cands = candidate_pairs(*_args(arr), info.horizon_us, ids, n_popular=k, n_recent=k)
    pop = L.popularity(*_args(arr), info.horizon_us, (books.row_offset, books.row_offset + books.num_rows), ids, k)
    rank = cands.x[:, PAIR_FEATURES.index("pair:popularity_rank")]
    for i in range(len(ids)):
        mine = (cands.group == i) & (rank <= k)
        ranked = cands.row[mine][np.argsort(rank[mine])]
        assert ranked.tolist() == pop[i][pop[i] >= 0].tolist()


def test_pair_features_by_hand():
    # anchor 0: seeds at t=0 (targets 10, 11), t=5 (11); anchor 1: t=0 (13); horizon 2; seed 2 (anchor 0, t=9)
    # knows the links of seeds up to t=7: 10, 11, 11, 13
    anchor, obs = np.array([0, 0, 0, 1]), np.array([0, 5, 9, 0])
    offsets, targets = np.array([0, 2, 3, 4, 5]), np.array([10, 11, 11, 12, 13])
    c = candidate_pairs(anchor, obs, offsets, targets, 2, np.array([2]), n_popular=3, n_recent=3)
    assert c.row.tolist() == [10, 11, 13] and c.group.tolist() == [0, 0, 0]
    day = 86_400_000_000
    nan = np.nan
    expect = np.array([
        # popularity, its rank, recent (t in (5, 7]: none), its rank, anchor's links, their rank, days since, known
        [1, 2, 0, nan, 1, 2, 9 / day, 3],
        [2, 1, 0, nan, 2, 1, 4 / day, 3],
        [1, 3, 0, nan, 0, nan, nan, 3],
    ])
    np.testing.assert_allclose(c.x, expect)
    assert candidate_labels(c, offsets, targets, np.array([2])).tolist() == [0, 0, 0]  # seed 2's truth is {12}
    # two popular rows only: the anchor's own targets stay candidates
    assert candidate_pairs(anchor, obs, offsets, targets, 2, np.array([2]), n_popular=1, n_recent=0).row.tolist() \
        == [10, 11]


def test_the_ranker_trains_and_is_scored_beside_the_baselines(store):
    res = run_link_baselines(store, split="test", gbdt=True)[TASK]
    info = store.link_task(TASK)
    assert set(res) >= {"gbdt", "gbdt_vs_best_baseline", "popularity", "baseline"}
    for m in L.METRICS:
        assert 0.0 <= res["gbdt"][m] <= 1.0
    assert res["gbdt"]["n"] == res["popularity"]["n"] > 0
    c = res["gbdt_vs_best_baseline"]
    assert c["baseline"] == res["baseline"]["name"] and c["ci_low"] <= c["diff"] <= c["ci_high"]
    assert res["info"]["gbdt"]["n_train_pairs"] > 0
    assert any("GBDT" in line for line in link_results_lines({TASK: res}, "t"))

    from confluence.evaluation.link_gbdt import fit_link_gbdt

    ids = link_split_ids(store, TASK, "test")
    out = fit_link_gbdt(store, TASK, link_split_ids(store, TASK, "train"), ids, max_train=200, num_boost_round=5)
    books = store.table("books")
    assert out.predictions.shape == (len(ids), info.k)
    assert {n.split(":", 1)[0] for n in out.feature_names} >= {"pair", "bridge", "anchor", "cand"}
    ok = out.predictions[out.predictions >= 0]
    assert ((ok >= books.row_offset) & (ok < books.row_offset + books.num_rows)).all()
    for row in out.predictions:  # no row twice in a seed's list
        assert len(set(row[row >= 0].tolist())) == int((row >= 0).sum())


def test_bridge_counts_are_the_orders_up_to_the_observation_time(store):
    """A customer's orders of a book by T (time <= T; the bridge between customers and books), counted and dated
    as a direct query over the source tables counts them, and none from after T."""
    import duckdb

    from confluence.evaluation.gbdt import FeatureBuilder
    from tests.fixtures.bookstore import bookstore_tables

    arr = store.link_arrays(TASK)
    ids = link_split_ids(store, TASK, "test")[:40]
    anchors, obs = np.asarray(arr.anchor_row)[ids], np.asarray(arr.obs_time)[ids]
    (name, got), = FeatureBuilder(store).bridge_links("customers", "books", anchors, obs)
    assert name == "orders.customer_id->orders.book_id"
    cust, books = store.table("customers"), store.table("books")
    cust_keys, book_keys = store.keys("customers").to_pylist(), store.keys("books").to_pylist()
    con = duckdb.connect()
    con.register("orders", bookstore_tables("small")["orders"])
    expect = {}
    for i, (a, t) in enumerate(zip(anchors, obs, strict=True)):
        for book, n, last in con.execute(
                "SELECT book_id, count(*), epoch_us(max(ordered_at)) FROM orders WHERE customer_id = ? AND "
                "epoch_us(ordered_at) <= ? GROUP BY book_id", [cust_keys[a - cust.row_offset], int(t)]).fetchall():
            expect[(i, book)] = (n, last)
    rows = {(int(s), book_keys[r - books.row_offset]): (int(n), int(last))
            for s, r, n, last in zip(got["seed"], got["row"], got["count"], got["last"], strict=True)}
    assert rows == expect and len(rows) > 0
