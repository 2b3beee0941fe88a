"""The walk and the batch tensors on the worked example of seed 000 section 4, and walk properties on random databases."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from confluence.preprocess.encode import encode_timestamp
from confluence.sampler.sampler import Sampler
from confluence.sampler.walk import VIA_CHILD, VIA_PARENT, VIA_SEED
from confluence.stypes import SemanticType
from tests.fixtures.configs import seed_sampler
from tests.fixtures.graphs import DAY, local_row, random_store, walk_example

CFG = seed_sampler(batch_size=4, seq_len=128, width=16, max_rows=32, row_buckets=(8, 16, 32), text_buckets=(4, 16))


def _local_of(res, b):
    return {int(r): i for i, r in enumerate(res.rows[b, : res.nrows[b]])}


def _orders(store, ids=(1, 7, 12, 5, 99)):
    return {oid: local_row(store, "orders", oid) for oid in ids}


def test_walk_example_fk_adj_and_visibility():
    store = walk_example()
    cust23, book42 = local_row(store, "customers", 23), local_row(store, "books", 42)
    order = _orders(store)
    res = Sampler([store], CFG).build("rating", np.array([0]))
    loc = _local_of(res, 0)
    # exactly the six rows of the example: order 99 is after order 1's observation time
    assert set(loc) == {order[1], cust23, book42, order[7], order[12], order[5]}
    assert res.rows[0, 0] == order[1]  # the seed first
    assert set(res.rows[0, 1:3]) == {cust23, book42}  # parents first
    adj = res.batch.fk_adj[0]
    edges = {(int(res.rows[0, i]), int(res.rows[0, j])) for i, j in zip(*np.nonzero(adj), strict=True)}
    assert edges == {(order[1], cust23), (order[1], book42), (order[7], cust23), (order[12], cust23), (order[5], book42)}
    g = {v: k for k, v in loc.items()}  # local -> global

    def outbound(row):
        i = loc[row]
        return {g[j] for j in range(len(loc)) if i == j or adj[i, j]}

    def inbound(row):
        i = loc[row]
        return {g[j] for j in range(len(loc)) if adj[j, i]}

    assert outbound(order[1]) == {order[1], cust23, book42}
    assert outbound(cust23) == {cust23}
    assert outbound(order[7]) == {order[7], cust23}
    assert inbound(cust23) == {order[1], order[7], order[12]}
    assert inbound(book42) == {order[1], order[5]}
    assert inbound(order[7]) == set()


def _seed_of(store, task, row):
    """The seed index of `task` whose anchor is global row `row`."""
    return int(np.flatnonzero(np.asarray(store.task_arrays(task).anchor_row) == row)[0])


def _z(store, table, column, raw):
    st = next(c for c in store.columns if c.table == table and c.name == column).stats
    return np.float32((raw - st["mean"]) / st["std"])


def test_walk_example_cells_and_target():
    store = walk_example()
    o = _orders(store)
    seeds = [_seed_of(store, "rating", o[1]), _seed_of(store, "rating", o[7])]
    res = Sampler([store], CFG).build("rating", np.array(seeds))
    b = res.batch
    b.validate()
    rating_col = store.task("rating").target_column_idx
    for s in range(2):
        assert b.is_target[s].sum() == 1 and b.is_target[s, 0]
        assert b.column_ids[s, 0] == rating_col and b.semantic_types[s, 0] == SemanticType.NUMERICAL
        # the target column appears once (as the target), not also as a plain cell of the anchor row
        anchor_cells = b.column_ids[s][(b.seq_row_ids[s] == 0) & ~b.is_padding[s]]
        assert (anchor_cells == rating_col).sum() == 1
    assert b.numeric_values[0, 0] == _z(store, "orders", "rating", 4.0) and not b.is_null[0, 0]
    # order 7 has rating 5.0; order 12's NULL rating is a null cell elsewhere
    assert b.numeric_values[1, 0] == _z(store, "orders", "rating", 5.0)
    assert not b.is_padding[0, : res.n_real[0]].any() and b.is_padding[0, res.n_real[0] :].all()
    # NULL foreign keys have no cell: order 7 (local row of seq 0) has no book_id cell
    loc = _local_of(res, 0)
    o7 = loc[o[7]]
    book_fk = [c.column_idx for c in store.columns if c.table == "orders" and c.name == "book_id"][0]
    assert book_fk not in b.column_ids[0][(b.seq_row_ids[0] == o7) & ~b.is_padding[0]]


def test_derived_boolean_target_and_exclusion():
    store = walk_example()
    o = _orders(store)
    seeds = [_seed_of(store, "will_reorder", o[k]) for k in (1, 7, 12)]  # orders 0, 1, 2 of the example
    res = Sampler([store], CFG).build("will_reorder", np.array(seeds))
    b = res.batch
    tcol = store.task("will_reorder").target_column_idx
    assert (b.column_ids[:3, 0] == tcol).all() and b.target_stype == SemanticType.BOOLEAN
    assert list(b.bool_values[:3, 0]) == [True, False, False]
    assert (b.column_ids[b.is_target] == tcol).all()


def test_derived_timestamp_target():
    store = walk_example()
    o = _orders(store)
    seeds = [_seed_of(store, "next_order_at", o[1]), _seed_of(store, "next_order_at", o[12])]
    b = Sampler([store], CFG).batch_for_seeds("next_order_at", np.array(seeds))
    assert b.target_stype == SemanticType.TIMESTAMP
    np.testing.assert_array_equal(b.timestamp_values[0, 0], encode_timestamp(np.array([11 * DAY]),
                                                                             *store.timestamp_stats)[0])
    assert b.is_null[1, 0] and not b.timestamp_values[1, 0].any()  # order 12's target is NULL


def test_categorical_target_block():
    store = walk_example()
    b = Sampler([store], CFG).batch_for_seeds("country", np.array([0]))
    ti = store.task("country")
    assert b.cat_block_start == ti.cat_block_start and b.cat_count == ti.cat_count == 1  # the one country, 1
    assert b.categorical_embed_ids[0, 0] == ti.cat_block_start
    assert list(b.seq_valid) == [True, False, False, False]


def test_width_bound():
    store = walk_example(extra_orders=60)
    res = Sampler([store], seed_sampler(batch_size=1, seq_len=4096, width=5, max_rows=256)).build(
        "country", np.array([0])
    )
    # the customer is the seed (no cut-off): 5 of its 65 orders, then book 42 (their parent) and 5 of its orders
    n = res.nrows[0]
    from_seed = (res.via[0, :n] == VIA_CHILD) & (res.src[0, :n] == 0)
    assert from_seed.sum() == 5
    for i in range(n):
        assert ((res.via[0, :n] == VIA_CHILD) & (res.src[0, :n] == i)).sum() <= 5


def _check_walk(store, res, seq_len, width, max_rows, cut=frozenset(), per_fk=False):
    """Walk invariants; `cut`: the task's columns whose parent edges from the anchor row are cut."""
    d_rt = store.row_time
    pptr, pidx, pcol = store.parent_indptr, store.parent_indices, store.parent_column
    cptr, cidx = store.child_indptr, store.child_indices
    for b in range(res.rows.shape[0]):
        n = int(res.nrows[b])
        rows = res.rows[b, :n]
        obs = res.batch.obs_times[b]
        assert rows[0] == res.batch.anchor_rows[b] and res.via[b, 0] == VIA_SEED
        assert len(set(rows.tolist())) == n  # each row at most once
        assert n <= max_rows
        # temporal leakage: no context row after the observation time
        assert (d_rt[rows[1:]] <= obs).all()
        pos = {int(r): i for i, r in enumerate(rows)}
        # every row was reached through a real edge of the row named in `src`
        for i in range(1, n):
            j = int(res.src[b, i])
            assert 0 <= j < i
            if res.via[b, i] == VIA_PARENT:
                lo, hi = pptr[rows[j]], pptr[rows[j] + 1]
                ok = [e for e in range(lo, hi) if pidx[e] == rows[i] and not (j == 0 and int(pcol[e]) in cut)]
                assert ok, (b, i)  # a real edge, and never one the task cut
            else:
                assert rows[i] in cidx[cptr[rows[j]] : cptr[rows[j] + 1]]
        # width: at most `width` children reached through any one row (per child table with `per_fk`: the random
        # databases have at most one foreign key from one table to another)
        kids = res.via[b, :n] == VIA_CHILD
        table = np.searchsorted(np.array([t.row_offset for t in store.tables]), rows, side="right")
        for j in range(n):
            from_j = kids & (res.src[b, :n] == j)
            per_group = np.bincount(table[from_j]) if per_fk else np.array([from_j.sum()])
            assert (per_group <= width).all()
        # parents first: after row j, every visible parent of j is visited before any later child-heap row
        child_pos = [i for i in range(n) if res.via[b, i] == VIA_CHILD]

        def visible_parents(j, rows=rows, obs=obs):
            lo, hi = pptr[rows[j]], pptr[rows[j] + 1]
            return [int(pidx[e]) for e in range(lo, hi)
                    if d_rt[pidx[e]] <= obs and not (j == 0 and int(pcol[e]) in cut)]

        for j in range(n):
            nxt = [i for i in child_pos if i > j]
            for p in visible_parents(j):
                if nxt:
                    assert int(p) in pos and pos[int(p)] < nxt[0], (b, j, p)
        # fewest hops: child-heap rows come out in non-decreasing hop order
        hops = res.hops[b, child_pos]
        assert (np.diff(hops) >= 0).all()
        # the stop rule: S cells reached, R capped, or the frontier was empty (then every parent is in)
        assert res.n_real[b] <= seq_len
        if res.n_real[b] < seq_len and n < max_rows:
            for j in range(n):
                for p in visible_parents(j):
                    assert p in pos


