"""GBDT baseline: features are built leak-free and LightGBM trains on them."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from confluence.evaluation.gbdt import FeatureBuilder, fit_gbdt
from confluence.preprocess.pipeline import preprocess
from confluence.store import Store
from tests.fixtures.bookstore import HashEncoder

T0 = dt.datetime(2020, 1, 1)
CUTOFF = dt.datetime(2020, 7, 1)

META = {
    "name": "shop",
    "tables": {
        "books": {"primary_key": "book_id", "columns": {
            "book_id": {"stype": "identifier"}, "price": {"stype": "numerical"}, "genre": {"stype": "categorical"}}},
        "customers": {"primary_key": "customer_id", "temporal_column": "signed_up_at", "columns": {
            "customer_id": {"stype": "identifier"}, "age": {"stype": "numerical"},
            "signed_up_at": {"stype": "timestamp"}}},
        "orders": {"primary_key": "order_id", "temporal_column": "ordered_at", "columns": {
            "order_id": {"stype": "identifier"},
            "customer_id": {"stype": "identifier", "foreign_key": "customers.customer_id"},
            "book_id": {"stype": "identifier", "foreign_key": "books.book_id"},
            "amount": {"stype": "numerical"}, "status": {"stype": "categorical"}, "gift": {"stype": "boolean"},
            "ordered_at": {"stype": "timestamp"}}},
    },
    "tasks": {
        "amount": {"query": "SELECT order_id, amount FROM orders", "anchor_table": "orders", "anchor_key": "order_id",
                   "target_column": "amount", "target_stype": "numerical"},
        "status": {"query": "SELECT order_id, status FROM orders", "anchor_table": "orders",
                   "anchor_key": "order_id", "target_column": "status", "target_stype": "categorical"},
        "buys_next_30d": {
            "query": "SELECT c.customer_id, d.t AS obs, count(o.order_id) > 0 AS buys FROM customers c, "
                     "(SELECT unnest(range(TIMESTAMP '2020-02-01', TIMESTAMP '2021-01-01', INTERVAL 30 DAY)) AS t) d "
                     "LEFT JOIN orders o ON o.customer_id = c.customer_id AND o.ordered_at > d.t "
                     "AND o.ordered_at <= d.t + INTERVAL 30 DAY WHERE c.signed_up_at <= d.t GROUP BY ALL",
            "anchor_table": "customers", "anchor_key": "customer_id", "target_column": "buys",
            "target_stype": "boolean", "observation_time_column": "obs"},
    },
}


def _tables(seed: int, permute_future: bool) -> dict[str, pa.Table]:
    rng = np.random.default_rng(seed)
    nc, nb, no = 40, 8, 400
    signup = [T0 + dt.timedelta(days=int(d)) for d in rng.integers(0, 300, nc)]
    ordered = [T0 + dt.timedelta(days=float(d)) for d in rng.uniform(0, 365, no)]
    cust = rng.integers(1, nc + 1, no)
    amount = np.round(rng.gamma(2.0, 10.0, no) + 3 * (cust % 3), 2)
    status = rng.choice(["new", "paid", "sent"], no)
    gift = rng.random(no) < 0.3
    age = rng.integers(18, 80, nc).astype(float)
    book = rng.integers(1, nb + 1, no)
    price, genre = rng.uniform(5, 50, nb), rng.choice(["sf", "crime", "poetry"], nb)
    if permute_future:
        # Shuffle every value of rows created after the cut-off among themselves: per-column statistics (and so
        # every z-score) are unchanged, but anything a leaky feature reads from the future changes.
        fut = np.flatnonzero(np.array(ordered) > CUTOFF)
        perm = rng.permutation(fut)
        for arr in (amount, status, gift, cust, book):
            arr[fut] = arr[perm]
        ordered_arr = np.array(ordered, dtype=object)
        ordered_arr[fut] = ordered_arr[perm]
        ordered = list(ordered_arr)
        cfut = np.flatnonzero(np.array(signup) > CUTOFF)
        cperm = rng.permutation(cfut)
        age[cfut] = age[cperm]
    return {
        "books": pa.table({"book_id": np.arange(1, nb + 1), "price": price, "genre": genre}),
        "customers": pa.table({"customer_id": np.arange(1, nc + 1), "age": age,
                               "signed_up_at": pa.array(signup, pa.timestamp("us"))}),
        "orders": pa.table({"order_id": np.arange(1, no + 1), "customer_id": cust,
                            "book_id": book, "amount": amount, "status": status,
                            "gift": gift, "ordered_at": pa.array(ordered, pa.timestamp("us"))}),
    }


def _store(tmp: Path, name: str, permute_future: bool) -> Store:
    src = tmp / name
    src.mkdir()
    for t, table in _tables(7, permute_future).items():
        pq.write_table(table, src / f"{t}.parquet")
    meta = tmp / f"{name}.json"
    meta.write_text(json.dumps(META))
    return Store.open(preprocess(src, meta, tmp / f"{name}_store", encoder=HashEncoder(8), progress=False))


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gbdt")
    return _store(tmp, "a", False), _store(tmp, "b", True)


@pytest.mark.parametrize("task", ["amount", "status", "buys_next_30d"])
def test_features_never_read_rows_after_observation_time(stores, task):
    a, b = stores
    cut_us = int((CUTOFF - dt.datetime(1970, 1, 1)).total_seconds() * 1e6)
    obs_a = np.asarray(a.task_arrays(task).obs_time)
    anchors_a = np.asarray(a.task_arrays(task).anchor_row)
    past = np.flatnonzero(obs_a <= cut_us)
    # Same seeds in both stores (rows are in the same order; only future values moved).
    obs_b = np.asarray(b.task_arrays(task).obs_time)
    assert np.array_equal(np.asarray(b.task_arrays(task).anchor_row)[past], anchors_a[past])
    assert np.array_equal(obs_b[past], obs_a[past])
    fa = FeatureBuilder(a).build(task, past)
    fb = FeatureBuilder(b).build(task, past)
    assert fa.names == fb.names
    assert len(fa.names) > 5
    np.testing.assert_array_equal(fa.x, fb.x)
    # ...while seeds after the cut-off do see the (moved) future rows, so the check above has teeth.
    future = np.flatnonzero(obs_a > cut_us)
    if len(future):
        assert not np.array_equal(FeatureBuilder(a).build(task, future).x, FeatureBuilder(b).build(task, future).x,
                                  equal_nan=True)


def test_cell_masking_target_is_not_a_feature(stores):
    a, _ = stores
    names = FeatureBuilder(a).build("amount", np.arange(10)).names
    assert "orders.amount" not in names
    assert any(n.endswith("mean:orders.amount") for n in names)  # siblings' past amounts are fair game


def test_observation_time_features(stores):
    """A task with an observation_time_column gets the observation time's calendar features (the model sees it
    as a cell); a task whose time is the anchor's own timestamp does not need them."""
    a, _ = stores
    obs = np.asarray(a.task_arrays("buys_next_30d").obs_time)[:5]
    f = FeatureBuilder(a).build("buys_next_30d", np.arange(5))
    x = {n: f.x[:, i] for i, n in enumerate(f.names)}
    when = [dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=int(t)) for t in obs]
    np.testing.assert_array_equal(x["obs:month"], [w.month for w in when])
    np.testing.assert_array_equal(x["obs:weekday"], [w.weekday() for w in when])
    np.testing.assert_array_equal(x["obs:day_of_year"], [w.timetuple().tm_yday for w in when])
    np.testing.assert_allclose(x["obs:days"], obs / 86_400e6)
    assert not any(n.startswith("obs:") for n in FeatureBuilder(a).build("amount", np.arange(5)).names)


