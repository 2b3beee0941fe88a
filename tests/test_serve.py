"""`confluence serve` over real HTTP: a uvicorn server (in a thread, and the real CLI in a subprocess) answering
`POST /predict` with exactly the rows of `confluence predict --anchors`, concurrent clients batched into shared
model calls with unchanged answers, bad requests refused with a 4xx naming the field, `/health`, `/tasks`,
`/model`, the OpenAPI page, and a clean exit on SIGTERM. The tiny model's initial parameters saved as a checkpoint
on the tiny bookstore keep it fast (what is tested is the serving, not the model's skill)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pytest
import uvicorn
from typer.testing import CliRunner

from confluence.cli.main import app as cli
from confluence.evaluation.predict import KeyIndex, predict
from confluence.inference.predictor import Predictor, load_model
from confluence.model.transformer import RelationalTransformer
from confluence.serving.app import create_app
from confluence.serving.batching import Stats, head_outputs
from confluence.serving.service import json_rows
from confluence.store import Store
from confluence.toolkit.checkpoint import save_checkpoint
from tests.fixtures.graphs import random_store
from tests.fixtures.model import tiny_run_config
from tests.fixtures.net import free_port

STORE_SAMPLER = {"seq_len": 48, "max_rows": 16, "row_buckets": [16], "text_buckets": [64], "width": 4}
ROOT = Path(__file__).resolve().parents[1]
SERVER_BATCH = 8


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A run directory holding the tiny model's initial parameters as a checkpoint (step 0)."""
    cfg = tiny_run_config(sampler=STORE_SAMPLER)
    params = eqx.filter(RelationalTransformer(cfg.model, key=jax.random.key(0)), eqx.is_inexact_array)
    path = tmp_path_factory.mktemp("serve") / "run"
    save_checkpoint(path, 0, params, None, {"config": cfg.to_dict()})
    return path


class Client:
    """Plain HTTP/1.1 JSON calls with the standard library."""

    def __init__(self, base: str):
        self.base = base

    def call(self, method: str, path: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                status, text = r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode()
        try:
            return status, json.loads(text)
        except json.JSONDecodeError:
            return status, text

    def get(self, path: str) -> tuple[int, Any]:
        return self.call("GET", path)

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        return self.call("POST", path, body)

    def wait_ready(self, timeout: float = 90.0, proc: subprocess.Popen | None = None) -> dict:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if proc is not None and proc.poll() is not None:
                raise AssertionError(f"the server exited with {proc.returncode}: {proc.stderr.read()}")
            try:
                status, body = self.get("/health")
                if status == 200 and body["status"] == "ready":
                    return body
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.1)
        raise AssertionError("the server did not get ready")


@contextlib.contextmanager
def serving(app: Any) -> Iterator[Client]:
    """`app` on uvicorn in a thread on a free port, ready: its client; stopped (and joined) after."""
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    client = Client(f"http://127.0.0.1:{port}")
    client.wait_ready()
    try:
        yield client
    finally:
        srv.should_exit = True
        thread.join(30)
    assert not thread.is_alive()


@pytest.fixture(scope="module")
def server(run, tiny_store):
    """The real app on uvicorn in a thread; a long batching window so concurrent requests share model calls."""
    with serving(create_app(run, tiny_store, batch_size=SERVER_BATCH, max_wait_ms=30, max_anchors=20)) as client:
        yield client


def expected(run: Path, store: Path, task: str, anchors: list[dict], tmp: Path, **kw: Any) -> list[dict]:
    """`predict(..., anchors=FILE, observation_time="row")` (an anchor without a time: its row's own, as the
    service reads it) for the same anchors written as a CSV file, as JSON rows (pass the server's
    batch size: a forward pass of another shape can round the last bit differently)."""
    cols = {"key": [a["key"] for a in anchors]}
    if any("observation_time" in a for a in anchors):
        cols["observation_time"] = pa.array([a.get("observation_time") for a in anchors], pa.string())
    path = tmp / f"anchors_{task}_{abs(hash(json.dumps(anchors)))}.csv"
    pacsv.write_csv(pa.table(cols), path)
    return json_rows(predict(run, store, task, anchors=path, observation_time="row", **kw))


