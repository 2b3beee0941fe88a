"""The nycflights13 demo: deterministic build, and the reviewed metadata validates against it."""

from __future__ import annotations

import hashlib

import pytest

from confluence.demo import NYCFLIGHTS13_TABLES, build_nycflights13, demo_metadata_path, demo_source_dir
from confluence.schema.metadata import load_metadata
from confluence.schema.validate import load_and_validate
from confluence.sources import open_source
from confluence.stypes import TARGET_STYPES, SemanticType

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    return demo_source_dir(tmp_path_factory.mktemp("cache"))


def _digest(path):
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.iterdir())}


def test_reviewed_metadata_validates_against_the_demo(demo_dir):
    with open_source(demo_dir) as raw:
        assert raw.tables == sorted(NYCFLIGHTS13_TABLES)
        meta = load_and_validate(demo_metadata_path(), raw)
        assert raw.num_rows("flights") == 336_776
        assert raw.num_rows("weather") == 26_115
        seeds = {name: raw.fetchall(f"SELECT count(*) FROM ({t.query})")[0][0] for name, t in meta.tasks.items()}
    assert set(meta.tables) == set(NYCFLIGHTS13_TABLES)
    link = meta.link_tasks["plane_dest_next_30d"]  # the demo's link task: the airports a plane flies to next month
    assert (link.anchor_table, link.target_table, link.k) == ("planes", "airports", 10)
    flights = meta.tables["flights"]
    assert {c.name: c.foreign_key for c in flights.foreign_keys()} == {
        "carrier": "airlines.carrier", "tailnum": "planes.tailnum", "origin": "airports.faa",
        "dest": "airports.faa", "weather_id": "weather.weather_id"}
    assert flights.temporal_column == "sched_dep_at" and meta.tables["weather"].temporal_column == "time_hour"
    # every target type, both cell masking and derived tasks with observation times
    assert {t.target_stype for t in meta.tasks.values()} == set(TARGET_STYPES)
    derived = [t for t in meta.tasks.values() if t.observation_time_column]
    assert {t.target_stype for t in derived} == {
        SemanticType.NUMERICAL, SemanticType.BOOLEAN, SemanticType.CATEGORICAL}
    aggregates = [meta.tasks["plane_flights_next_30d"], meta.tasks["airport_next_day_delay_over_15"]]
    assert all(1_000 <= seeds[t.name] <= 50_000 for t in aggregates), seeds
    assert not meta.tasks["flights.carrier"].is_cell_masking(meta)
    assert meta.tasks["flights.cancelled"].is_cell_masking(meta)
    assert seeds["flights.cancelled"] == 336_776


def test_derived_tasks_bound_themselves_in_time(demo_dir):
    meta = load_metadata(demo_metadata_path())
    with open_source(demo_dir) as raw:
        # every flight counted by the plane task departs after its observation time
        q = meta.tasks["plane_flights_next_30d"].query
        (n, total, bad) = raw.fetchall(
            f"SELECT count(*), sum(n_flights), count(*) FILTER (WHERE obs_time > TIMESTAMP '2013-12-01') FROM ({q})"
        )[0]
        assert n > 0 and total > 0 and bad == 0
        # the airport task's day starts after its observation time: no flight of that day departs before it
        q = meta.tasks["airport_next_day_delay_over_15"].query
        (early,) = raw.fetchall(
            f"SELECT count(*) FROM ({q}) s JOIN flights f ON f.origin = s.faa"
            " AND CAST(make_date(f.year, f.month, f.day) AS TIMESTAMP) = s.obs_time"
            " WHERE f.sched_dep_at <= s.obs_time"
        )[0]
        assert early == 0


def test_build_is_deterministic_and_cached(demo_dir, tmp_path):
    again = build_nycflights13(tmp_path / "again")
    assert _digest(again) == _digest(demo_dir)
    before = {f.name: f.stat().st_mtime_ns for f in demo_dir.iterdir()}
    assert demo_source_dir(demo_dir.parent) == demo_dir  # cached: not rebuilt
    assert {f.name: f.stat().st_mtime_ns for f in demo_dir.iterdir()} == before
    # a concurrent builder that finishes second keeps the first copy (replace=False)
    assert build_nycflights13(demo_dir, replace=False) == demo_dir
    assert {f.name: f.stat().st_mtime_ns for f in demo_dir.iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    assert not [p for p in demo_dir.parent.iterdir() if ".tmp-" in p.name]


def test_gbdt_multiclass_stays_stable_with_many_train_seeds(demo_dir, tmp_path):
    """Regression: with LightGBM's default min_sum_hessian_in_leaf, flights.carrier on 20,000 train seeds
    collapsed to accuracy 0.34 (log loss 10.6); the baseline must not get worse with more data."""
    from confluence.evaluation.baselines import split_ids
    from confluence.evaluation.gbdt import fit_gbdt
    from confluence.preprocess.pipeline import preprocess
    from confluence.sampler.splits import subsample
    from confluence.store import Store

    store = Store.open(preprocess(demo_dir, demo_metadata_path(), tmp_path / "store", progress=False))
    task = "flights.carrier"
    res = fit_gbdt(store, task, split_ids(store, task, "train"), subsample(split_ids(store, task, "test"), 500),
                   max_train=20_000)
    assert res.metrics["accuracy"] > 0.9 and res.metrics["log_loss"] < 1.0, res.metrics
