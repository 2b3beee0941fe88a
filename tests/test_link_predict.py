"""Prediction and serving on a link task: `confluence predict --task LINKTASK` writes per anchor the k likeliest
target rows by primary key with their scores (exactly `LinkRanker.rank_at`'s), for a split's seeds or an anchors
file, a new anchor with no link history included; bad input is refused by name before the model loads; the HTTP
service answers the same rows per anchor, lists the link task, and a checkpoint without a link head is refused."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import equinox as eqx
import jax
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from confluence.cli.main import app as cli
from confluence.evaluation.link_predict import LinkAnswerer, link_summary, predict_links, seed_anchors
from confluence.inference.predictor import load_model
from confluence.model.transformer import RelationalTransformer
from confluence.preprocess.pipeline import preprocess
from confluence.serving.app import create_app
from confluence.serving.service import PredictionService, RequestError, ServeSettings
from confluence.store import Store
from confluence.toolkit.checkpoint import save_checkpoint
from tests.fixtures.bookstore import HashEncoder, bookstore_tables, write_bookstore, write_metadata
from tests.fixtures.model import tiny_run_config
from tests.test_link_model import SAMPLER, TASK
from tests.test_links import meta_with
from tests.test_serve import serving

NEW = 999  # a customer with no order: no seed of the task, no link history
COLUMNS = ["customer_id", "observation_time", "rank", "book_id", "score"]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Store:
    tmp = tmp_path_factory.mktemp("link_predict")
    tables = bookstore_tables("small")
    c = tables["customers"]
    row = c.slice(c.num_rows - 1, 1).to_pylist()[0] | {"customer_id": NEW, "name": "new customer"}
    tables["customers"] = pa.concat_tables([c, pa.Table.from_pylist([row], schema=c.schema)])
    return Store.open(preprocess(write_bookstore(tmp, size="small", tables=tables), write_metadata(tmp, meta_with()),
                                 tmp / "store", encoder=HashEncoder(8), progress=False))


@pytest.fixture(scope="module")
def run(store, tmp_path_factory) -> Path:
    from confluence.training.links import train_links

    out = tmp_path_factory.mktemp("link_predict_run") / "run"
    train_links(store, TASK, out, tiny_run_config(sampler=SAMPLER), steps=10)
    return out


@pytest.fixture(scope="module")
def answerer(store, run):
    a = LinkAnswerer(load_model(run), store, TASK)
    yield a
    a.close()


@pytest.fixture(scope="module")
def headless(tmp_path_factory) -> Path:
    """A checkpoint of the tiny model's initial parameters: no link head."""
    cfg = tiny_run_config(sampler=SAMPLER)
    params = eqx.filter(RelationalTransformer(cfg.model, key=jax.random.key(0)), eqx.is_inexact_array)
    path = tmp_path_factory.mktemp("headless") / "run"
    save_checkpoint(path, 0, params, None, {"config": cfg.to_dict()})
    return path


def _expected(store: Store, answerer: LinkAnswerer, rows: np.ndarray, obs: np.ndarray, k: int | None = None):
    """`rank_at`'s answer as (book keys per anchor, scores per anchor)."""
    ranked, chances = answerer.ranker.rank_at(rows, obs, k)
    books = store.table("books")
    keys = np.asarray(store.keys("books").to_pylist(), dtype=object)
    return ([keys[r[r >= 0] - books.row_offset].tolist() for r in ranked],
            [c[~np.isnan(c)].tolist() for c in chances])


def _grouped(table: pa.Table) -> list[dict]:
    """The long table per anchor, in order: key, observation time (ISO 8601), book keys, scores; ranks checked."""
    out: list[dict] = []
    for r in table.to_pylist():
        t = None if r["observation_time"] is None else r["observation_time"].isoformat()
        if r["rank"] == 1:
            out.append({"customer_id": r["customer_id"], "observation_time": t, "book_id": [], "score": []})
        assert r["rank"] == len(out[-1]["book_id"]) + 1
        out[-1]["book_id"].append(r["book_id"])
        out[-1]["score"].append(r["score"])
    return out


