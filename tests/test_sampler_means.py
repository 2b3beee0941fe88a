"""Children's-mean cells (`SamplerConfig.child_means`): the anchor row and the rows it references show, per foreign
key of a temporal table pointing at theirs, the mean of each numerical / boolean column over the latest referencing
rows before the observation time. Checked against a brute-force mean over the parent CSR (never a row at or after
the observation time, never the anchor), by hand on the worked example, for the walk's budget, the task's cut columns
and old stores."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confluence.errors import ConfigError, StoreError
from confluence.sampler.sampler import Sampler
from confluence.sampler.walk import VIA_PARENT
from confluence.stypes import SemanticType
from tests.fixtures.configs import seed_sampler
from tests.fixtures.graphs import local_row, random_store, walk_example
from tests.test_sampler_walk import _check_walk

CFG = seed_sampler(batch_size=4, seq_len=128, width=16, max_rows=32, row_buckets=(8, 16, 32), text_buckets=(4, 16),
                   child_means="anchor_and_parents", child_mean_rows=64)


def _mean_columns(store) -> dict[int, dict]:
    return {c.column_idx: c.mean_of for c in store.columns if getattr(c, "mean_of", None)}


def _stored(store, table: str, column: str, row: int) -> float | None:
    """The stored cell of a table's local `row` as the mean reads it (a z-scored number, a boolean as +-1)."""
    valid = np.unpackbits(np.asarray(store.validity(table, column)), bitorder="little")[row]
    if not valid:
        return None
    vals = np.asarray(store.values(table, column))
    if store.columns[_col_idx(store, table, column)].stype == SemanticType.BOOLEAN:
        return 1.0 if np.unpackbits(vals, bitorder="little")[row] else -1.0
    return float(vals[row])


def _col_idx(store, table: str, column: str) -> int:
    return next(c.column_idx for c in store.columns if c.table == table and c.name == column)


def _brute_mean(store, row: int, anchor: int, spec: dict, obs: int, n_max: int) -> float | None:
    """The mean of the child column over the latest `n_max` rows referencing `row` through the foreign key with a
    time strictly before `obs`, never `anchor`, NULL values skipped (None: no value), from the parent CSR."""
    child = next(t for t in store.tables if t.name == spec["child_table"])
    refs = []
    for r in range(int(child.row_offset), int(child.row_offset) + int(child.num_rows)):
        for e in range(store.parent_indptr[r], store.parent_indptr[r + 1]):
            if (store.parent_indices[e] == row and store.parent_column[e] == spec["column_idx"]
                    and int(store.row_time[r]) < obs and r != anchor):
                refs.append((int(store.row_time[r]), r))
    assert len(refs) <= n_max, "the property test reads every earlier row: ties would make `latest` ambiguous"
    vals = [_stored(store, child.name, spec["value_column"], r - int(child.row_offset)) for _, r in refs]
    vals = [v for v in vals if v is not None]
    return float(np.mean(vals)) if vals else None


def _check_means(store, sampler, res, cut: frozenset[int], n_max: int, cells: int) -> int:
    """Every mean cell equals the brute-force mean and sits on the anchor or a row it references; each such row
    (unless cut at S) carries exactly its table's means minus the cut ones, at most `cells`. Returns cells checked."""
    means = _mean_columns(store)
    tab_of = {t.name: i for i, t in enumerate(store.tables)}
    data = sampler.data[0]
    b_ = res.batch
    checked = 0
    for b in range(b_.column_ids.shape[0]):
        n_real, obs, anchor = int(res.n_real[b]), int(b_.obs_times[b]), int(res.rows[b, 0])
        cols, rid = b_.column_ids[b, :n_real], b_.seq_row_ids[b, :n_real]
        for i in range(int(res.nrows[b])):
            row = int(res.rows[b, i])
            near = i == 0 or (int(res.via[b, i]) == VIA_PARENT and int(res.src[b, i]) == 0)
            pos = np.flatnonzero(rid == i)
            shown = [int(c) for c in cols[pos] if int(c) in means]
            want = [c for c, m in sorted(means.items()) if tab_of[m["parent_table"]] == data.table_of_row(row)
                    and m["column_idx"] not in cut and _brute_mean(store, row, anchor, m, obs, n_max) is not None]
            want = want[:cells] if near else []  # a mean of no value is no cell
            if pos.size and pos[-1] < n_real - 1:  # the row is not the one cut at S
                assert shown == want, (b, i)
            else:
                assert shown == want[: len(shown)], (b, i)
            for p in pos:
                c = int(cols[p])
                if c not in means:
                    continue
                assert b_.semantic_types[b, p] == SemanticType.NUMERICAL
                want_m = _brute_mean(store, row, anchor, means[c], obs, n_max)
                assert want_m is not None and not b_.is_null[b, p]
                np.testing.assert_allclose(b_.numeric_values[b, p], want_m, rtol=1e-5, atol=1e-5)
                checked += 1
    return checked


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 23), width=st.integers(0, 4), seq_len=st.sampled_from([16, 64, 512]),
       per_fk=st.booleans(), cells=st.sampled_from([1, 16]))
