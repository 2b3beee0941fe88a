"""`confluence predict` outputs a user would question, and the command's arguments and errors: calendar fields that
agree with the predicted timestamp, counts that are never negative or fractional (and evaluated as reported), the
top-k classes of a categorical prediction, no false `confidence` for numbers, and clear errors before any model
loads. A checkpoint of the tiny model at initialisation (no training) on the tiny bookstore keeps them fast."""

from __future__ import annotations

import datetime as dt
import math

import equinox as eqx
import jax
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from confluence.cli.main import app
from confluence.evaluation.evaluate import model_point_predictions
from confluence.evaluation.predict import postprocess
from confluence.inference.predictor import HeadOutputs, Predictor, load_model
from confluence.model.transformer import RelationalTransformer
from confluence.store import Store
from confluence.targets import decode_targets
from confluence.toolkit.checkpoint import save_checkpoint
from tests.fixtures.model import tiny_run_config

STORE_SAMPLER = {"seq_len": 48, "max_rows": 16, "row_buckets": [16], "text_buckets": [64], "width": 4}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A run directory holding the tiny model's initial parameters as a checkpoint (step 0)."""
    cfg = tiny_run_config(sampler=STORE_SAMPLER)
    params = eqx.filter(RelationalTransformer(cfg.model, key=jax.random.key(0)), eqx.is_inexact_array)
    path = tmp_path_factory.mktemp("predict") / "run"
    save_checkpoint(path, 0, params, None, {"config": cfg.to_dict()})
    return path


def _predict(run, store, *args: str):
    return CliRunner().invoke(app, ["predict", "--checkpoint", str(run), "--db", str(store), *args])


def _heads(n: int, k: int = 0, *, null_logit: float = -9.0, num: np.ndarray | None = None,
           ts: np.ndarray | None = None, cat: np.ndarray | None = None) -> HeadOutputs:
    return HeadOutputs(np.full(n, null_logit, np.float32),
                       np.zeros(n, np.float32) if num is None else num.astype(np.float32),
                       np.zeros(n, np.float32),
                       np.zeros((n, 15), np.float32) if ts is None else ts.astype(np.float32),
                       np.zeros((n, k), np.float32) if cat is None else cat.astype(np.float32))


def _patch_heads(monkeypatch, make):
    """Replace the model's head outputs by `make(real_outputs)` (the sampler and model still run)."""
    real = Predictor._run

    def run(self, task, ids, progress=None, context="train"):
        return make(real(self, task, ids, progress, context))

    monkeypatch.setattr(Predictor, "_run", run)


def test_calendar_fields_are_those_of_the_predicted_timestamp(run, tiny_store, tmp_path, monkeypatch):
    # the real model's timestamp head, made non-null so every row has a timestamp to compare with
    _patch_heads(monkeypatch, lambda o: HeadOutputs(np.full_like(o.null_logit, -9.0), o.num_pred, o.bool_logit,
                                                    o.ts_pred, o.cat_logits))
    r = _predict(run, tiny_store, "--task", "order_time", "--split", "train", "-o", str(tmp_path / "p.csv"),
                 "--no-progress")
    assert r.exit_code == 0, r.output
    t = pacsv.read_csv(tmp_path / "p.csv").to_pylist()
    assert len(t) == 5
    for row in t:
        when: dt.datetime = row["prediction"]
        assert (row["pred_hour"], row["pred_weekday"], row["pred_day_of_month"], row["pred_month"]) == \
            (when.hour, when.weekday(), when.day, when.month), row
        assert 0 <= row["est_hour_of_day"] < 24 and 1 <= row["est_month"] <= 12
        assert "confidence" not in row and 0 <= row["p_null"] < 0.5


def test_the_issues_example_reports_the_cyclic_heads_apart(tiny_store):
    """Epoch head: 2013-01-25 01:42; cyclic heads: 15 h, March. The pred_* fields are the timestamp's own; the
    cyclic heads' disagreeing guesses appear only as est_*."""
    store = Store.open(tiny_store)
    mean, std = store.timestamp_stats
    us = (dt.datetime(2013, 1, 25, 1, 42) - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)
    ts = np.zeros((1, 15))
    ts[0, 14] = (us - mean) / std
    for pair, x, period in ((2, 15, 24), (3, 4, 7), (4, 9, 365.2425 / 12), (5, 2, 12)):  # hour, weekday, day0, month0
        ts[0, 2 * pair], ts[0, 2 * pair + 1] = math.sin(2 * math.pi * x / period), math.cos(2 * math.pi * x / period)
    cols = {k: v.to_pylist()[0] for k, v in postprocess(store, "order_time", _heads(1, ts=ts)).items()}
    assert abs(cols["prediction"] - dt.datetime(2013, 1, 25, 1, 42)) < dt.timedelta(seconds=5)
    assert (cols["pred_hour"], cols["pred_weekday"], cols["pred_day_of_month"], cols["pred_month"]) == (1, 4, 25, 1)
    assert (cols["est_hour_of_day"], cols["est_weekday"], cols["est_day_of_month"], cols["est_month"]) == (15, 4, 10, 3)
    # a NULL prediction has NULL calendar fields
    cols = postprocess(store, "order_time", _heads(1, ts=ts, null_logit=9.0))
    assert cols["prediction"].to_pylist() == [None] and cols["pred_hour"].to_pylist() == [None]