@pytest.mark.parametrize("task", ["amount", "status", "buys_next_30d"])
def test_fit_gbdt_reports_metrics(stores, task):
    a, _ = stores
    n = a.task(task).num_seeds
    ids = np.arange(n)
    res = fit_gbdt(a, task, ids[ids % 5 != 0], ids[ids % 5 == 0], num_boost_round=30)
    headline = {"amount": "mae", "status": "accuracy", "buys_next_30d": "auroc"}[task]
    assert np.isfinite(res.metrics[headline])
    assert res.num_train > 0


def test_lightgbm_and_duckdb_use_the_cpus_given(stores):
    """The baseline's threads are the CPUs the process may use (here pinned to one), not a fixed 2 or DuckDB's count
    of the machine's: more threads than free cores made LightGBM's rounds 4-8x slower beside one busy process on a
    2-core box (docs/design/evaluation.md, "LightGBM beside other work")."""
    a, _ = stores
    script = (
        "import json, os, sys\n"
        "import numpy as np\n"
        "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
        "from confluence.evaluation.gbdt import FeatureBuilder, fit_gbdt\n"
        "from confluence.store import Store\n"
        "store = Store.open(sys.argv[1])\n"
        "ids = np.arange(store.task('amount').num_seeds)\n"
        "builder = FeatureBuilder(store)\n"
        "res = fit_gbdt(store, 'amount', ids[ids % 5 != 0], ids[ids % 5 == 0], builder=builder, num_boost_round=5)\n"
        "duckdb_threads = builder.con.execute(\"SELECT current_setting('threads')\").fetchall()[0][0]\n"
        "print(json.dumps({'lightgbm': res.params['num_threads'], 'duckdb': duckdb_threads}))\n"
    )
    out = subprocess.run([sys.executable, "-c", script, str(a.path)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == {"lightgbm": 1, "duckdb": 1}


def test_lightgbm_leaves_the_cores_other_work_holds_and_answers_the_same(stores, monkeypatch):
    """A process spinning on one of two CPUs leaves LightGBM one thread (`free_cpus`); the fit's answers do not
    depend on its thread count, so a baseline measured beside other work is the one measured alone."""
    import confluence.evaluation.gbdt as gbdt_module
    from confluence.toolkit.threads import free_cpus, usable_cpus

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    busy = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpus[0]}}})\nwhile 1: pass"])
    try:
        import time

        time.sleep(0.5)
        assert free_cpus() <= usable_cpus() - 1
    finally:
        busy.kill()
        busy.wait()
    a, _ = stores
    ids = np.arange(a.task("amount").num_seeds)
    got = {}
    for n in (1, 2):
        monkeypatch.setattr(gbdt_module, "free_cpus", lambda n=n: n)
        res = gbdt_module.fit_gbdt(a, "amount", ids[ids % 5 != 0], ids[ids % 5 == 0], num_boost_round=20)
        assert res.params["num_threads"] == n
        got[n] = res.predictions
    np.testing.assert_array_equal(got[1], got[2])