def test_mean_cells_equal_brute_force_means_before_the_observation_time(seed, width, seq_len, per_fk, cells):
    store = random_store(seed)
    cfg = dataclasses.replace(CFG, batch_size=6, seq_len=seq_len, width=width, max_rows=64, row_buckets=(8, 64),
                              text_buckets=(8,), width_per_fk=per_fk, child_mean_cells=cells)
    s = Sampler([store], cfg)
    rng = np.random.default_rng(seed)
    for e in s.entries:
        ids = rng.integers(0, e.task.num_seeds, min(6, e.task.num_seeds))
        res = s.build(e.task.name, ids)
        res.batch.validate()
        cut = frozenset(int(c) for c in e.task.cut_cols)
        _check_walk(store, res, seq_len, width, 64, cut=cut, per_fk=per_fk)
        assert (res.n_real <= seq_len).all()
        _check_means(store, s, res, cut, 64, cells)


def _means_by_name(store) -> dict[tuple[str, str], int]:
    return {(m["column"], m["value_column"]): c for c, m in _mean_columns(store).items()}


def test_walk_example_means_by_hand_never_the_anchor_nor_a_later_row():
    """Order 1 (day 10, rating 4) of customer 23, whose other orders are 7 (day 3, rating 5), 12 (day 4, rating
    NULL) and 99 (day 20, rating 1): the customer shows the mean of orders 7 and 12 only: 5 (its z-score)."""
    store = walk_example()
    s = Sampler([store], CFG)
    by = _means_by_name(store)
    assert set(by) == {(fk, v) for fk in ("customer_id", "book_id") for v in ("rating", "gift")}
    first = int(np.flatnonzero(np.asarray(store.task_arrays("rating").anchor_row) == local_row(store, "orders", 1))[0])
    res = s.build("rating", np.array([first]))
    b = res.batch
    loc = {int(r): i for i, r in enumerate(res.rows[0, : res.nrows[0]])}
    cust = loc[local_row(store, "customers", 23)]
    orders = next(t for t in store.tables if t.name == "orders")

    def z(order_id: int) -> float:
        r = local_row(store, "orders", order_id) - int(orders.row_offset)
        return float(np.asarray(store.values("orders", "rating"))[r])

    def shown(row: int, col: int) -> tuple[float, bool]:
        p = np.flatnonzero((b.seq_row_ids[0] == row) & (b.column_ids[0] == col) & ~b.is_padding[0])
        assert p.size == 1
        return float(b.numeric_values[0, p[0]]), bool(b.is_null[0, p[0]])

    assert shown(cust, by["customer_id", "rating"]) == (pytest.approx(z(7)), False)  # not 1 (the anchor), not 99
    # gift: orders 7 and 12 are rows 1 and 2 of the table, gift = row % 2 == 0: False, True -> mean of -1 and 1
    assert shown(cust, by["customer_id", "gift"]) == (pytest.approx(0.0), False)
    # the latest rows only: with child_mean_rows = 1 the customer reads order 12 alone, whose rating is NULL: no
    # rating cell (a mean of nothing is no cell), but its gift (True: 1)
    res1 = Sampler([store], dataclasses.replace(CFG, child_mean_rows=1)).build("rating", np.array([first]))
    b = res1.batch
    on_cust = (b.seq_row_ids[0] == cust) & ~b.is_padding[0]
    assert not (on_cust & (b.column_ids[0] == by["customer_id", "rating"])).any()
    p = np.flatnonzero(on_cust & (b.column_ids[0] == by["customer_id", "gift"]))
    assert b.numeric_values[0, p[0]] == pytest.approx(1.0)
    assert _check_means(store, s, res, frozenset(int(c) for c in s.data[0].task("rating").cut_cols), 64, 16) > 0


