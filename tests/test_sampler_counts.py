"""Child-count cells (`SamplerConfig.child_counts`): each row shows, per foreign key pointing at its table, how many
rows referenced it at the observation time. Checked against a brute-force count (never a row from after the
observation time), against hand counts on the worked example of seed 000, for the task's cut columns, and for old
stores."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confluence.errors import ConfigError, StoreError
from confluence.sampler.sampler import Sampler
from confluence.store.format import NO_CUTOFF, NULL_TIME, STATIC_TIME
from confluence.stypes import US_PER_DAY, SemanticType
from tests.fixtures.configs import seed_sampler
from tests.fixtures.graphs import local_row, random_store, walk_example
from tests.test_sampler_walk import _check_walk

CFG = seed_sampler(batch_size=4, seq_len=128, width=16, max_rows=32, row_buckets=(8, 16, 32), text_buckets=(4, 16),
                    child_counts="all")


def _count_columns(store, windows: tuple[int, ...] = (), latest: bool = False) -> dict[int, tuple[str, int]]:
    """count column -> (parent table, counted foreign-key column), the all-time ones, those of `windows` and, with
    `latest`, the days since the latest child."""
    return {c.column_idx: (c.count_of["parent_table"], c.count_of["column_idx"])
            for c in store.columns if getattr(c, "count_of", None) and (
                latest if c.count_of.get("latest") else c.count_of.get("window_days", 0) in (0, *windows))}


def _is_latest(store, col: int) -> bool:
    return bool(store.columns[col].count_of.get("latest"))


def _brute_latest_days(store, row: int, fk: int, obs: int) -> float | None:
    """Days from the latest row with a time that references `row` through `fk` at or before `obs` (None: none)."""
    times = [int(store.row_time[r]) for r in range(store.num_rows)
             for e in range(store.parent_indptr[r], store.parent_indptr[r + 1])
             if store.parent_indices[e] == row and store.parent_column[e] == fk]
    times = [t for t in times if t <= obs and t not in (STATIC_TIME, NULL_TIME)]
    return (obs - max(times)) / US_PER_DAY if times else None


def _window_us(store, col: int) -> int:
    return int(store.columns[col].count_of.get("window_days", 0)) * US_PER_DAY


def _brute_count(store, row: int, fk: int, obs: int, window: int = 0) -> int:
    """Rows that reference `row` through foreign-key column `fk` and existed at `obs` (with a `window` in µs: whose
    time is in (obs - window, obs]), from the parent CSR."""
    n = 0
    for r in range(store.num_rows):
        for e in range(store.parent_indptr[r], store.parent_indptr[r + 1]):
            t = int(store.row_time[r])
            if store.parent_indices[e] == row and store.parent_column[e] == fk and t <= obs and (
                    not window or t > obs - window):
                n += 1
    return n


def _check_counts(store, sampler, res, cut: frozenset[int], anchor_only: bool = False,
                  windows: tuple[int, ...] = (), latest: bool = False) -> int:
    """Every count cell equals the brute-force count, sits on a row of its parent table, and each fully shown row
    (the anchor only, `anchor_only`) carries exactly its table's counts minus the cut ones, right after its own
    cells. Returns the cells checked."""
    counts = _count_columns(store, windows, latest)
    data = sampler.data[0]
    cc = data.child_counts(True, windows, latest)
    stats = {int(c): (float(m), float(s)) for c, m, s in zip(cc.col, cc.mean, cc.std, strict=True)}
    tab_of = {t.name: i for i, t in enumerate(store.tables)}
    checked = 0
    b_ = res.batch
    for b in range(b_.column_ids.shape[0]):
        n_real = int(res.n_real[b])
        obs = int(b_.obs_times[b])
        cols, rid = b_.column_ids[b, :n_real], b_.seq_row_ids[b, :n_real]
        for i in range(int(res.nrows[b])):
            row = int(res.rows[b, i])
            t = data.table_of_row(row)
            pos = np.flatnonzero(rid == i)
            shown = [int(c) for c in cols[pos] if int(c) in counts]
            want = [c for c, (pt, fk) in counts.items() if tab_of[pt] == t and fk not in cut
                    and (i == 0 or not anchor_only)]
            if pos.size and pos[-1] < n_real - 1:  # the row is not the one cut at S
                assert shown == sorted(want), (b, i)
                if want:  # the count cells close the row's cells
                    assert all(int(c) in counts for c in cols[pos[-len(want):]])
            for p in pos:
                c = int(cols[p])
                if c not in counts:
                    continue
                assert b_.semantic_types[b, p] == SemanticType.NUMERICAL
                assert counts[c][1] not in cut
                if _is_latest(store, c):  # the days since the latest child: NULL without one or a cut-off
                    days = None if obs == NO_CUTOFF else _brute_latest_days(store, row, counts[c][1], obs)
                    assert bool(b_.is_null[b, p]) == (days is None), (b, i, c)
                    if days is not None:
                        m, s = stats[c]
                        np.testing.assert_allclose(b_.numeric_values[b, p], (np.log1p(days) - m) / s, rtol=1e-5,
                                                   atol=1e-5)
                    checked += 1
                    continue
                if _window_us(store, c) and obs == NO_CUTOFF:  # no observation time: a windowed count is unknown
                    assert b_.is_null[b, p]
                    checked += 1
                    continue
                assert not b_.is_null[b, p]
                m, s = stats[c]
                want_n = _brute_count(store, row, counts[c][1], obs, _window_us(store, c))
                np.testing.assert_allclose(b_.numeric_values[b, p], (np.log1p(want_n) - m) / s, rtol=1e-5, atol=1e-6)
                checked += 1
    return checked


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 23), width=st.integers(0, 4), seq_len=st.sampled_from([16, 64, 512]),
       per_fk=st.booleans(), mode=st.sampled_from(["anchor", "all"]),
       windows=st.sampled_from([(), (1, 30), (7, 90, 365)]), latest=st.booleans())
def test_count_cells_equal_brute_force_counts_at_the_observation_time(seed, width, seq_len, per_fk, mode, windows,
                                                                      latest):
    store = random_store(seed)
    cfg = dataclasses.replace(CFG, batch_size=6, seq_len=seq_len, width=width, max_rows=64, row_buckets=(8, 64),
                              text_buckets=(8,), width_per_fk=per_fk, child_counts=mode, child_count_windows=windows,
                              child_latest=latest)
    s = Sampler([store], cfg)
    rng = np.random.default_rng(seed)
    for e in s.entries:
        ids = rng.integers(0, e.task.num_seeds, min(6, e.task.num_seeds))
        res = s.build(e.task.name, ids)
        res.batch.validate()
        cut = frozenset(int(c) for c in e.task.cut_cols)
        _check_walk(store, res, seq_len, width, 64, cut=cut, per_fk=per_fk)
        _check_counts(store, s, res, cut, anchor_only=mode == "anchor", windows=windows, latest=latest)


def test_walk_example_counts_by_hand_and_never_after_the_observation_time():
    store = walk_example()
    s = Sampler([store], CFG)
    first = int(np.flatnonzero(np.asarray(store.task_arrays("rating").anchor_row) == local_row(store, "orders", 1))[0])
    res = s.build("rating", np.array([first]))  # order 1 at day 10: orders 1, 7, 12 of customer 23 (99: day 20)
    counts = _count_columns(store)
    by_fk = {store.columns[fk].name: c for c, (_, fk) in counts.items()}
    loc = {int(r): i for i, r in enumerate(res.rows[0, : res.nrows[0]])}
    b = res.batch
    cust, book = loc[local_row(store, "customers", 23)], loc[local_row(store, "books", 42)]
    cc = s.data[0].child_counts(True)
    stats = {int(c): (float(m), float(sd)) for c, m, sd in zip(cc.col, cc.mean, cc.std, strict=True)}

    def shown(local_row: int, col: int) -> int:
        p = np.flatnonzero((b.seq_row_ids[0] == local_row) & (b.column_ids[0] == col) & ~b.is_padding[0])
        assert p.size == 1
        m, sd = stats[col]
        return round(float(np.expm1(b.numeric_values[0, p[0]] * sd + m)))

    assert shown(cust, by_fk["customer_id"]) == 3  # orders 1, 7, 12; not 99 (day 20, after the observation)
    assert shown(book, by_fk["book_id"]) == 2  # orders 1 and 5
    # the statistics are log1p of the final counts over the parent table (one customer with 4 orders)
    assert stats[by_fk["customer_id"]] == pytest.approx((np.log1p(4), 1.0))
    assert _check_counts(store, s, res, frozenset()) == 2 * CFG.batch_size  # the filler repeats the seed
    # without a cut-off (the customer's country task) every order counts
    res = s.build("country", np.array([0]))
    p = np.flatnonzero(res.batch.column_ids[0] == by_fk["customer_id"])[0]
    assert res.batch.numeric_values[0, p] == pytest.approx(0.0, abs=1e-6)  # log1p(4), the mean


def test_counts_through_an_excluded_foreign_key_are_not_shown():
    store = walk_example(extra_orders=8)
    s = Sampler([store], dataclasses.replace(CFG, batch_size=16, seq_len=512, max_rows=64))
    res = s.build("whose_order", np.arange(13))
    cut = frozenset(int(c) for c in s.data[0].task("whose_order").cut_cols)
    assert _check_counts(store, s, res, cut) > 0
    customer_count = next(c for c, (_, fk) in _count_columns(store).items() if store.columns[fk].name == "customer_id")
    assert not (res.batch.column_ids == customer_count).any()
    assert (Sampler([store], CFG).build("rating", np.array([0])).batch.column_ids == customer_count).any()


def test_off_by_default_and_validated():
    store = walk_example()
    counts = set(_count_columns(store))
    res = Sampler([store], dataclasses.replace(CFG, child_counts="none")).build("rating", np.arange(4))
    assert not np.isin(res.batch.column_ids, list(counts)).any()
    for bad in (True, "some"):
        with pytest.raises(Exception, match="child_counts.*must be one of 'none', 'anchor', 'all'"):
            Sampler([store], dataclasses.replace(CFG, child_counts=bad))


def test_a_store_without_count_columns_asks_for_preprocessing_again():
    store = copy.copy(walk_example())  # the store read as one preprocessed before count columns existed
    store.columns = [c for c in store.columns if not getattr(c, "count_of", None)]
    Sampler([store], dataclasses.replace(CFG, child_counts="none")).build("rating", np.array([0]))
    with pytest.raises(StoreError, match="preprocess"):
        Sampler([store], CFG)


def test_anchor_mode_leaves_sequences_of_unreferenced_anchors_unchanged():
    """An order is referenced by nothing: with "anchor" its sequences are exactly those of "none"; a customer's
    gain its count cell, and no other row of the sequence shows one."""
    store = walk_example(extra_orders=8)
    counts = set(_count_columns(store))
    none = Sampler([store], dataclasses.replace(CFG, child_counts="none")).build("rating", np.arange(4)).batch
    anchor = Sampler([store], dataclasses.replace(CFG, child_counts="anchor")).build("rating", np.arange(4)).batch
    for f in dataclasses.fields(none):
        np.testing.assert_array_equal(getattr(none, f.name), getattr(anchor, f.name), err_msg=f.name)
    s = Sampler([store], dataclasses.replace(CFG, child_counts="anchor"))
    res = s.build("country", np.array([0]))
    shown = np.isin(res.batch.column_ids[0], list(counts)) & ~res.batch.is_padding[0]
    assert shown.sum() == 1 and (res.batch.seq_row_ids[0][shown] == 0).all()
    assert _check_counts(store, s, res, frozenset(), anchor_only=True) == CFG.batch_size


def test_a_count_column_naming_an_unknown_table_is_a_store_error():
    store = copy.copy(walk_example())
    bad = next(c for c in store.columns if getattr(c, "count_of", None))
    store.columns = [dataclasses.replace(c, count_of={**c.count_of, "parent_table": "shops"}) if c is bad else c
                     for c in store.columns]
    with pytest.raises(StoreError, match="'shops'"):
        Sampler([store], CFG)


def test_windowed_counts_by_hand():
    """Order 1 of the worked example, observed at day 10: customer 23 has orders at days 3, 4 and 10 (99 is at day
    20, after it); in the last day 1 (day 10), in the last 7 days 2 (days 4 and 10: the window (day 3, day 10] leaves
    day 3 out). The statistics of a windowed count are those of log1p(the count each referencing row's parent showed
    at that row's own time, itself counted)."""
    day1, day7 = [1, 1, 1, 1], [1, 2, 2, 1]
    store = walk_example()
    cfg = dataclasses.replace(CFG, child_count_windows=(1, 7))
    s = Sampler([store], cfg)
    first = int(np.flatnonzero(np.asarray(store.task_arrays("rating").anchor_row) == local_row(store, "orders", 1))[0])
    res = s.build("rating", np.array([first]))
    cc = s.data[0].child_counts(True, (1, 7))
    stats = {int(c): (float(m), float(sd)) for c, m, sd in zip(cc.col, cc.mean, cc.std, strict=True)}
    cust = {int(r): i for i, r in enumerate(res.rows[0, : res.nrows[0]])}[local_row(store, "customers", 23)]
    b = res.batch
    got = {}
    for c in store.columns:
        w = (c.count_of or {}).get("window_days")
        if w and store.columns[c.count_of["column_idx"]].name == "customer_id":
            p = np.flatnonzero((b.seq_row_ids[0] == cust) & (b.column_ids[0] == c.column_idx) & ~b.is_padding[0])
            if w in (1, 7):
                m, sd = stats[c.column_idx]
                got[w] = round(float(np.expm1(b.numeric_values[0, p[0]] * sd + m)))
                # customer 23's orders at days 3, 4, 10, 20: at each (itself counted), in the last day 1 each and
                # in the last 7 days 1, 2, 2, 1
                want = np.log1p(day1 if w == 1 else day7)
                assert (m, sd) == pytest.approx((want.mean(), want.std() if want.std() > 1e-6 else 1.0), rel=1e-5)
            else:
                assert p.size == 0  # a window that the sampler was not asked for is not shown
    assert got == {1: 1, 7: 2}
    assert _check_counts(store, s, res, frozenset(), windows=(1, 7)) > 2 * cfg.batch_size
    # without an observation time (the customer's country task) a windowed count is NULL, the all-time one is not
    res = s.build("country", np.array([0]))
    shown = (np.isin(res.batch.column_ids[0], list(_count_columns(store, (1, 7)))) & ~res.batch.is_padding[0]
             & (res.batch.seq_row_ids[0] == 0))
    assert res.batch.is_null[0][shown].tolist() == [False, True, True]


def test_count_windows_are_validated_and_need_a_store_that_has_them():
    for bad in ((30, 7), (2,), (True,), (7, 7)):
        with pytest.raises(ConfigError, match="child_count_windows"):
            dataclasses.replace(CFG, child_count_windows=bad)
    with pytest.raises(ConfigError, match="child_count_windows.*child_counts"):
        dataclasses.replace(CFG, child_counts="none", child_count_windows=(7,))
    store = copy.copy(walk_example())  # read as one preprocessed before windowed counts existed
    store.columns = [dataclasses.replace(c, count_of={k: v for k, v in c.count_of.items() if k != "windows"})
                     if getattr(c, "count_of", None) else c
                     for c in store.columns if not (getattr(c, "count_of", None) or {}).get("window_days")]
    Sampler([store], CFG).build("rating", np.array([0]))  # the all-time counts still work
    with pytest.raises(StoreError, match="windowed.*preprocess"):
        Sampler([store], dataclasses.replace(CFG, child_count_windows=(7,)))


def test_days_since_the_latest_child_by_hand():
    """Customer 23's orders fall on days 3, 4, 10 and 20, book 42's on days 5 and 10: observed at order 1 (day 10)
    both latest are order 1 itself (0 days; order 99 at day 20 comes after). The z-score is fitted on log1p of the
    gaps between a parent's consecutive children (1, 6, 10 days; 5 days). Without an observation time (the
    customer's country task) the cell is NULL; a key-only child or none at all leaves it NULL too (brute force)."""
    store = walk_example()
    cfg = dataclasses.replace(CFG, child_latest=True)
    s = Sampler([store], cfg)
    latest = {store.columns[c.count_of["column_idx"]].name: c.column_idx for c in store.columns
              if (c.count_of or {}).get("latest")}
    assert set(latest) == {"customer_id", "book_id"}
    assert store.columns[latest["customer_id"]].name == "days since the latest orders row by customer_id"
    cc = s.data[0].child_counts(True, cfg.child_count_windows, True)
    stats = {int(c): (float(m), float(sd)) for c, m, sd in zip(cc.col, cc.mean, cc.std, strict=True)}
    want = np.log1p([1.0, 6.0, 10.0])
    assert stats[latest["customer_id"]] == pytest.approx((want.mean(), want.std()), rel=1e-5)
    assert stats[latest["book_id"]] == pytest.approx((np.log1p(5.0), 1.0), rel=1e-5)  # one gap: std 1
    first = int(np.flatnonzero(np.asarray(store.task_arrays("rating").anchor_row) == local_row(store, "orders", 1))[0])
    res = s.build("rating", np.array([first]))
    b = res.batch
    cust = {int(r): i for i, r in enumerate(res.rows[0, : res.nrows[0]])}[local_row(store, "customers", 23)]
    p = np.flatnonzero((b.seq_row_ids[0] == cust) & (b.column_ids[0] == latest["customer_id"]) & ~b.is_padding[0])
    m, sd = stats[latest["customer_id"]]
    assert p.size == 1 and float(np.expm1(b.numeric_values[0, p[0]] * sd + m)) == pytest.approx(0.0, abs=1e-4)
    assert _check_counts(store, s, res, frozenset(), windows=cfg.child_count_windows, latest=True) > 0
    res = s.build("country", np.array([0]))
    p = np.flatnonzero((res.batch.column_ids[0] == latest["customer_id"]) & ~res.batch.is_padding[0])
    assert p.size == 1 and res.batch.is_null[0, p[0]]
    # off (the default), no such cell
    off = Sampler([store], CFG).build("rating", np.array([first])).batch
    assert not np.isin(off.column_ids, list(latest.values())).any()


def test_days_since_the_latest_child_are_validated_and_need_a_store_that_has_them():
    with pytest.raises(ConfigError, match="child_latest"):
        dataclasses.replace(CFG, child_latest="yes")
    with pytest.raises(ConfigError, match="child_latest.*child_counts"):
        dataclasses.replace(CFG, child_counts="none", child_count_windows=(), child_latest=True)
    store = copy.copy(walk_example())  # read as one preprocessed before the latest child's days existed
    store.columns = [c for c in store.columns if not (getattr(c, "count_of", None) or {}).get("latest")]
    Sampler([store], CFG).build("rating", np.array([0]))
    with pytest.raises(StoreError, match="latest.*preprocess"):
        Sampler([store], dataclasses.replace(CFG, child_latest=True))
    # one made before windowed counts too: asked to preprocess again even without windows, never silently without
    store.columns = [dataclasses.replace(c, count_of={k: v for k, v in c.count_of.items() if k != "windows"})
                     if getattr(c, "count_of", None) else c
                     for c in store.columns if not (getattr(c, "count_of", None) or {}).get("window_days")]
    with pytest.raises(StoreError, match="latest.*preprocess"):
        Sampler([store], dataclasses.replace(CFG, child_count_windows=(), child_latest=True))