@given(seed=st.integers(0, 23), width=st.integers(0, 4), seq_len=st.sampled_from([16, 64, 512]),
       recent=st.integers(0, 4), per_fk=st.booleans())
def test_walk_properties_random_databases(seed, width, seq_len, recent, per_fk):
    store = random_store(seed)
    recent = min(recent, width)
    cfg = seed_sampler(batch_size=6, seq_len=seq_len, width=width, recent=recent, max_rows=64, row_buckets=(8, 64),
                        text_buckets=(8,), width_per_fk=per_fk)
    s = Sampler([store], cfg)
    segs = s.data[0].child_segments(per_fk)
    rng = np.random.default_rng(seed)
    for e in s.entries:
        ids = rng.integers(0, e.task.num_seeds, min(6, e.task.num_seeds))
        res = s.build(e.task.name, ids)
        res.batch.validate()
        _check_walk(store, res, seq_len, width, 64, cut=frozenset(int(c) for c in e.task.cut_cols), per_fk=per_fk)
        if recent:
            _check_recent(segs, res, recent)
            _check_recent_first(segs, res, recent)


def _segments_of(segs, r):
    """Row r's child segments as (lo, hi) edge ranges."""
    return [(int(segs.seg_off[g]), int(segs.seg_off[g + 1])) for g in range(segs.seg_ptr[r], segs.seg_ptr[r + 1])]