def test_count_predictions_are_never_negative_and_are_evaluated_as_reported(run, tiny_store, tmp_path, monkeypatch):
    store = Store.open(tiny_store)
    predictor = Predictor(load_model(run), store)
    train = decode_targets(store, "orders_next_30d", predictor.seed_ids("train", "orders_next_30d"))
    assert train.values.min() > -1e-6 and np.allclose(train.values, np.round(train.values), atol=1e-4)

    def z(n: int) -> np.ndarray:  # de-normalized: well below 0, fractional, well above the train maximum
        return np.linspace(-6.0, 6.0, n) + 0.1

    _patch_heads(monkeypatch, lambda o: _heads(len(o.null_logit), num=z(len(o.null_logit))))
    r = _predict(run, tiny_store, "--task", "orders_next_30d", "--split", "train", "-o", str(tmp_path / "c.parquet"),
                 "--no-progress")
    assert r.exit_code == 0, r.output
    t = pq.read_table(tmp_path / "c.parquet")
    pred = np.asarray(t.column("prediction").to_pylist(), np.float64)
    info = store.task("orders_next_30d")
    raw = z(len(pred)) * info.stats["std"] + info.stats["mean"]
    assert raw.min() < 0 and raw.max() > train.values.max()  # the test has teeth: the raw head leaves the range
    assert np.any(raw != np.round(raw))
    assert pred.min() >= 0 and np.all(pred == np.round(pred)) and pred.max() <= round(train.values.max())
    assert not any(str(v) == "-0.0" for v in pred)
    assert "confidence" not in t.column_names
    # evaluation scores exactly these numbers
    heads = _heads(len(pred), num=z(len(pred)))
    got = model_point_predictions(predictor, "orders_next_30d", heads, np.ones(len(pred), bool))
    plain = model_point_predictions(predictor, "orders_next_30d", heads, np.ones(len(pred), bool), clip_numbers=False)
    predictor.close()
    np.testing.assert_array_equal(got, pred)
    np.testing.assert_allclose(plain, raw, rtol=1e-6)  # the seed's plain de-normalization stays a setting
    r = _predict(run, tiny_store, "--task", "orders_next_30d", "--split", "train", "-o", str(tmp_path / "r.parquet"),
                 "--no-progress", "--no-clip-numbers")
    assert r.exit_code == 0, r.output
    seed = np.asarray(pq.read_table(tmp_path / "r.parquet").column("prediction").to_pylist(), np.float64)
    np.testing.assert_allclose(seed, raw, rtol=1e-6)


def test_categorical_predictions_list_the_top_classes(run, tiny_store, tmp_path):
    r = _predict(run, tiny_store, "--task", "order_status", "--split", "train", "--top-k", "2",
                 "-o", str(tmp_path / "s.csv"), "--no-progress")
    assert r.exit_code == 0, r.output
    t = pacsv.read_csv(tmp_path / "s.csv", convert_options=pacsv.ConvertOptions(
        column_types={"prediction": pa.string(), "class_1": pa.string(), "class_2": pa.string()},
        strings_can_be_null=True))
    assert t.column_names == ["order_id", "observation_time", "prediction", "confidence", "class_1", "prob_1",
                              "class_2", "prob_2", "p_null"]
    store = Store.open(tiny_store)
    cats = set(decode_targets(store, "order_status").categories)
    for row in t.to_pylist():
        assert {row["class_1"], row["class_2"]} <= cats and row["class_1"] != row["class_2"]
        assert row["prob_1"] >= row["prob_2"] and row["prob_1"] == pytest.approx(row["confidence"])
        assert row["prob_1"] + row["prob_2"] + row["p_null"] <= 1 + 1e-9
        assert row["prediction"] in (None, row["class_1"])
    r = _predict(run, tiny_store, "--task", "order_status", "--split", "train", "--top-k", "0",
                 "-o", str(tmp_path / "s0.parquet"), "--no-progress")
    assert r.exit_code == 0 and "class_1" not in pq.read_table(tmp_path / "s0.parquet").column_names


def test_postprocess_ranks_classes_by_probability(tiny_store):
    store = Store.open(tiny_store)
    k = store.task("order_status").cat_count
    cats = decode_targets(store, "order_status").categories
    logits = np.tile(np.arange(k, dtype=np.float64), (2, 1))  # the last class most probable
    cols = postprocess(store, "order_status", _heads(2, k, cat=logits), top_k=k + 5)
    assert [cols[f"class_{j + 1}"].to_pylist()[0] for j in range(k)] == cats[::-1]
    assert f"class_{k + 1}" not in cols
    p = np.exp(logits[0]) / np.exp(logits[0]).sum() * (1 - 1 / (1 + math.exp(9.0)))
    assert cols["prob_1"].to_pylist()[0] == pytest.approx(p[-1])