def test_categorical_features_are_renumbered_to_consecutive_codes():
    """LightGBM wants codes 0..k-1 (sparse ids draw its 'sparse values' warning): the same value gets the same code
    in the train and eval tables, missing stays missing, other columns are untouched."""
    from confluence.evaluation.gbdt import dense_categories

    nan = float("nan")
    tr = np.array([[90210.0, 1.5], [7.0, 2.5], [nan, 3.5], [90210.0, 4.5]])
    ev = np.array([[123456.0, 9.0], [7.0, 8.0], [-1.0, 7.0]])
    dense_categories(tr, ev, [0])
    np.testing.assert_array_equal(tr[:, 0], [1.0, 0.0, nan, 1.0])
    np.testing.assert_array_equal(ev[:, 0], [2.0, 0.0, nan])  # a value only eval has gets its own code
    np.testing.assert_array_equal(tr[:, 1], [1.5, 2.5, 3.5, 4.5])


def test_duckdb_prints_no_progress_bar_of_its_own(stores):
    """`--no-progress` is silent: the feature builder's DuckDB never draws its own bar (our Reporter shows progress)."""
    con = FeatureBuilder(stores[0]).con
    assert con.execute("SELECT current_setting('enable_progress_bar')").fetchone() == (False,)


def test_a_timestamp_target_is_regressed_from_the_observation_time():
    """Trees cannot predict past the times they were trained on; a time regressed as its offset from the row's
    observation time can (the test split's times are later than the train split's)."""
    from confluence.evaluation.gbdt import FeatureTable, train_booster
    from confluence.stypes import SemanticType
    from confluence.targets import DecodedTargets

    rng = np.random.default_rng(0)
    n, day = 2000, 86_400_000_000
    obs = (np.arange(n) * day // 2 + 1_600_000_000_000_000).astype(np.int64)  # one row every 12 hours
    x = rng.uniform(0, 5, n)
    target = obs + (3 + x) * day  # due 3-8 days after the observation, by x
    cut = int(n * 0.8)

    def table(rows, with_obs=True):
        return FeatureTable(x=x[rows, None].copy(), names=["x"], obs=obs[rows] if with_obs else None)

    train, test = np.arange(cut), np.arange(cut, n)
    y = DecodedTargets(SemanticType.TIMESTAMP, target[train].astype(np.float64), np.zeros(cut, bool), 0, None)
    rel = train_booster("due_at", y, table(train))
    mae_days = np.abs(rel.predict(table(test)) - target[test]).mean() / day
    assert rel.fit["relative"] and mae_days < 0.5, mae_days
    absolute = train_booster("due_at", y, table(train, with_obs=False))
    assert not absolute.fit["relative"]
    assert np.abs(absolute.predict(table(test, False)) - target[test]).mean() / day > 50  # stuck at 2021's end


def test_a_when_next_task_has_a_trivial_baseline_of_its_observation_time_plus_the_median_offset():
    """The constant a user tries first for "when is the next one": today plus the usual wait. A single absolute date
    (the median of the train targets) is years off once the test rows are later than the train rows."""
    from types import SimpleNamespace

    from confluence.evaluation import metrics as M
    from confluence.store.format import NO_CUTOFF
    from confluence.stypes import SemanticType
    from confluence.targets import DecodedTargets
    from confluence.targets.timestamp import offset_prediction

    day = 86_400_000_000
    obs = (1_600_000_000_000_000 + np.arange(100) * 30 * day).astype(np.int64)  # one row a month, eight years
    wait = np.where(np.arange(100) % 2 == 0, 10, 14) * day  # the next event 10 or 14 days later
    target = (obs + wait).astype(np.float64)
    store = SimpleNamespace(task_arrays=lambda task: SimpleNamespace(obs_time=obs),
                            task=lambda task: SimpleNamespace(observation_time="observation_time_column",
                                                             target_stype=int(SemanticType.TIMESTAMP)))
    train, test = np.arange(80), np.arange(80, 100)
    nulls = np.zeros(100, bool)
    nulls[[3, 4]] = True  # null targets are left out of the median (one wait of each length) and of the scored rows
    dec = lambda ids: DecodedTargets(SemanticType.TIMESTAMP, target[ids], nulls[ids], 0, None)  # noqa: E731
    pred = offset_prediction(store, "next_at", train, test, dec(train), dec(test))
    assert pred is not None and np.allclose(pred, obs[test] + 12 * day)  # the median of 10 and 14 days
    ours = M.metrics_for(SemanticType.TIMESTAMP, target[test], pred)["mae_days"]
    absolute = M.trivial_baselines(SemanticType.TIMESTAMP, target[train][~nulls[train]], target[test])
    assert ours == pytest.approx(2.0) and absolute["median"]["mae_days"] > 1000
    with_null = offset_prediction(store, "next_at", train, np.arange(0, 10), dec(train), dec(np.arange(0, 10)))
    assert with_null.shape == (8,)
    without = SimpleNamespace(task_arrays=lambda task: SimpleNamespace(obs_time=np.full(100, NO_CUTOFF)),
                              task=lambda task: SimpleNamespace(observation_time="observation_time_column",
                                                             target_stype=int(SemanticType.TIMESTAMP)))
    assert offset_prediction(without, "next_at", train, test, dec(train), dec(test)) is None
    # a cell task's cut-off is its row's own time: for a target that is the row's time column it is the answer
    cell = SimpleNamespace(task_arrays=lambda task: SimpleNamespace(obs_time=target.astype(np.int64)),
                           task=lambda task: SimpleNamespace(observation_time="anchor_temporal_column",
                                                            target_stype=int(SemanticType.TIMESTAMP)))
    assert offset_prediction(cell, "order_time", train, test, dec(train), dec(test)) is None