def _check_recent(segs, res, recent):
    """Each visited row's `recent` latest visible children (per segment) were pushed (so visited, unless the walk
    stopped)."""
    for b in range(res.rows.shape[0]):
        n = int(res.nrows[b])
        if res.n_real[b] < res.batch.is_padding.shape[1] and n < 64:  # the walk ran out of frontier
            rows = set(res.rows[b, :n].tolist())
            obs = res.batch.obs_times[b]
            for j in range(n):
                for lo, hi in _segments_of(segs, res.rows[b, j]):
                    k = lo + int(np.searchsorted(segs.c_time[lo:hi], obs, side="right"))
                    for e in range(max(lo, k - recent), k):
                        assert int(segs.c_idx[e]) in rows, (b, j, e)


def _check_recent_first(segs, res, recent):
    """With `recent` > 0, child-heap rows of one hop count come out latest first: the rank of the edge that reached
    each (its age among its source row's visible children of that segment, or "older" beyond `recent`) never
    decreases along the visit order within a hop count."""
    for b in range(res.rows.shape[0]):
        n = int(res.nrows[b])
        obs = res.batch.obs_times[b]
        last = (-1, -1)
        for i in range(1, n):
            if res.via[b, i] != VIA_CHILD:
                continue
            r, j = int(res.rows[b, i]), int(res.src[b, i])
            best = 255
            for lo, hi in _segments_of(segs, res.rows[b, j]):
                k = lo + int(np.searchsorted(segs.c_time[lo:hi], obs, side="right"))
                for e in range(lo, k):
                    if int(segs.c_idx[e]) == r and k - 1 - e < recent:
                        best = min(best, k - 1 - e)
            key = (int(res.hops[b, i]), best)
            assert key >= last, (b, i, key, last)
            last = key