def same_rows(got: list[dict], want: list[dict], exact: bool = True) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert list(g) == list(w), (g, w)  # same columns, same order
        for k in w:
            if not exact and isinstance(w[k], float) and isinstance(g[k], float):
                assert math.isclose(g[k], w[k], rel_tol=1e-5, abs_tol=1e-6), (k, g, w)
            else:
                assert g[k] == w[k], (k, g, w)


# The observation times are given as the CSV file holds them: naive ISO 8601 strings.
CASES = [
    ("order_rating", [{"key": 102}, {"key": 100}, {"key": 104}]),  # numerical, clipped like predict's
    ("order_status", [{"key": 101, "observation_time": "2020-01-04T00:00:00"},
                      {"key": 103, "observation_time": "2020-01-20T08:00:00"}]),  # categorical
    ("order_time", [{"key": 100}, {"key": 105}]),  # timestamp: ISO 8601 datetimes in the rows
    ("orders_next_30d", [{"key": 1, "observation_time": "2020-02-01T00:00:00"},
                         {"key": 3, "observation_time": "2020-03-01T00:00:00"}]),
    ("book_genre", [{"key": "b3"}, {"key": "b1"}, {"key": "b2"}]),  # string keys, no time
    ("book_expensive", [{"key": "b2"}]),  # boolean
]


@pytest.mark.parametrize("task,anchors", CASES, ids=[c[0] for c in CASES])
def test_predict_rows_equal_predict_with_an_anchors_file(server, run, tiny_store, tmp_path, task, anchors):
    status, body = server.post("/predict", {"task": task, "anchors": anchors})
    assert status == 200, body
    assert body["task"] == task
    want = expected(run, tiny_store, task, anchors, tmp_path, batch_size=SERVER_BATCH)
    assert body["key_column"] == list(want[0])[0]
    same_rows(body["rows"], want)  # a request alone: value by value, exactly


def test_top_k_and_a_zone_offset(server, run, tiny_store, tmp_path):
    anchors = [{"key": 101, "observation_time": "2020-01-20T10:00:00+02:00"}, {"key": 100}]
    status, body = server.post("/predict", {"task": "order_status", "anchors": anchors, "top_k": 1})
    assert status == 200, body
    assert "class_1" in body["rows"][0] and "class_2" not in body["rows"][0]
    utc = [{"key": 101, "observation_time": "2020-01-20T08:00:00"}, {"key": 100}]
    # an anchor without a time gets its default, the anchor row's own time (as a file without the column)
    assert body["rows"][1]["observation_time"] == expected(run, tiny_store, "order_status", [{"key": 100}],
                                                           tmp_path, batch_size=SERVER_BATCH)[0]["observation_time"]
    want = expected(run, tiny_store, "order_status", utc[:1], tmp_path, top_k=1, batch_size=SERVER_BATCH)
    same_rows(body["rows"][:1], want, exact=False)


