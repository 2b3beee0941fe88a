"""Evaluate and predict with a checkpoint trained inside the test; zero-shot evaluation on a second database;
prediction post-processing against direct computations."""

from __future__ import annotations

import datetime as dt
import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from confluence.errors import ConfluenceError
from confluence.evaluation.evaluate import evaluate
from confluence.evaluation.predict import postprocess, predict
from confluence.inference.predictor import HeadOutputs, load_model
from confluence.preprocess.pipeline import preprocess
from confluence.store import Store
from confluence.targets import decode_targets
from confluence.training.loop import open_stream, train
from tests.fixtures.bookstore import HashEncoder, bookstore_metadata, write_bookstore
from tests.fixtures.model import tiny_run_config
from tests.test_eval_gbdt import META, _tables

D_T = 16
SAMPLER = {"row_buckets": [16], "text_buckets": [64], "width": 4}


@pytest.fixture(scope="module")
def shop(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    src = tmp / "shop"
    src.mkdir()
    for t, table in _tables(3, False).items():
        pq.write_table(table, src / f"{t}.parquet")
    meta = tmp / "shop.json"
    meta.write_text(json.dumps(META))
    store = preprocess(src, meta, tmp / "shop_store", encoder=HashEncoder(D_T), progress=False)
    cfg = tiny_run_config(model={"d_t": D_T}, sampler={**SAMPLER, "max_rows": 16, "seq_len": 48, "batch_size": 8},
                          loop={"max_steps": 12, "ckpt_every": 6, "val_every": 6})
    with open_stream([store], cfg) as stream:
        train(cfg, stream, tmp / "run", progress=False)
    return store, tmp / "run", tmp


@pytest.fixture(scope="module")
def bookstore(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("zero_shot")
    src = write_bookstore(tmp / "raw", "parquet", size="small")
    meta = tmp / "bookstore.json"
    meta.write_text(json.dumps(bookstore_metadata()))
    return preprocess(src, meta, tmp / "store", encoder=HashEncoder(D_T), progress=False)


HEADLINE = {"amount": "mae", "status": "accuracy", "buys_next_30d": "auroc"}


@pytest.mark.slow
def test_evaluate_reports_model_and_baselines(shop):
    store, run, _ = shop
    res = evaluate(run, store, split="test", max_seeds=64)
    assert set(res) == set(HEADLINE)
    for task, metric in HEADLINE.items():
        r = res[task]
        assert np.isfinite(r["model"][metric]), (task, r)
        assert metric in r["baseline"] and r["baseline"]["name"] in r
        assert r["info"]["n_eval"] > 0 and r["info"]["checkpoint_step"] == 12


@pytest.mark.slow
def test_zero_shot_evaluation_on_a_database_the_model_never_saw(shop, bookstore):
    _, run, _ = shop
    res = evaluate(run, bookstore, split="train", max_seeds=32)
    assert "order_rating" in res and "customer_premium" in res
    assert np.isfinite(res["order_rating"]["model"]["mae"])


@pytest.mark.slow
def test_predict_split_and_anchor_file(shop):
    store_path, run, tmp = shop
    store = Store.open(store_path)
    table = predict(run, store_path, "status", split="test", out=tmp / "pred.parquet")
    assert pq.read_table(tmp / "pred.parquet").equals(table)
    assert table.column_names[:4] == ["order_id", "observation_time", "prediction", "confidence"]
    cats = set(store.task("status").stats["categories"]) if "categories" in (store.task("status").stats or {}) \
        else set(store.columns[store.task("status").target_column_idx].stats["categories"])
    assert set(table.column("prediction").drop_null().to_pylist()) <= cats
    # Anchors named by key, with and without an observation time.
    pacsv.write_csv(pa.table({"customer_id": [1, 2, 3],
                              "observation_time": pa.array([dt.datetime(2020, 6, 1)] * 3, pa.timestamp("us"))}),
                    tmp / "anchors.csv")
    t2 = predict(run, store_path, "buys_next_30d", anchors=tmp / "anchors.csv", out=tmp / "p2.csv")
    assert t2.column("customer_id").to_pylist() == [1, 2, 3]
    assert all(0.0 <= c <= 1.0 for c in t2.column("confidence").to_pylist())
    pacsv.write_csv(pa.table({"customer_id": [1, 999]}), tmp / "bad.csv")
    with pytest.raises(ConfluenceError, match="bad.csv: line 3: key 999"):  # header line 1, data lines 2..
        predict(run, store_path, "buys_next_30d", anchors=tmp / "bad.csv", observation_time="row")


def test_postprocess_matches_direct_computation(shop):
    store_path, _, _ = shop
    store = Store.open(store_path)
    n = 5
    rng = np.random.default_rng(0)
    z = rng.standard_normal(n).astype(np.float32)
    null_logit = np.array([-5, -5, 5, -5, -5], np.float32)  # the third row is predicted NULL
    # numerical: de-normalized with the task's stats
    out = HeadOutputs(null_logit, z, np.zeros(n, np.float32), np.zeros((n, 15), np.float32), np.zeros((n, 0), np.float32))
    info = store.task("amount")
    cols = postprocess(store, "amount", out)
    pred = cols["prediction"].to_pylist()
    assert pred[2] is None
    for i in (0, 1, 3, 4):
        assert pred[i] == pytest.approx(float(z[i]) * info.stats["std"]
                                        + info.stats["mean"])
    # categorical: the argmax category string with its probability, round-tripping decode_targets' classes
    k = store.task("status").cat_count
    truth = decode_targets(store, "status", np.arange(n))
    logits = np.full((n, k), -4.0, np.float32)
    logits[np.arange(n), truth.values] = 4.0
    cols = postprocess(store, "status", HeadOutputs(np.full(n, -9, np.float32), z, z, out.ts_pred, logits))
    assert cols["prediction"].to_pylist() == [truth.categories[i] for i in truth.values]
    assert all(c > 0.9 for c in cols["confidence"].to_pylist())
    # timestamp: the true encoding's epoch component decodes back to the true datetime
    mean, std = store.timestamp_stats
    when = np.array([dt.datetime(2020, 3, 4, 5, 6, 7), dt.datetime(2021, 12, 31, 23, 0)], dtype="datetime64[us]")
    us = when.astype(np.int64)
    ts = np.zeros((2, 15), np.float32)
    ts[:, 14] = (us - mean) / std
    for p, (x, per) in enumerate([(7, 60), (6, 60), (5, 24)]):
        ts[:, 2 * p], ts[:, 2 * p + 1] = math.sin(2 * math.pi * x / per), math.cos(2 * math.pi * x / per)
    store_ts = HeadOutputs(np.full(2, -9, np.float32), np.zeros(2, np.float32), np.zeros(2, np.float32), ts,
                           np.zeros((2, 0), np.float32))
    got = postprocess(store, "amount", store_ts)  # any task works for shape; decode via a timestamp-typed helper
    assert got["prediction"].type == pa.float64()
    from confluence.targets.timestamp import cyclic_fields

    assert cyclic_fields(ts)["est_hour_of_day"][0] == 5
    decoded = (ts[:, 14].astype(np.float64) * std + mean)
    assert np.all(np.abs(decoded - us) < std * 1e-6 + 1e6)  # float32 z-score: within a second


def test_anchor_predictions_see_the_requested_observation_time(shop, monkeypatch):
    """Predicting for (anchor, time) pairs of a task with an observation-time cell encodes *those* times."""
    from confluence.inference.predictor import Predictor
    from confluence.preprocess.encode import encode_timestamp

    store_path, run, _ = shop
    store = Store.open(store_path)
    assert store.task("buys_next_30d").obs_column_idx >= 0
    seen = []
    monkeypatch.setattr(Predictor, "_run", lambda self, task, ids, progress=None, context="train": seen.append(task))
    obs = np.array([1_590_969_600_000_000, 1_600_000_000_000_000], np.int64)  # 2020-06-01, 2020-09-13
    Predictor(load_model(run), store).anchor_outputs("buys_next_30d", np.array([0, 1]), obs)
    mean, std = store.timestamp_stats
    np.testing.assert_array_equal(seen[0].obs_ts, encode_timestamp(obs, mean, std))


def test_load_model_reports_a_missing_checkpoint(tmp_path):
    with pytest.raises(ConfluenceError, match="no checkpoint found"):
        load_model(tmp_path)


@pytest.mark.slow
def test_evaluate_with_gbdt_adds_a_paired_comparison(shop):
    store, run, _ = shop
    res = evaluate(run, store, split="test", tasks=["amount"], max_seeds=64, gbdt=True)
    r = res["amount"]
    c = r["model_vs_gbdt"]
    assert c["diff"] == pytest.approx(r["model"]["mae"] - r["gbdt"]["mae"], rel=1e-9, abs=1e-12)
    assert c["ci_low"] <= c["diff"] <= c["ci_high"] and c["n_boot"] == 1000


def test_write_json_is_atomic_and_maps_nan_to_null(tmp_path):
    from confluence.evaluation.evaluate import write_json

    path = write_json({"t": {"model": {"mae": float("nan"), "n": np.float32(2.0)}}}, tmp_path / "sub" / "m.json")
    assert json.loads(path.read_text()) == {"t": {"model": {"mae": None, "n": 2.0}}}
    assert [p.name for p in path.parent.iterdir()] == ["m.json"]  # no temporary file left behind