def test_fk_segments_split_children_by_column_keeping_time_order():
    from confluence.sampler.data import fk_segments

    indptr = np.array([0, 5, 5, 7], np.int64)  # row 0: five children through two columns; row 1: none; row 2: two
    column = np.array([3, 4, 3, 4, 4, 7, 7], np.int32)  # edges already time-sorted within each row
    order, seg_ptr, seg_off = fk_segments(indptr, column)
    assert order.tolist() == [0, 2, 1, 3, 4, 5, 6]  # stable: time order kept inside each column
    assert seg_ptr.tolist() == [0, 2, 2, 3]
    assert seg_off.tolist() == [0, 2, 5, 7]


def test_width_per_fk_segments_partition_each_rows_children_by_table():
    """Per column, a row's children are split into time-sorted segments, one per child foreign-key column (here one
    per child table), that together hold exactly the row's children."""
    seed = next(k for k in range(100) if Sampler([random_store(k)], seed_sampler()).data[0]
                .child_segments(True).max_segs >= 2)
    data = Sampler([random_store(seed)], seed_sampler()).data[0]
    per_row, per_col = data.child_segments(False), data.child_segments(True)
    assert per_row.max_segs == 1 and per_col.max_segs >= 2
    for r in range(data.num_rows):
        got = sorted(int(x) for lo, hi in _segments_of(per_col, r) for x in per_col.c_idx[lo:hi])
        assert got == sorted(int(x) for x in per_row.c_idx[per_row.seg_off[r] : per_row.seg_off[r + 1]])
        tables = []
        for lo, hi in _segments_of(per_col, r):
            assert hi > lo and (np.diff(per_col.c_time[lo:hi]) >= 0).all()  # non-empty, time-sorted
            seg_tables = {data.table_of_row(int(x)) for x in per_col.c_idx[lo:hi]}
            assert len(seg_tables) == 1
            tables += seg_tables
        assert len(tables) == len(set(tables))


def test_excluded_foreign_key_cuts_the_anchor_parent_edge():
    """spec/metadata.md: an excluded foreign-key column also cuts that parent edge of the anchor row."""
    store = walk_example(extra_orders=8)
    cust23, book42 = local_row(store, "customers", 23), local_row(store, "books", 42)
    cfg = seed_sampler(batch_size=16, seq_len=512, width=16, max_rows=64)
    res = Sampler([store], cfg).build("whose_order", np.arange(13))
    reached_otherwise = 0
    for b in range(13):
        n = int(res.nrows[b])
        rows = res.rows[b, :n]
        # never reached *from the anchor* through customer_id (it may still come in through another order)
        for i in range(1, n):
            if res.src[b, i] == 0 and res.via[b, i] == VIA_PARENT:
                assert rows[i] != cust23, (b, i)
        loc = _local_of(res, b)
        adj = res.batch.fk_adj[b]
        if cust23 in loc:
            reached_otherwise += 1
            assert not adj[0, loc[cust23]], b  # no anchor -> customer edge even when the customer is in context
        if book42 in loc and store.parent_indptr[rows[0] + 1] - store.parent_indptr[rows[0]] == 2:
            assert adj[0, loc[book42]]  # the other foreign key is kept
    assert reached_otherwise > 0  # the customer did come in through other orders (so the fk_adj check ran)
    # the same seeds on a task without the exclusion do reach the customer from the anchor
    first = _seed_of(store, "will_reorder", local_row(store, "orders", 1))
    plain = Sampler([store], CFG).build("will_reorder", np.array([first]))
    assert plain.rows[0, 1] == cust23 and plain.via[0, 1] == VIA_PARENT


