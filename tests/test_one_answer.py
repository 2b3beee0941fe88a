"""One answer per question (docs/design/evaluation.md, "One answer per question"): for the same anchor, observation time,
checkpoint and readable labels, `evaluate`, `predict --split`, `predict --anchors` and the service give the same
prediction; by default the service and `--anchors` read every label known at the time, `--split` the split's."""

from __future__ import annotations

import json
import threading

import equinox as eqx
import jax
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
import uvicorn
from typer.testing import CliRunner

from confluence.cli.main import app
from confluence.evaluation.evaluate import evaluate
from confluence.evaluation.predict import predict
from confluence.model.transformer import RelationalTransformer
from confluence.preprocess import preprocess
from confluence.serving.app import create_app
from confluence.toolkit.checkpoint import save_checkpoint
from tests.fixtures.bookstore import HashEncoder, bookstore_metadata, write_bookstore
from tests.fixtures.model import D_T, tiny_run_config
from tests.fixtures.net import free_port

TASK = "order_rating"  # numerical, cell masking: its labels are other orders' ratings
SAMPLER = {"seq_len": 48, "max_rows": 16, "row_buckets": [16], "text_buckets": [64], "width": 4, "labels": 3,
           "batch_size": 8}
DRAWS = 2


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("one_answer")
    meta = tmp / "bookstore.json"
    meta.write_text(json.dumps(bookstore_metadata()))
    store = preprocess(write_bookstore(tmp / "raw", "parquet", size="small"), meta, tmp / "store",
                       encoder=HashEncoder(D_T), progress=False)
    cfg = tiny_run_config(sampler=SAMPLER)
    model = RelationalTransformer(cfg.model, key=jax.random.key(7))
    # a null head that answers "not null", so every row has a number to compare (the untrained one says NULL)
    model = eqx.tree_at(lambda m: m.heads.null_head.bias, model, model.heads.null_head.bias - 20.0)
    params = eqx.filter(model, eqx.is_inexact_array)
    save_checkpoint(tmp / "run", 0, params, None, {"config": cfg.to_dict()})
    return store, tmp / "run", tmp


def _anchors_file(table: pa.Table, key: str, path):
    pacsv.write_csv(pa.table({key: table.column(key), "observation_time": pa.array(
        [t.isoformat() for t in table.column("observation_time").to_pylist()], pa.string())}), path)
    return path


@pytest.mark.slow
def test_evaluate_predict_and_serve_give_one_answer(world):
    store, run, tmp = world
    by_split = predict(run, store, TASK, split="test", draws=DRAWS, clip_numbers=False)
    key = by_split.schema.names[0]
    assert by_split.num_rows >= 8
    want = by_split.column("prediction").to_numpy(zero_copy_only=False).astype(np.float64)
    assert np.isfinite(want).all()

    # evaluate scored exactly these numbers
    res = evaluate(run, store, split="test", tasks=[TASK], max_seeds=None, keep_rows=True, clip_numbers=False,
                   draws=DRAWS)
    rows = res[TASK]["rows"]
    truth = np.isfinite(np.asarray(rows.truth, np.float64))
    assert len(rows.pred) == len(want) or truth.all()
    np.testing.assert_allclose(np.asarray(rows.pred, np.float64), want[: len(rows.pred)] if len(rows.pred) ==
                               len(want) else want, rtol=1e-6)

    # predict --anchors with the test split's labels: the same answers, bit for bit
    path = _anchors_file(by_split, key, tmp / "anchors.csv")
    same = predict(run, store, TASK, anchors=path, draws=DRAWS, clip_numbers=False, context_labels="test")
    np.testing.assert_array_equal(same.column("prediction").to_numpy(), want)
    # ... and by default every label known by then: another question, which the docs and the help name
    known = predict(run, store, TASK, anchors=path, draws=DRAWS, clip_numbers=False)
    assert known.num_rows == by_split.num_rows
    also_known = predict(run, store, TASK, split="test", draws=DRAWS, clip_numbers=False, context_labels="all")
    np.testing.assert_array_equal(also_known.column("prediction").to_numpy(), known.column("prediction").to_numpy())

    # the service, asked for the test split's labels, answers the same
    application = create_app(run, store, max_anchors=100, draws=DRAWS, clip_numbers=False)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(application, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        import time
        import urllib.request

        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health") as r:
                    if json.loads(r.read())["status"] == "ready":
                        break
            except OSError:
                pass
            time.sleep(0.2)
        anchors = [{"key": k, "observation_time": t.isoformat()} for k, t in
                   zip(by_split.column(key).to_pylist(), by_split.column("observation_time").to_pylist(),
                       strict=True)]
        for labels, expect in (("test", want), ("all", known.column("prediction").to_numpy())):
            body = json.dumps({"task": TASK, "anchors": anchors, "context_labels": labels}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/predict", body,
                                         {"content-type": "application/json"})
            with urllib.request.urlopen(req) as r:
                got = np.array([row["prediction"] for row in json.loads(r.read())["rows"]], np.float64)
            np.testing.assert_allclose(got, expect.astype(np.float64), rtol=1e-6, atol=1e-6)
    finally:
        server.should_exit = True
        thread.join(30)


def test_an_anchors_file_needs_explicit_times(world):
    store, run, tmp = world
    (tmp / "none.csv").write_text("order_id\n1000\n")
    (tmp / "blank.csv").write_text("order_id,observation_time\n1000,2021-01-01\n1001,\n")
    base = ["predict", "--checkpoint", str(run), "--db", str(store), "--task", TASK, "-o", str(tmp / "x.csv"),
            "--draws", "1", "--force"]
    r = CliRunner().invoke(app, [*base, "--anchors", str(tmp / "none.csv")])
    assert r.exit_code == 1 and "has no 'observation_time' column; give every anchor its time" in r.output
    r = CliRunner().invoke(app, [*base, "--anchors", str(tmp / "blank.csv")])
    assert r.exit_code == 1 and "blank.csv: line 3: observation_time is empty (1 such row(s))" in r.output
    for choice in ("row", "latest", "2021-06-01T00:00:00"):
        r = CliRunner().invoke(app, [*base, "--anchors", str(tmp / "blank.csv"), "--observation-time", choice])
        assert r.exit_code == 0, r.output
    got = pacsv.read_csv(tmp / "x.csv").column("observation_time").to_pylist()
    assert [str(t)[:10] for t in got] == ["2021-01-01", "2021-06-01"]  # a given time stays; the blank is filled
    r = CliRunner().invoke(app, [*base, "--anchors", str(tmp / "blank.csv"), "--context-labels", "everything"])
    assert r.exit_code == 1 and "must be one of train, val, test, all" in r.output