def test_predict_shows_progress_unless_asked_not_to(run, tiny_store, tmp_path):
    r = _predict(run, tiny_store, "--task", "order_rating", "--split", "train", "-o", str(tmp_path / "a.csv"))
    assert r.exit_code == 0, r.output
    assert "predict order_rating" in r.output and "wrote 2 predictions" in r.output
    r = _predict(run, tiny_store, "--task", "order_rating", "--split", "train", "-o", str(tmp_path / "b.csv"),
                 "--no-progress")
    assert r.exit_code == 0 and "predict order_rating" not in r.output


def _error(r, *fragments: str) -> None:
    assert r.exit_code == 1, r.output
    assert r.output.startswith("error: ") and "Traceback" not in r.output, r.output
    for f in fragments:
        assert f in r.output, (f, r.output)


def test_bad_arguments_fail_clearly_before_the_model_loads(tiny_store, tmp_path):
    missing = tmp_path / "no_run"  # loading it would fail with "no checkpoint found": every error comes before
    r = _predict(missing, tiny_store, "--task", "order_rating", "-o", str(tmp_path / "p.txt"))
    _error(r, "p.txt: unknown output format '.txt'; use a .parquet or .csv file")
    assert not (tmp_path / "p.txt").exists()
    names = ", ".join(t.name for t in Store.open(tiny_store).tasks)
    r = _predict(missing, tiny_store, "--task", "nope", "-o", str(tmp_path / "p.csv"))
    _error(r, f"no task 'nope' in {tiny_store}; tasks: {names}")
    r = _predict(missing, tiny_store, "--task", "order_rating", "--split", "tset", "-o", str(tmp_path / "p.csv"))
    _error(r, "unknown split 'tset'")
    r = _predict(missing, tiny_store, "--task", "order_status", "--top-k", "-1", "-o", str(tmp_path / "p.csv"))
    _error(r, "top_k (--top-k) must be 0 or more, not -1")
    r = _predict(missing, tiny_store, "--task", "order_rating", "-o", str(tmp_path / "p.csv"))
    _error(r, "no checkpoint found")


def test_anchor_file_errors_name_the_line_or_row(tiny_store, tmp_path):
    missing = tmp_path / "no_run"
    out = ["-o", str(tmp_path / "p.csv")]
    pacsv.write_csv(pa.table({"order_id": [100, 101, 999]}), tmp_path / "a.csv")
    r = _predict(missing, tiny_store, "--task", "order_rating", "--anchors", str(tmp_path / "a.csv"), *out)
    _error(r, f"{tmp_path / 'a.csv'}: has no 'observation_time' column; give every anchor its time")
    r = _predict(missing, tiny_store, "--task", "order_rating", "--anchors", str(tmp_path / "a.csv"), *out,
                 "--observation-time", "row")
    _error(r, f"{tmp_path / 'a.csv'}: line 4: key 999 is not a 'orders' row")  # header line 1, data lines 2..4
    pq.write_table(pa.table({"order_id": [100, 999, 101]}), tmp_path / "a.parquet")
    r = _predict(missing, tiny_store, "--task", "order_rating", "--anchors", str(tmp_path / "a.parquet"), *out,
                 "--observation-time", "latest")
    _error(r, "a.parquet: row 1 (counting from 0): key 999")
    (tmp_path / "t.csv").write_text("order_id,observation_time\n100,2020-01-01 00:00:00\n101,yesterday\n")
    r = _predict(missing, tiny_store, "--task", "order_rating", "--anchors", str(tmp_path / "t.csv"), *out)
    _error(r, "t.csv: line 3: observation_time 'yesterday' is not a timestamp")
    r = _predict(missing, tiny_store, "--task", "order_rating", "--anchors", str(tmp_path / "none.csv"), *out)
    _error(r, "none.csv: no such anchors file")
    r = _predict(missing, tiny_store, "--task", "order_rating", "--anchors", str(tmp_path / "a.json"), *out)
    _error(r, "a.json: unknown anchors file format '.json'")


def test_anchor_file_predictions(run, tiny_store, tmp_path):
    pacsv.write_csv(pa.table({"order_id": [102, 100]}), tmp_path / "a.csv")
    r = _predict(run, tiny_store, "--task", "order_rating", "--anchors", str(tmp_path / "a.csv"),
                 "-o", str(tmp_path / "p.parquet"), "--no-progress", "--observation-time", "row")
    assert r.exit_code == 0, r.output
    t = pq.read_table(tmp_path / "p.parquet")
    assert t.column("order_id").to_pylist() == [102, 100]
    assert t.column_names == ["order_id", "observation_time", "prediction", "p_null"]