def test_recent_children_are_the_latest_before_the_observation_time():
    store = walk_example(extra_orders=60)
    cust = local_row(store, "customers", 23)
    cptr, cidx, ctime = store.child_indptr, store.child_indices, store.child_time
    kids = cidx[cptr[cust] : cptr[cust + 1]]
    kid_time = ctime[cptr[cust] : cptr[cust + 1]]
    for recent in (0, 2, 5):
        cfg = seed_sampler(batch_size=1, seq_len=4096, width=5, recent=recent, max_rows=256)
        res = Sampler([store], cfg).build("country", np.array([0]))
        n = res.nrows[0]
        got = set(res.rows[0, :n][(res.via[0, :n] == VIA_CHILD) & (res.src[0, :n] == 0)].tolist())
        assert len(got) == 5
        latest = set(kids[np.argsort(kid_time, kind="stable")[len(kids) - recent :]].tolist()) if recent else set()
        assert latest <= got  # the `recent` latest children are always kept, the rest is a uniform draw
        # the customer (no cut-off) has 64 orders; order 99 (day 20) is the latest of all
        assert (local_row(store, "orders", 99) in got) or recent == 0


def test_recent_zero_is_the_uniform_walk_and_recent_is_validated():
    import pytest

    from confluence.errors import ConfluenceError

    store = random_store(3)
    task = store.tasks[0].name
    a = Sampler([store], seed_sampler(batch_size=8, seq_len=64, width=3, max_rows=32)).build(task, np.arange(8))
    b = Sampler([store], seed_sampler(batch_size=8, seq_len=64, width=3, recent=0, max_rows=32)).build(
        task, np.arange(8))
    np.testing.assert_array_equal(a.rows, b.rows)
    with pytest.raises(ConfluenceError, match="recent"):
        seed_sampler(width=4, recent=5)
    with pytest.raises(ConfluenceError, match="width_per_fk"):
        seed_sampler(width_per_fk="yes")


def test_task_recent_overrides_recent_per_task():
    import pytest

    from confluence.errors import ConfluenceError
    from confluence.sampler.config import recent_for

    store = walk_example(extra_orders=60)
    cust = local_row(store, "customers", 23)
    cptr, cidx, ctime = store.child_indptr, store.child_indices, store.child_time
    kids = cidx[cptr[cust] : cptr[cust + 1]]
    latest = set(kids[np.argsort(ctime[cptr[cust] : cptr[cust + 1]], kind="stable")[-5:]].tolist())

    def reached(cfg):
        res = Sampler([store], cfg).build("country", np.array([0]))
        n = res.nrows[0]
        return set(res.rows[0, :n][(res.via[0, :n] == VIA_CHILD) & (res.src[0, :n] == 0)].tolist())

    base = dict(batch_size=1, seq_len=4096, width=5, max_rows=256)
    assert reached(seed_sampler(**base, task_recent={"country": 5})) == latest
    assert reached(seed_sampler(**base, recent=5, task_recent={"walk_example/country": 0})) != latest
    assert reached(seed_sampler(**base, recent=5, task_recent={"rating": 0})) == latest  # another task's setting
    cfg = seed_sampler(**base, recent=1, task_recent={"country": 3, "walk_example/rating": 2})
    assert (recent_for(cfg, "walk_example", "country"), recent_for(cfg, "walk_example", "rating"),
            recent_for(cfg, "other", "rating"), recent_for(cfg, "walk_example", "next_order_at")) == (3, 2, 1, 1)
    with pytest.raises(ConfluenceError, match="task_recent"):
        seed_sampler(width=4, task_recent={"country": 9})
