"""Planted-signal databases: deterministic bytes, valid and preprocessable, and every stored ceiling equal to the
Bayes predictor recomputed here directly from the raw tables."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
from pathlib import Path

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest
from sklearn.metrics import roc_auc_score
from typer.testing import CliRunner

from confluence.bench.learnability import reached
from confluence.cli.main import app
from confluence.errors import ConfluenceError
from confluence.store import Store
from confluence.synth.planted import PlantedSpec, write_planted
from tests.fixtures.bookstore import HashEncoder

SPEC = PlantedSpec(seed=3, customers=400, stores=12, regions=5, orders_per_customer=6.0)


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    return write_planted(tmp_path_factory.mktemp("planted") / "db", SPEC)


def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _ceilings(root: Path) -> dict:
    return json.loads((root / "ceilings.json").read_text())["tasks"]


def _raw(root: Path, table: str):
    return pq.read_table(root / "raw" / f"{table}.parquet").to_pydict()


def test_same_seed_same_bytes_other_seed_other_data(planted, tmp_path):
    again = write_planted(tmp_path / "again", SPEC)
    assert _digests(again) == _digests(planted)
    other = write_planted(tmp_path / "other", PlantedSpec(seed=4, customers=400, stores=12, regions=5,
                                                          orders_per_customer=6.0))
    assert _digests(other)["raw/customers.parquet"] != _digests(planted)["raw/customers.parquet"]


def test_existing_output_is_never_overwritten_unless_asked(planted, tmp_path):
    before = _digests(planted)
    with pytest.raises(ConfluenceError, match="already exists"):
        write_planted(planted, SPEC)
    assert _digests(planted) == before
    result = CliRunner().invoke(app, ["synth", "planted", "--out", str(planted), "--customers", "50"])
    assert result.exit_code == 1 and "already exists" in result.output
    assert _digests(planted) == before


def test_validates_and_preprocesses_with_every_task(planted, tmp_path):
    from confluence.preprocess.pipeline import preprocess

    store = Store.open(preprocess(planted / "raw", planted / "planted.metadata.json", tmp_path / "store",
                                  encoder=HashEncoder(16), progress=False))
    meta = json.loads((planted / "planted.metadata.json").read_text())
    assert {t.name for t in store.tasks} == set(meta["tasks"]) == set(_ceilings(planted))
    assert len(meta["tasks"]) == 12
    for name, c in _ceilings(planted).items():  # every task's rows reached the store
        assert len(store.task_arrays(name).anchor_row) == c["n"], name


def test_same_row_parent_two_hop_and_text_ceilings_match_a_direct_computation(planted):
    cust, stores, regions = _raw(planted, "customers"), _raw(planted, "stores"), _raw(planted, "regions")
    c = _ceilings(planted)
    # same-row categorical: A -> Z, B -> X, C -> Y
    pred = [{"A": "Z", "B": "X", "C": "Y"}[s] for s in cust["segment"]]
    assert c["customers.tier"]["ceiling"] == pytest.approx(np.mean(np.array(pred) == np.array(cust["tier"])))
    assert c["customers.tier"]["ceiling"] > max(np.mean(np.array(cust["tier"]) == t) for t in "XYZ") + 0.2
    # same-row numbers: the logit 3 x1 - 2 x2 - 1 orders the rows as the Bayes probability does
    logit = 3 * np.array(cust["x1"]) - 2 * np.array(cust["x2"]) - 1
    assert c["customers.flag"]["ceiling"] == pytest.approx(roc_auc_score(cust["flag"], logit))
    # a parent's attribute: the store's kind K1 -> P2, K2 -> P4, K3 -> P1, K4 -> P3
    kind = dict(zip(stores["store_id"], stores["kind"], strict=True))
    pred = [{"K1": "P2", "K2": "P4", "K3": "P1", "K4": "P3"}[kind[s]] for s in cust["store_id"]]
    assert c["customers.pref"]["ceiling"] == pytest.approx(np.mean(np.array(pred) == np.array(cust["pref"])))
    # a two-hop ancestor's attribute: arid / polar regions are zone = true with probability 0.9
    region = dict(zip(stores["store_id"], stores["region_id"], strict=True))
    climate = dict(zip(regions["region_id"], regions["climate"], strict=True))
    score = [climate[region[s]] in ("arid", "polar") for s in cust["store_id"]]
    assert c["customers.zone"]["ceiling"] == pytest.approx(roc_auc_score(cust["zone"], score))
    # a text column's content: the topic whose words the bio uses (the vocabulary written out, not imported)
    vocab = {"sports": "football tennis running cycling swimming marathon goalkeeper stadium",
             "cooking": "recipes baking pasta spices bread kitchen soup dessert",
             "travel": "flights hotels beaches mountains passport islands museums trains"}
    topic = [next(t for t, v in vocab.items() if set(b.split()) & set(v.split())) for b in cust["bio"]]
    assert c["customers.interest"]["ceiling"] == pytest.approx(
        np.mean(np.array(topic) == np.array(cust["interest"])))


def test_periodic_ceiling_matches_a_direct_computation(planted):
    orders = _raw(planted, "orders")
    hour = np.array([t.hour for t in orders["ordered_at"]])
    weekday = np.array([t.weekday() for t in orders["ordered_at"]])
    score = np.where((hour >= 17) & (hour <= 21), 0.7, 0.1) + np.where(weekday >= 5, 0.2, 0.0)
    assert _ceilings(planted)["orders.late"]["ceiling"] == pytest.approx(roc_auc_score(orders["late"], score))


def test_root_cause_ceilings_match_a_direct_computation(planted):
    """The same-row function (total = quantity x unit price, 2 % noise) and the level moving with time (the fee
    doubles every year): each stored ceiling is the MAE of the generating function written out here."""
    orders = _raw(planted, "orders")
    c = _ceilings(planted)
    q, price, total = (np.array(orders[k], dtype=float) for k in ("quantity", "unit_price", "total"))
    assert c["orders.total"]["ceiling"] == pytest.approx(np.mean(np.abs(total - q * price)))
    assert c["orders.total"]["ceiling"] < 0.05 * np.mean(np.abs(total - np.median(total)))  # a near-function
    years = np.array([(t - dt.datetime(2022, 1, 1)).total_seconds() / (365.25 * 86400) for t in orders["ordered_at"]])
    fee = np.array(orders["fee"])
    assert c["orders.fee"]["ceiling"] == pytest.approx(np.mean(np.abs(fee - 10 * 2 ** years)))
    # the level moves: the last quarter's median fee is about 3.4 x the first quarter's (2^1.75)
    late, early = np.median(fee[years > 1.75]), np.median(fee[years < 0.25])
    assert 3.0 < late / early < 3.8


def test_the_root_causes_leave_the_first_signals_columns_alone():
    """The root-cause columns come from a second and a third generator, so every other column keeps the values it had
    before they were added (the digest below was computed with the generator of commit 1265b75, on SPEC)."""
    from confluence.synth.planted import generate

    db = generate(SPEC)
    h = hashlib.sha256()
    for name in ("regions", "stores", "customers", "orders"):
        t = db.tables[name]
        for c in t.column_names:
            if c not in ("quantity", "unit_price", "total", "fee", "courier_id", "handling"):
                h.update(name.encode() + c.encode() + repr(t.column(c).to_pylist()).encode())
    assert h.hexdigest() == "246f35609b6891edf7a482f64c3e7226cfab811780698e29c8483c7d55d44308"


def test_derived_targets_are_exact_functions_of_the_visible_past(planted):
    """Each derived task's target, recomputed here from the raw orders with numpy, using only orders at or before
    the observation time (the sampler's visibility rule): the task query agrees, and the ceiling is perfect."""
    meta = json.loads((planted / "planted.metadata.json").read_text())
    orders = _raw(planted, "orders")
    con = duckdb.connect()
    for name in ("regions", "stores", "customers", "orders"):
        con.register(name, pq.read_table(planted / "raw" / f"{name}.parquet"))
    cid = np.array(orders["customer_id"])
    at = np.array(orders["ordered_at"], dtype="datetime64[us]")
    amount = np.array([np.nan if a is None else a for a in orders["amount"]])
    channel = np.array(orders["channel"])
    c = _ceilings(planted)
    for task, check in (("customer_orders_30d", "count"), ("customer_mean_amount", "mean"),
                        ("customer_last_channel", "last"), ("customer_amount_90d", "sum90")):
        spec = meta["tasks"][task]
        rows = con.sql(spec["query"]).fetchall()
        assert rows, task
        for customer, obs, target in rows[:: max(1, len(rows) // 300)]:
            obs = np.datetime64(obs, "us")
            mine = (cid == customer) & (at <= obs)
            if check == "count":
                want = float(np.sum(mine & (at > obs - np.timedelta64(30, "D"))))
                assert target == want
            elif check == "mean":
                assert target == pytest.approx(np.nanmean(amount[mine]))
            elif check == "sum90":
                window = mine & (at > obs - np.timedelta64(90, "D"))
                assert target == pytest.approx(np.nansum(amount[window]) if window.any() else 0.0)
            else:
                assert target == channel[mine][np.argmax(at[mine])]
        assert c[task]["ceiling"] == (1.0 if check == "last" else 0.0)
        assert c[task]["n"] == len(rows)


def test_bayes_reference_scores_the_rows_it_is_given(planted, tmp_path):
    """The benchmark's hook finds each evaluated row's Bayes prediction by (anchor key [, observation time]): over
    all of a task's rows it gives exactly the stored ceiling (a wrong match could not, for the derived tasks least
    of all, whose Bayes prediction is the target itself)."""
    from confluence.bench.learnability import bayes_reference
    from confluence.preprocess.pipeline import preprocess

    store = Store.open(preprocess(planted / "raw", planted / "planted.metadata.json", tmp_path / "store",
                                  encoder=HashEncoder(16), progress=False))
    score = bayes_reference(planted)
    for task, c in _ceilings(planted).items():
        n = len(store.task_arrays(task).anchor_row)
        got = score(task, np.arange(n), store)["ceiling"]
        assert got[c["metric"]] == pytest.approx(c["ceiling"]), task
        half = score(task, np.arange(0, n, 2), store)["ceiling"]
        assert half["n"] == len(range(0, n, 2))


def test_bench_learnability_end_to_end(tmp_path):
    out = tmp_path / "bench"
    args = ["bench", "learnability", "--out", str(out), "--steps", "2", "--customers", "60", "--max-seeds", "50",
            "--no-gbdt", "--set", "sampler.batch_size=4", "--set", "sampler.seq_len=64", "--visits"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads((out / "learnability.json").read_text())
    assert {r["task"] for r in report["tasks"]} == set(_ceilings(out / "db"))
    assert "customer_next_visit" in {r["task"] for r in report["tasks"] if r["root_cause"]}
    for r in report["tasks"]:
        if r["task"] in ("customer_orders_30d", "customer_mean_amount", "customer_last_channel",
                         "customer_amount_90d"):
            assert r["ceiling"] == (1.0 if r["metric"] == "accuracy" else 0.0)
        assert r["metric"] in ("accuracy", "auroc", "mae", "mae_days") and r["n"] > 0
    assert "| customers.tier |" in result.output
    assert all(r["reached"] == reached(r) for r in report["tasks"])
    assert f"of {len(report['tasks'])}" in result.output and "runs" not in report
    assert report["steps"] == 2 and report["trained_steps"] == 2
    again = CliRunner().invoke(app, args)  # a finished benchmark is never overwritten
    assert again.exit_code != 0 and "not empty" in again.output


def test_bench_learnability_at_the_recipes_own_run_length(tmp_path):
    """`--steps` takes what `train` takes without `--max-steps` ("auto" or a duration: the recipe's run length and
    early stopping), and the report says how many steps the run trained; a bad length is refused by name before
    anything is written."""
    out = tmp_path / "bench"
    args = ["bench", "learnability", "--out", str(out), "--steps", "4s", "--customers", "60", "--max-seeds", "50",
            "--no-gbdt", "--set", "sampler.batch_size=4", "--set", "sampler.seq_len=64"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads((out / "learnability.json").read_text())
    assert report["steps"] == "4s" and report["trained_steps"] >= 1
    for bad in ("0", "soon"):
        refused = CliRunner().invoke(app, [*args[:3], str(tmp_path / bad), "--steps", bad])
        assert refused.exit_code != 0 and "--steps" in refused.output, refused.output
        assert not (tmp_path / bad).exists()


def test_bench_learnability_over_training_seeds(tmp_path):
    """`--train-seed` trains the same store once per seed and says which signals every run reaches."""
    out = tmp_path / "bench"
    args = ["bench", "learnability", "--out", str(out), "--steps", "2", "--customers", "60", "--max-seeds", "50",
            "--no-gbdt", "--set", "sampler.batch_size=4", "--set", "sampler.seq_len=64",
            "--train-seed", "3", "--train-seed", "5"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads((out / "learnability.json").read_text())
    assert [r["seed"] for r in report["runs"]] == [3, 5]
    for run in report["runs"]:
        assert json.loads((out / run["run"] / "config.json").read_text())["seed"] == run["seed"]
    summary = report["across_runs"]
    assert summary["seeds"] == [3, 5] and summary["n_signals"] == len(report["tasks"])
    for i, t in enumerate(summary["tasks"]):
        per_run = [run["tasks"][i] for run in report["runs"]]
        assert t["reached"] == [r["reached"] for r in per_run]
        assert t["reached_in_every_run"] == all(t["reached"])
        assert t["model"] == [r["model"] for r in per_run]
    assert summary["reached_per_run"] == [sum(r["reached"] for r in run["tasks"]) for run in report["runs"]]
    assert summary["reached_in_every_run"] == sum(t["reached_in_every_run"] for t in summary["tasks"])
    assert "training seed 5 (run-seed5)" in result.output and "in every run:" in result.output
    twice = CliRunner().invoke(app, [*args[:3], str(tmp_path / "other"), *args[4:], "--train-seed", "3"])
    assert twice.exit_code != 0 and "distinct" in twice.output
    assert not (tmp_path / "other").exists()  # refused before anything is written


@pytest.mark.parametrize("of_ceiling,gap_closed,expected", [
    (0.95, 0.2, True), (0.85, 0.99, False), (math.nan, 0.91, True), (math.nan, 0.6, False),
    (math.nan, math.nan, False),
])
def test_a_signal_is_reached_by_its_ceiling_or_else_its_gap(of_ceiling, gap_closed, expected):
    assert reached({"of_ceiling": of_ceiling, "gap_closed": gap_closed}) is expected


@pytest.mark.parametrize("gap, gbdt_gap, share, expected", [
    (0.45, 0.5, 0.9, True),
    (0.44, 0.5, 0.88, False),
    (0.2, -0.1, None, True),  # LightGBM closes none of the gap: the model must close at least as much
    (-0.3, -0.1, None, False),
])
def test_a_root_cause_is_judged_against_lightgbm(gap, gbdt_gap, share, expected):
    from confluence.bench.learnability import of_gbdt, reached_gbdt

    got = of_gbdt(gap, gbdt_gap)
    assert (math.isnan(got) if share is None else got == pytest.approx(share))
    assert reached_gbdt({"gap_closed": gap, "gbdt_gap_closed": gbdt_gap, "of_gbdt": got}) is expected
    assert reached_gbdt({"gap_closed": gap, "gbdt_gap_closed": math.nan, "of_gbdt": math.nan}) is None


def test_a_couriers_form_shows_only_in_the_mean_of_its_orders(planted, tmp_path):
    """`orders.handling` (`couriers` > 0): one order's handling time says little about its courier (the noise is larger
    than the spread between couriers), the mean over the courier's orders says almost everything, and the courier's
    own row says nothing. Without couriers the database is the one drawn before they existed."""
    from dataclasses import replace

    from confluence.synth.planted import COURIER_SPREAD, HANDLING_NOISE

    assert not (planted / "raw" / "couriers.parquet").exists()
    assert "handling" not in pq.read_schema(planted / "raw" / "orders.parquet").names
    base = planted
    planted = write_planted(tmp_path / "couriers", replace(SPEC, couriers=16))
    meta = json.loads((planted / "planted.metadata.json").read_text())
    assert len(meta["tasks"]) == 14 and all(meta["tables"]["orders"]["columns"][c]["foreign_key"] ==
                                            "couriers.courier_id" for c in ("courier_id", "relay_courier_id"))
    for name in ("customers", "stores", "regions"):  # nothing else moves
        assert pq.read_table(planted / "raw" / f"{name}.parquet").equals(pq.read_table(base / "raw" / f"{name}.parquet"))

    orders = pq.read_table(planted / "raw" / "orders.parquet").to_pandas()
    couriers = pq.read_table(planted / "raw" / "couriers.parquet").to_pandas()
    bayes = pq.read_table(planted / "bayes" / "orders.handling.parquet").to_pandas()
    assert set(orders["courier_id"]) <= set(couriers["courier_id"]) and list(couriers.columns) == ["courier_id",
                                                                                                   "vehicle"]
    resid = orders["handling"].to_numpy() - bayes["bayes"].to_numpy()
    assert abs(resid.std() - HANDLING_NOISE) < 1.5  # the noise around the courier's mean
    means = orders.groupby("courier_id")["handling"].mean()
    truth = bayes.assign(c=orders["courier_id"]).groupby("c")["bayes"].first()
    assert np.abs(means - truth).max() < 5 and means.std() > COURIER_SPREAD / 2  # many orders: the mean tells it
    ceil = json.loads((planted / "ceilings.json").read_text())["tasks"]["orders.handling"]
    trivial = np.abs(orders["handling"] - orders["handling"].median()).mean()
    assert ceil["metric"] == "mae" and ceil["ceiling"] < 0.85 * trivial
    from confluence.preprocess.pipeline import preprocess

    store = Store.open(preprocess(planted / "raw", planted / "planted.metadata.json", tmp_path / "store",
                                  encoder=HashEncoder(16), progress=False))
    assert len(store.task_arrays("orders.handling").anchor_row) == ceil["n"]


def test_a_handover_compares_the_two_couriers_of_an_order(tmp_path):
    """`orders.handover` (`couriers` > 0): the relay courier is never the order's courier, the hand-over time is the
    courier's hidden mean less the relay's (noise HANDOVER_NOISE), so it is antisymmetric in the two: a predictor that
    sees the two courier rows as a set, not which is which, cannot beat the median by much."""
    from dataclasses import replace

    from confluence.synth.planted import HANDOVER_NOISE

    planted = write_planted(tmp_path / "couriers", replace(SPEC, couriers=16))
    orders = pq.read_table(planted / "raw" / "orders.parquet").to_pandas()
    bayes = pq.read_table(planted / "bayes" / "orders.handover.parquet").to_pandas()
    assert (orders["courier_id"] != orders["relay_courier_id"]).all()
    assert abs((orders["handover"] - bayes["bayes"]).std() - HANDOVER_NOISE) < 0.5
    # a courier's mean handling time (its form) recovers the hidden means, so the difference is learnable
    form = orders.groupby("courier_id")["handling"].mean()
    guess = form[orders["courier_id"]].to_numpy() - form[orders["relay_courier_id"]].to_numpy()
    trivial = np.abs(orders["handover"] - orders["handover"].median()).mean()
    assert np.abs(orders["handover"] - guess).mean() < 0.5 * trivial
    # the unordered pair alone says nothing of the sign: swapping the two couriers negates the target
    pair = orders[["courier_id", "relay_courier_id"]].min(axis=1) * 100 + orders[["courier_id",
                                                                                  "relay_courier_id"]].max(axis=1)
    by_pair = orders.groupby(pair)["handover"].transform("mean")
    assert np.abs(orders["handover"] - by_pair).mean() > 0.8 * trivial
    ceil = json.loads((planted / "ceilings.json").read_text())["tasks"]["orders.handover"]
    assert ceil["metric"] == "mae" and ceil["ceiling"] < 0.4 * trivial


def test_a_next_visit_is_a_when_next_time_on_a_database_of_decades(planted, tmp_path):
    """`customer_next_visit` (`visits`): the target is the customer's first visit after the observation time
    (recomputed here from the raw visits), the stored Bayes prediction is the conditional median of the plan's
    lognormal gap after the latest visit (recomputed with scipy's lognormal), it beats the plan alone and the median
    wait, and the dates of birth stretch the store's time scale so that a week is under 1 % of it. Without visits the
    database is the one drawn before they existed; with them only the customers gain two columns."""
    from dataclasses import replace

    from scipy.stats import lognorm

    from confluence.preprocess.pipeline import preprocess
    from confluence.synth.planted import PLAN_DAYS, PLANS, VISIT_NOISE

    assert not (planted / "raw" / "visits.parquet").exists()
    assert "plan" not in pq.read_schema(planted / "raw" / "customers.parquet").names
    db = write_planted(tmp_path / "visits", replace(SPEC, visits=True))
    for name in ("orders", "stores", "regions"):
        assert pq.read_table(db / "raw" / f"{name}.parquet").equals(pq.read_table(planted / "raw" / f"{name}.parquet"))
    cust = pq.read_table(db / "raw" / "customers.parquet")
    assert cust.drop(["plan", "born_on"]).equals(pq.read_table(planted / "raw" / "customers.parquet"))
    meta = json.loads((db / "planted.metadata.json").read_text())
    task = meta["tasks"]["customer_next_visit"]
    assert task["target_stype"] == "timestamp" and task["horizon"] == "365 days"

    visits = pq.read_table(db / "raw" / "visits.parquet").to_pandas()
    plan = dict(zip(cust.column("customer_id").to_pylist(), cust.column("plan").to_pylist(), strict=True))
    gaps = visits.sort_values("visited_at").groupby("customer_id")["visited_at"].diff().dt.total_seconds() / 86400
    by_plan = gaps.groupby(visits["customer_id"].map(plan)).median()
    for p, days in zip(PLANS, PLAN_DAYS, strict=True):
        assert by_plan[p] == pytest.approx(days, rel=0.05)

    bayes = pq.read_table(db / "bayes" / "customer_next_visit.parquet").to_pandas()
    times = {c: np.sort(g.to_numpy()) for c, g in visits.groupby("customer_id")["visited_at"]}
    target, expected, last = [], [], []
    for c, t in zip(bayes["customer_id"], bayes["obs_time"], strict=True):
        v = times[c]
        target.append(v[np.searchsorted(v, t.to_datetime64(), side="right")])
        prev = v[np.searchsorted(v, t.to_datetime64(), side="right") - 1]
        last.append(prev)
        gap = lognorm(s=VISIT_NOISE, scale=PLAN_DAYS[PLANS.index(plan[c])])
        waited = (t.to_datetime64() - prev) / np.timedelta64(1, "D")
        q = gap.cdf(waited) + gap.sf(waited) / 2
        expected.append(prev + np.timedelta64(int(round(gap.ppf(q) * 86400e6)), "us"))
    assert (bayes["target"].to_numpy() == np.array(target)).all()
    err = np.abs((bayes["bayes"].to_numpy() - np.array(expected)) / np.timedelta64(1, "s"))
    assert err.max() < 60  # the same median to the minute

    def mae_days(pred) -> float:
        return float(np.mean(np.abs((bayes["target"].to_numpy() - pred) / np.timedelta64(1, "D"))))

    ceil = _ceilings(db)["customer_next_visit"]
    assert ceil["metric"] == "mae_days" and ceil["ceiling"] == pytest.approx(mae_days(bayes["bayes"].to_numpy()))
    wait = bayes["target"] - bayes["obs_time"]
    median_wait = mae_days((bayes["obs_time"] + wait.median()).to_numpy())
    per_plan = bayes["obs_time"] + wait.groupby(bayes["customer_id"].map(plan)).transform("median")
    assert ceil["ceiling"] < 0.6 * mae_days(per_plan.to_numpy()) < 0.6 * median_wait

    store = Store.open(preprocess(db / "raw", db / "planted.metadata.json", tmp_path / "store",
                                  encoder=HashEncoder(16), progress=False))
    assert len(store.task_arrays("customer_next_visit").anchor_row) == ceil["n"]
    from confluence.bench.learnability import bayes_reference

    got = bayes_reference(db)("customer_next_visit", np.arange(ceil["n"]), store)["ceiling"]
    assert got["mae_days"] == pytest.approx(ceil["ceiling"])  # matched by (customer, observation time)
    born = cust.column("born_on").to_pandas()
    assert (born.max() - born.min()).days > 50 * 365
    assert 7 * 86400e6 < 0.01 * store.timestamp_stats[1]  # decades of times: a week is a sliver of the time scale