def test_concurrent_clients_share_model_calls_and_get_their_own_answers(server, run, tiny_store, tmp_path):
    requests = [("order_status", [{"key": 100 + i % 6}, {"key": 100 + (i + 2) % 6}]) for i in range(8)] + \
               [("book_genre", [{"key": f"b{1 + i % 3}"}]) for i in range(8)] + \
               [("order_rating", [{"key": 100 + i % 6}]) for i in range(8)] + \
               [("book_genre", [{"key": "b3"}, {"key": "b1"}, {"key": "b2"}]) for _ in range(8)]
    want = {json.dumps(r): expected(run, tiny_store, r[0], r[1], tmp_path, batch_size=SERVER_BATCH) for r in requests}
    _, before = server.get("/health")
    results: dict[int, tuple[int, Any]] = {}
    barrier = threading.Barrier(8)

    def client(t: int) -> None:
        barrier.wait()
        for i in range(t, len(requests), 8):  # 8 threads x 4 requests
            task, anchors = requests[i]
            results[i] = server.post("/predict", {"task": task, "anchors": anchors})

    threads = [threading.Thread(target=client, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert len(results) == len(requests)
    for i, (task, anchors) in enumerate(requests):
        status, body = results[i]
        assert status == 200, body
        same_rows(body["rows"], want[json.dumps((task, anchors))], exact=False)
    _, after = server.get("/health")
    calls = after["stats"]["model_calls"] - before["stats"]["model_calls"]
    served = after["stats"]["requests"] - before["stats"]["requests"]
    assert served == len(requests) and after["stats"]["errors"] == before["stats"]["errors"]
    assert calls < served, after["stats"]  # batched: fewer model calls than requests
    assert after["stats"]["merged_calls"] > before["stats"]["merged_calls"], after["stats"]


def test_merged_requests_get_what_each_would_get_alone(run, tiny_store):
    """The batching itself, without HTTP: several requests in shared forward passes equal separate calls. An
    anchor's contexts depend on the anchor and its time, not on its position in a request (`anchor_seed_keys`)."""
    store = Store.open(tiny_store)
    predictor = Predictor(load_model(run), store, batch_size=4)
    try:
        arrays = store.task_arrays("book_genre")
        rows, obs = np.asarray(arrays.anchor_row[:3]), np.asarray(arrays.obs_time[:3])
        # one anchor, eight times in one request: eight times the same answer (before 2026-11-27 the walk, so
        # the answer, depended on the position)
        repeated = predictor.anchor_outputs("book_genre", np.repeat(rows[:1], 8), np.repeat(obs[:1], 8))
        np.testing.assert_array_equal(repeated.cat_logits, np.repeat(repeated.cat_logits[:1], 8, axis=0))
        heads = ("null_logit", "num_pred", "bool_logit", "ts_pred", "cat_logits")
        requests = [(rows, obs), (rows[::-1].copy(), obs[::-1].copy()), (rows[:1], obs[:1])]
        stats = Stats()
        merged = head_outputs(predictor, "book_genre", requests, stats)
        assert stats.model_calls == 2 and stats.merged_calls >= 1  # 7 anchors in batches of 4: two full passes
        for (r, o), got in zip(requests, merged, strict=True):
            want = predictor.anchor_outputs("book_genre", r, o)
            for name in heads:
                np.testing.assert_allclose(getattr(got, name), getattr(want, name), rtol=1e-5, atol=1e-6)
    finally:
        predictor.close()


def test_merged_requests_keep_the_labelled_context_of_new_anchors(tmp_path):
    """With labelled context (sampler.labels > 0) an anchor's context shows every label known by its time, as
    `predict --anchors` builds it; merged requests keep that (a context of train labels only would differ)."""
    store = random_store(0)
    cfg = tiny_run_config(model={"d_t": store.d_t}, sampler={**STORE_SAMPLER, "labels": 3})
    params = eqx.filter(RelationalTransformer(cfg.model, key=jax.random.key(0)), eqx.is_inexact_array)
    save_checkpoint(tmp_path / "run", 0, params, None, {"config": cfg.to_dict()})
    predictor = Predictor(load_model(tmp_path / "run"), store, batch_size=4)
    try:
        for task in store.tasks:
            arrays = store.task_arrays(task.name)
            ids = np.linspace(0, len(arrays.anchor_row) - 1, 5).astype(np.int64)
            rows, obs = np.asarray(arrays.anchor_row)[ids], np.asarray(arrays.obs_time)[ids]
            requests = [(rows, obs), (rows[::-1].copy(), obs[::-1].copy())]
            for (r, o), got in zip(requests, head_outputs(predictor, task.name, requests), strict=True):
                want = predictor.anchor_outputs(task.name, r, o)
                np.testing.assert_allclose(got.null_logit, want.null_logit, rtol=1e-5, atol=1e-6)
                np.testing.assert_allclose(got.num_pred, want.num_pred, rtol=1e-5, atol=1e-6)
    finally:
        predictor.close()


BAD = [
    ({"task": "nope", "anchors": [{"key": 100}]}, 422, "task: no task 'nope' in store 'bookstore'; tasks: "),
    ({"task": "order_status", "anchors": []}, 422, "anchors: List should have at least 1 item"),
    ({"task": "order_status", "anchors": [{"key": 100}, {"key": 999}]}, 422,
     "anchors[1]: key 999 is not a 'orders' row"),
    ({"task": "order_status", "anchors": [{"key": "abc"}]}, 422,
     "anchors[0]: key 'abc' cannot be a key of 'orders' (its keys are int64)"),
    ({"task": "order_status", "anchors": [{"key": 100}, {"key": 101, "observation_time": "yesterday"}]}, 422,
     "anchors[1]: observation_time 'yesterday' is not a timestamp"),
    ({"task": "order_status", "anchors": [{"key": 1.5}]}, 422, "anchors[0].key: a key is an integer or a string"),
    ({"task": "order_status", "anchors": [{"key": 100}, {"key": 2**70}]}, 422,
     "anchors[1]: key 1180591620717411303424 is out of the 64-bit integer range"),
    ({"task": "order_status", "anchors": [{"kee": 100}]}, 422, "anchors[0].key: Field required"),
    ({"task": "order_status", "anchors": [{"key": 100}], "top_k": -1}, 422, "top_k: Input should be greater"),
    ({"anchors": [{"key": 100}]}, 422, "task: Field required"),
    ({"task": "order_status", "anchors": [{"key": 100}] * 21}, 413, "anchors: 21 anchors, at most 20"),
]


@pytest.mark.parametrize("body,status,fragment", BAD, ids=[b[2].split(":")[0] + f"-{i}" for i, b in enumerate(BAD)])
def test_bad_requests_get_a_4xx_naming_the_field(server, body, status, fragment):
    got, answer = server.post("/predict", body)
    assert got == status, answer
    assert fragment in answer["detail"], answer
    assert "Traceback" not in json.dumps(answer)


def test_malformed_json_is_a_4xx(server):
    status, answer = server.call("POST", "/predict", raw=b'{"task": "order_status", "anchors": [')
    assert status == 422 and "not valid JSON" in answer["detail"], answer
    status, answer = server.call("POST", "/predict", raw=b"[" * 50_000)  # nested beyond the parser's depth
    assert status == 422 and "not valid JSON" in answer["detail"], answer


NON_FINITE = [
    (b'{"task": "order_status", "anchors": [{"key": NaN}]}', "anchors[0].key: NaN"),
    (b'{"task": "order_status", "anchors": [{"key": 100}], "top_k": Infinity}', "top_k: Infinity"),
    (b'{"task": "order_status", "anchors": [{"key": 100}, {"key": -Infinity}]}', "anchors[1].key: -Infinity"),
    (b'{"task": "order_status", "anchors": [{"key": 1e999}]}', "anchors[0].key: Infinity"),
]


@pytest.mark.parametrize("raw,fragment", NON_FINITE, ids=[f[1] for f in NON_FINITE])
def test_nan_and_infinity_are_a_422_naming_the_field(server, raw, fragment):
    """Python's JSON parser accepts NaN and Infinity (JSON has neither): refused, naming the field, not a 500."""
    status, answer = server.call("POST", "/predict", raw=raw)
    assert status == 422 and answer["detail"].startswith(fragment), answer
    assert "no NaN or Infinity" in answer["detail"]


LONG = "k" * 20_000
EXCERPTS = [
    ({"task": "t" * 20_000, "anchors": [{"key": 100}]}, "task: no task 'tttt"),
    ({"task": "order_status", "anchors": [{"key": LONG}]}, "anchors[0]: key 'kkkk"),
    ({"task": "book_genre", "anchors": [{"key": "b1"}, {"key": LONG}]}, "anchors[1]: key"),
    ({"task": "order_status", "anchors": [{"key": 100, "observation_time": LONG}]}, "anchors[0]: observation_time"),
    ({"task": "order_status", "anchors": [{"key": 100, "note": LONG}]}, "anchors[0].note: Extra inputs"),
    ({"task": "order_status", "anchors": [{"key": 100, LONG: 1}]}, "anchors[0].kkkk"),
    ({"task": "order_status", "anchors": [{"key": [LONG]}]}, "anchors[0].key: a key is an integer or a string"),
    ({"task": "order_status", "anchors": [{"key": 10 ** 4000}]}, "anchors[0]: key 1000"),
    ({"task": "order_status", "anchors": [{"kee": i} for i in range(20)]}, "; and 30 more error(s)"),
]


@pytest.mark.parametrize("body,fragment", EXCERPTS, ids=[f"excerpt-{i}" for i in range(len(EXCERPTS))])
def test_errors_repeat_at_most_an_excerpt_of_a_value(server, body, fragment):
    """A bad 20,000-character value is named by its first 100 characters and "…", in `detail` and in `errors`."""
    status, answer = server.post("/predict", body)
    assert status == 422 and fragment in answer["detail"], answer
    text = json.dumps(answer, ensure_ascii=False)
    assert len(text) < 2500, text[:300]
    assert not any(c * 101 in text for c in "tk0"), text[:300]
    assert "…" in text or len(body["anchors"]) == 20


def test_a_body_over_the_limit_is_a_413(server):
    """The limit derived from --max-anchors (20 here): 64 KiB + 512 bytes per anchor."""
    status, health = server.get("/health")
    assert health["max_body_bytes"] == 64 * 1024 + 512 * 20
    status, answer = server.post("/predict", {"task": "order_status", "anchors": [{"key": 100}],
                                              "pad": "x" * 80_000})
    assert status == 413 and "at most 75776 bytes per request (the server's --max-body-bytes)" in answer["detail"]
    assert len(json.dumps(answer)) < 300


def test_health_tasks_model_and_the_openapi_page(server, run, tiny_store):
    status, health = server.get("/health")
    assert status == 200 and health["status"] == "ready" and health["store"] == "bookstore", health
    assert health["batch_size"] == SERVER_BATCH and health["max_anchors"] == 20 and health["draws"] == 4
    assert health["compiled_shapes"] == health["batch_shapes"] >= 1  # every batch shape compiled before ready
    status, tasks = server.get("/tasks")
    store = Store.open(tiny_store)
    assert status == 200 and [t["name"] for t in tasks] == [t.name for t in store.tasks]
    genre = next(t for t in tasks if t["name"] == "book_genre")
    assert genre["anchor_table"] == "books" and genre["key_column"] == "book_id" and genre["key_type"] == "string"
    assert genre["target_type"] == "categorical" and "genre" in genre["description"]
    status, card = server.get("/model")
    ck = load_model(run)
    assert status == 200 and card["step"] == 0 and card["store"]["name"] == "bookstore"
    assert card["parameters"] == sum(x.size for x in jax.tree_util.tree_leaves(eqx.filter(ck.model,
                                                                                            eqx.is_inexact_array)))
    h = hashlib.sha256()
    for f in sorted(p for p in ck.path.iterdir() if p.is_file()):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    assert card["checkpoint_sha256"] == h.hexdigest()
    assert "code" in card and card["code"] == json.loads((ck.path / "meta.json").read_text()).get("code")
    assert card["config"]["model"]["d_model"] == 16 and card["config"]["sampler"]["seq_len"] == 48
    status, spec = server.get("/openapi.json")
    assert status == 200 and {"/predict", "/health", "/tasks", "/model"} <= set(spec["paths"])
    assert {"PredictRequest", "PredictResponse", "Anchor", "Health", "TaskInfo", "ModelCard"} <= \
        set(spec["components"]["schemas"])
    assert "422" in spec["paths"]["/predict"]["post"]["responses"]
    assert "PredictRequest" in json.dumps(spec["paths"]["/predict"]["post"]["requestBody"])
    status, _ = server.get("/docs")  # the page loads its assets from a CDN: off unless --docs
    assert status == 404


def test_bad_paths_fail_before_binding(run, tiny_store, tmp_path):
    port = free_port()
    r = CliRunner().invoke(cli, ["serve", "--checkpoint", str(tmp_path / "none"), "--db", str(tiny_store),
                                 "--port", str(port)])
    assert r.exit_code == 1 and "error: no checkpoint found" in r.output and "Traceback" not in r.output, r.output
    r = CliRunner().invoke(cli, ["serve", "--checkpoint", str(run), "--db", str(tmp_path / "nostore"),
                                 "--port", str(port)])
    assert r.exit_code == 1 and "not a processed store" in r.output and "Traceback" not in r.output, r.output
    with socket.socket() as s:  # nothing listens
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_the_cli_serves_and_exits_cleanly_on_sigterm(run, tiny_store, tmp_path):
    port = free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "confluence.cli.main", "serve", "--checkpoint", str(run),
                             "--db", str(tiny_store), "--port", str(port), "--max-wait-ms", "1",
                             "--compile-cache", str(tmp_path / "jax")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        client = Client(f"http://127.0.0.1:{port}")
        client.wait_ready(proc=proc)
        anchors = [{"key": "b2"}, {"key": "b1"}]
        status, body = client.post("/predict", {"task": "book_genre", "anchors": anchors})
        assert status == 200, body
        same_rows(body["rows"], expected(run, tiny_store, "book_genre", anchors, tmp_path))
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert time.monotonic() - t0 < 15
        assert "serving step 0" in err and "stopped" in err and "Traceback" not in err, err
        assert any((tmp_path / "jax").iterdir())  # the compiled model kept for a restart
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("kind", ["int", "string"])
def test_the_key_index_finds_what_arrow_finds(kind):
    """The service's sorted key index (built once per table) answers as `pc.index_in` did: first row of a
    duplicate key, -1 for NULL and unknown keys."""
    rng = np.random.default_rng(0)
    if kind == "int":
        table = pa.array(np.r_[rng.permutation(1000) * 3, [6, 9]].astype(np.int64))
        query = pa.array([*rng.integers(-5, 3100, 500).tolist(), 6, None], pa.int64())
    else:
        table = pa.array([f"k{i}" for i in rng.permutation(300)] + ["k5", ""])
        query = pa.array([*(f"k{i}" for i in rng.integers(0, 400, 200)), "k5", "", None])
    want = np.asarray(pc.fill_null(pc.index_in(query, value_set=table), -1))
    np.testing.assert_array_equal(KeyIndex(table).rows(query), want)
    assert (KeyIndex(pa.array([], table.type)).rows(query) == -1).all()


def test_bench_serve_measures_a_real_server_with_its_draws(run, tiny_store):
    """`confluence bench serve`'s function: a real `confluence serve` child process, real HTTP requests; the server
    says how many context draws it answers each anchor from, and the figures come back."""
    from confluence.bench.serve import bench_serve

    res = bench_serve(run, tiny_store, task="book_genre", clients=(1,), requests=8, warmup=2, batch_size=16,
                      draws=2, log=lambda _: None)
    level = res["levels"][0]
    assert res["draws"] == 2 and res["batch_size"] == 16
    assert level["requests"] == 8 and level["anchors"] == 8 and level["model_calls"] >= 1
    assert level["latency_ms"]["p50"] > 0


def test_explain_answers_what_predict_explain_writes(server, run, tiny_store, tmp_path):
    """`POST /explain` explains the anchors as `predict --explain` does for the same anchors (an anchors file),
    names a bad field, and refuses more anchors than --max-explain-anchors (16)."""
    anchors = [{"key": 101, "observation_time": "2020-01-04T00:00:00"}, {"key": 103}]
    status, body = server.post("/explain", {"task": "order_status", "anchors": anchors, "rows": 3})
    assert status == 200, body
    assert body["task"] == "order_status" and len(body["explanations"]) == 2
    path = tmp_path / "anchors.csv"
    pacsv.write_csv(pa.table({"key": [101, 103], "observation_time": pa.array(["2020-01-04T00:00:00", None],
                                                                               pa.string())}), path)
    table = predict(run, tiny_store, "order_status", anchors=path, observation_time="row", explain=3,
                    batch_size=SERVER_BATCH)
    want = [json.loads(t) for t in table.column("explanation").to_pylist()]
    for got, w in zip(body["explanations"], want, strict=True):
        assert got["anchor"] == w["anchor"] and got["quantity"] == w["quantity"]
        assert [(r["table"], r["key"]) for r in got["rows"]] == [(r["table"], r["key"]) for r in w["rows"]]
        assert math.isclose(got["prediction"], w["prediction"], rel_tol=1e-5, abs_tol=1e-6)
    status, body = server.post("/explain", {"task": "order_status", "anchors": anchors, "rows": 0})
    assert status == 422 and "rows" in body["detail"], body
    status, body = server.post("/explain", {"task": "nope", "anchors": anchors})
    assert status == 422 and "no task 'nope'" in body["detail"], body
    status, body = server.post("/explain", {"task": "order_status", "anchors": [{"key": 101}] * 17})
    assert status == 413 and "--max-explain-anchors" in body["detail"], body