def test_predict_writes_each_seeds_ranked_target_keys_as_rank_at_ranks_them(store, run, answerer, tmp_path):
    out = tmp_path / "val.csv"
    res = CliRunner().invoke(cli, ["predict", "--checkpoint", str(run), "--db", str(store.path), "--task", TASK,
                                   "--split", "val", "--max-seeds", "12", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "wrote the top 5 books rows of 12 anchor(s) (60 rows)" in res.output
    table = pacsv.read_csv(out)
    assert table.column_names == COLUMNS and table.num_rows == 60
    got = _grouped(table)
    rows, obs, keys = seed_anchors(store, TASK, "val", 12)
    assert [g["customer_id"] for g in got] == keys.to_pylist()
    assert [g["observation_time"] for g in got] == \
        [dt.datetime.fromtimestamp(t / 1e6, dt.UTC).replace(tzinfo=None).isoformat() for t in obs]
    books = set(store.keys("books").to_pylist())
    want_keys, want_scores = _expected(store, answerer, rows, obs)
    for g, wk, ws in zip(got, want_keys, want_scores, strict=True):
        assert len(g["book_id"]) == 5 == len(set(g["book_id"])) and set(g["book_id"]) <= books
        assert all(a >= b for a, b in zip(g["score"], g["score"][1:], strict=False))  # likeliest first
        assert all(0.0 < s < 1.0 for s in g["score"])
        assert g["book_id"] == wk and np.allclose(g["score"], ws, rtol=1e-12)


@pytest.fixture(scope="module")
def anchors_file(tmp_path_factory) -> Path:
    """Two customers with history at a time of their own, and the new customer at the latest time."""
    path = tmp_path_factory.mktemp("link_anchors") / "anchors.parquet"
    pq.write_table(pa.table({"customer_id": [7, 3, NEW],
                             "observation_time": pa.array(["2024-09-20T00:00:00", "2024-10-01T12:00:00", None])}),
                   path)
    return path


@pytest.fixture(scope="module")
def anchor_answer(store, run, anchors_file, tmp_path_factory) -> pa.Table:
    """What the CLI writes for `anchors_file` (its anchor without a time at --observation-time), top 4."""
    out = tmp_path_factory.mktemp("link_out") / "anchors_out.parquet"
    res = CliRunner().invoke(cli, ["predict", "--checkpoint", str(run), "--db", str(store.path), "--task", TASK,
                                   "--anchors", str(anchors_file), "--observation-time", "2024-10-15T00:00:00",
                                   "--top-k", "4", "-o", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    table = pq.read_table(out)
    assert link_summary(table) == {"task": TASK, "k": 4, "anchors": 3, "target_table": "books"}
    return table


def test_an_anchors_file_and_a_new_anchor_without_history(store, answerer, anchor_answer):
    arr = store.link_arrays(TASK)
    cust = store.table("customers")
    new_row = cust.row_offset + store.keys("customers").to_pylist().index(NEW)
    assert new_row not in set(np.asarray(arr.anchor_row).tolist())  # no seed: no link history
    got = _grouped(anchor_answer)
    assert [g["customer_id"] for g in got] == [7, 3, NEW]
    assert [g["observation_time"] for g in got] == ["2024-09-20T00:00:00", "2024-10-01T12:00:00",
                                                    "2024-10-15T00:00:00"]
    keys = store.keys("customers").to_pylist()
    rows = np.array([cust.row_offset + keys.index(c) for c in (7, 3, NEW)])
    obs = np.array([int(dt.datetime.fromisoformat(g["observation_time"]).replace(tzinfo=dt.UTC).timestamp() * 1e6)
                    for g in got])
    want_keys, want_scores = _expected(store, answerer, rows, obs, 4)
    for g, wk, ws in zip(got, want_keys, want_scores, strict=True):
        assert len(g["book_id"]) == 4 == len(set(g["book_id"]))  # the new customer too: k distinct books
        assert g["book_id"] == wk and np.allclose(g["score"], ws, rtol=1e-12)


class Steps:
    """A progress reporter that records its steps and advances."""

    def __init__(self):
        self.steps: list[list] = []

    def step(self, desc: str, total: int) -> None:
        self.steps.append([desc, total, 0])

    def advance(self, n: int = 1) -> None:
        self.steps[-1][2] += n


def test_the_python_api_reports_progress_in_anchors(store, answerer, anchors_file, anchor_answer):
    steps = Steps()
    table = predict_links(None, store, TASK, anchors=anchors_file, observation_time="2024-10-15T00:00:00", k=4,
                          progress=steps, answerer=answerer)
    assert steps.steps == [[f"predict {TASK}", 3, 3]]
    assert table.to_pylist() == anchor_answer.to_pylist()
    steps = Steps()
    table = predict_links(None, store, TASK, split="val", max_seeds=70, progress=steps, answerer=answerer)
    assert steps.steps == [[f"predict {TASK}", 70, 70]]  # in two chunks of whole batches: as one call ranks
    rows, obs, _ = seed_anchors(store, TASK, "val", 70)
    assert [g["book_id"] for g in _grouped(table)] == _expected(store, answerer, rows, obs)[0]


@pytest.mark.parametrize("args, fragment", [
    (["--task", "nope"], "no task 'nope' in"),
    (["--task", "nope"], "link tasks: customer_books"),
    (["--anchors", "BAD"], "line 3: key 12345 is not a 'customers' row (1 unknown key(s))"),
    (["--anchors", "NOTIME"], "has no 'observation_time' column"),
    (["--blend", "gbdt"], "--blend is for cell tasks; 'customer_books' is a link task"),
    (["--context-labels", "test"], "--context-labels is for cell tasks"),
    (["--top-k", "0"], "top_k (--top-k) must be 1 or more for a link task, not 0"),
    (["--split", "nope"], "unknown split 'nope'"),
], ids=["task", "task-lists-links", "key", "time", "blend", "context", "k", "split"])
def test_bad_input_is_refused_by_name_before_the_model_loads(store, tmp_path, args, fragment):
    bad = tmp_path / "bad.csv"
    pacsv.write_csv(pa.table({"customer_id": [3, 12345], "observation_time": ["2024-09-01", "2024-09-01"]}), bad)
    notime = tmp_path / "notime.csv"
    pacsv.write_csv(pa.table({"customer_id": [3]}), notime)
    args = [{"BAD": str(bad), "NOTIME": str(notime)}.get(a, a) for a in args]
    if "--task" not in args:
        args += ["--task", TASK]
    out = tmp_path / "out.csv"
    res = CliRunner().invoke(cli, ["predict", "--checkpoint", str(tmp_path / "no-checkpoint"), "--db",
                                   str(store.path), "-o", str(out), "--no-progress", *args])
    assert res.exit_code == 1 and fragment in res.output and "Traceback" not in res.output, res.output
    assert not out.exists()


def test_a_checkpoint_without_a_link_head_is_refused(store, headless, tmp_path):
    res = CliRunner().invoke(cli, ["predict", "--checkpoint", str(headless), "--db", str(store.path), "--task", TASK,
                                   "-o", str(tmp_path / "out.csv"), "--no-progress"])
    assert res.exit_code == 1 and "has no link head" in res.output and "train-links" in res.output, res.output
    assert not (tmp_path / "out.csv").exists()
    service = PredictionService(headless, store.path, ServeSettings(warm_up=False))
    try:
        assert all(t["kind"] == "cell" for t in service.tasks) and service.card["link_tasks"] == []
        with pytest.raises(RequestError, match="link task 'customer_books' is not served: .* has no link head"):
            service.link_rows(TASK, [3], None, None)
    finally:
        service.stop()


@pytest.fixture(scope="module")
def server(run, store):
    with serving(create_app(run, store.path, batch_size=8, max_anchors=5, warm_up=False)) as client:
        yield client


def test_the_service_answers_what_predict_writes(server, anchor_answer):
    anchors = [{"key": 7, "observation_time": "2024-09-20T00:00:00"},
               {"key": 3, "observation_time": "2024-10-01T12:00:00"},
               {"key": NEW, "observation_time": "2024-10-15T00:00:00Z"}]  # an offset, converted to UTC
    status, body = server.post("/predict", {"task": TASK, "anchors": anchors, "top_k": 4})
    assert status == 200, body
    assert (body["task"], body["kind"], body["key_column"], body["target_key_column"]) == \
        (TASK, "link", "customer_id", "book_id")
    want = _grouped(anchor_answer)
    assert len(body["rows"]) == 3
    for g, w in zip(body["rows"], want, strict=True):
        assert list(g) == ["customer_id", "observation_time", "book_id", "score"]
        assert g["customer_id"] == w["customer_id"] and g["observation_time"] == w["observation_time"]
        assert g["book_id"] == w["book_id"] and np.allclose(g["score"], w["score"], rtol=1e-12)
    status, body = server.post("/predict", {"task": TASK, "anchors": [{"key": 3}]})  # default time and k
    assert status == 200 and len(body["rows"][0]["book_id"]) == 5, body


def test_the_service_lists_the_link_task_and_refuses_bad_link_requests(server):
    status, tasks = server.get("/tasks")
    link = next(t for t in tasks if t["name"] == TASK)
    assert status == 200 and link["kind"] == "link" and link["target_type"] == "link"
    assert (link["anchor_table"], link["key_column"], link["key_type"]) == ("customers", "customer_id", "integer")
    assert (link["target_table"], link["target_key_column"], link["k"]) == ("books", "book_id", 5)
    assert all(t["kind"] == "cell" for t in tasks if t["name"] != TASK)
    status, card = server.get("/model")
    assert status == 200 and card["link_tasks"] == [TASK]
    for body, code, fragment in [
        ({"task": TASK, "anchors": [{"key": 3}, {"key": 12345}]}, 422, "anchors[1]: key 12345 is not a 'customers' row"),
        ({"task": TASK, "anchors": [{"key": 3}], "top_k": 0}, 422, "top_k: a link task ranks at least 1"),
        ({"task": TASK, "anchors": [{"key": 3}], "top_k": 101}, 422, "top_k"),
        ({"task": TASK, "anchors": [{"key": 3, "observation_time": "soon"}]}, 422, "anchors[0]: observation_time"),
        ({"task": TASK, "anchors": [{"key": i} for i in range(1, 7)]}, 413, "at most 5 per request"),
        ({"task": "nope", "anchors": [{"key": 3}]}, 422, "link tasks: customer_books"),
    ]:
        status, answer = server.post("/predict", body)
        assert status == code and fragment in answer["detail"], (body, answer)
    status, answer = server.post("/explain", {"task": TASK, "anchors": [{"key": 3}]})
    assert status == 422 and "is a link task; /explain answers cell tasks" in answer["detail"], answer