def test_a_customer_anchor_sees_every_order_with_a_time_and_other_rows_show_none():
    """Without a cut-off (the customer's country task) the anchor customer averages all its orders (day 20 too);
    the orders in its context, which are not rows it references, show no mean cells."""
    store = walk_example()
    s = Sampler([store], CFG)
    res = s.build("country", np.array([0]))
    by = _means_by_name(store)
    b = res.batch
    p = np.flatnonzero((b.seq_row_ids[0] == 0) & (b.column_ids[0] == by["customer_id", "rating"]))
    ratings = np.asarray(store.values("orders", "rating"))
    # the customer's orders are rows 0, 1, 2, 4 of the table (1, 7, 12, 99; order 5 has none): 12's rating is NULL
    assert b.numeric_values[0, p[0]] == pytest.approx(float(np.mean(ratings[[0, 1, 4]])))
    mean_cols = list(_mean_columns(store))
    on = np.isin(b.column_ids[0], mean_cols) & ~b.is_padding[0]
    assert set(b.seq_row_ids[0][on].tolist()) == {0}


def test_means_through_an_excluded_foreign_key_are_not_shown():
    store = walk_example(extra_orders=8)
    s = Sampler([store], dataclasses.replace(CFG, batch_size=16, seq_len=512, max_rows=64))
    res = s.build("whose_order", np.arange(13))
    cut = frozenset(int(c) for c in s.data[0].task("whose_order").cut_cols)
    assert _check_means(store, s, res, cut, 64, 16) > 0
    by_customer = [c for (fk, _), c in _means_by_name(store).items() if fk == "customer_id"]
    assert not np.isin(res.batch.column_ids, by_customer).any()


def test_off_leaves_the_batches_unchanged_and_is_validated():
    store = walk_example(extra_orders=8)
    off = Sampler([store], dataclasses.replace(CFG, child_means="none")).build("rating", np.arange(4)).batch
    seed = Sampler([store], seed_sampler(**{k: getattr(CFG, k) for k in ("batch_size", "seq_len", "width", "max_rows",
                                                                        "row_buckets", "text_buckets")}))
    base = seed.build("rating", np.arange(4)).batch
    for f in dataclasses.fields(off):
        np.testing.assert_array_equal(getattr(off, f.name), getattr(base, f.name), err_msg=f.name)
    assert not np.isin(off.column_ids, list(_mean_columns(store))).any()
    for name, bad in (("child_means", "all"), ("child_mean_rows", 0), ("child_mean_cells", True)):
        with pytest.raises(ConfigError, match=name):
            dataclasses.replace(CFG, **{name: bad})


def test_a_store_without_mean_columns_asks_for_preprocessing_again():
    store = copy.copy(walk_example())  # the store read as one preprocessed before mean columns existed
    store.columns = [c for c in store.columns if not getattr(c, "mean_of", None)]
    Sampler([store], dataclasses.replace(CFG, child_means="none")).build("rating", np.array([0]))
    with pytest.raises(StoreError, match="preprocess"):
        Sampler([store], CFG)


def test_a_mean_column_naming_an_unknown_table_is_a_store_error():
    store = copy.copy(walk_example())
    bad = next(c for c in store.columns if getattr(c, "mean_of", None))
    store.columns = [dataclasses.replace(c, mean_of={**c.mean_of, "child_table": "shops"}) if c is bad else c
                     for c in store.columns]
    with pytest.raises(StoreError, match="'shops'"):
        Sampler([store], CFG)


@pytest.mark.parametrize("which, key, value", [
    ("mean_of", "column_idx", 10_000), ("mean_of", "value_column_idx", -1), ("mean_of", "value_column_idx", "2"),
    ("count_of", "column_idx", 10_000)])
def test_a_count_or_mean_column_naming_a_column_out_of_range_is_a_store_error(which, key, value):
    """The kernels index arrays with these columns unchecked: a store naming one that is not a column of the child
    table (out of range, or another table's) stops at the store, not inside a kernel."""
    store = copy.copy(walk_example())
    bad = next(c for c in store.columns if getattr(c, which, None))
    store.columns = [dataclasses.replace(c, **{which: {**getattr(c, which), key: value}}) if c is bad else c
                     for c in store.columns]
    with pytest.raises(StoreError, match=f"column {bad.column_idx} .*{value!r}"):
        Sampler([store], CFG)
    # a mean's foreign key that is a column of another table than the child table
    if which == "mean_of":
        store = copy.copy(walk_example())
        parent_col = next(c.column_idx for c in store.columns if c.table == bad.mean_of["parent_table"])
        store.columns = [dataclasses.replace(c, mean_of={**c.mean_of, "column_idx": parent_col})
                         if c.column_idx == bad.column_idx else c for c in store.columns]
        with pytest.raises(StoreError, match=f"foreign key {parent_col} is not a column of"):
            Sampler([store], CFG)
