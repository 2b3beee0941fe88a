"""The leakage certificate (`evaluate --certify`, confluence.evaluation.certify): it passes where the sampler keeps
its rules, and fails naming the culprit on deliberately leaky configurations: a sampler that admits rows dated after
the observation time, and one that shows labels before their horizon."""

import dataclasses

import numpy as np
import pytest

from confluence.evaluation.certify import FUTURE_CELL, UNKNOWN_LABEL, certify, certify_task
from confluence.sampler.data import SamplerData
from confluence.sampler.sampler import Sampler
from confluence.store.format import STATIC_TIME
from tests.fixtures.configs import seed_sampler

CFG = seed_sampler(batch_size=8, seq_len=96, max_rows=24, labels=4, child_counts="anchor",
                    child_count_windows=(7, 30), recent=4, child_means="anchor_and_parents")


def _temporal_tasks(store):
    return [t.name for t in store.tasks if t.observation_time == "observation_time_column"]


def _test_seeds(store, task, n=16):
    s = Sampler([store], CFG)
    ids = s.seed_ids("test", task)
    s.close()
    return ids[np.linspace(0, ids.size - 1, min(n, ids.size)).astype(int)]


def test_the_sampler_leaks_nothing_on_any_task(small_planted_store):
    store = small_planted_store
    res = certify(store, CFG, [t.name for t in store.tasks], "test", max_seeds=12)
    assert res["passed"], {t: c["leaks"][:2] for t, c in res["tasks"].items() if not c["passed"]}
    temporal = _temporal_tasks(store)
    assert temporal and all(res["tasks"][t]["seeds"] > 0 and res["tasks"][t]["future_rows"] > 0 for t in temporal)
    assert len(res["digest"]) == 64
    assert res == certify(store, CFG, [t.name for t in store.tasks], "test", max_seeds=12)  # deterministic


def test_a_sampler_that_admits_future_rows_is_named(small_planted_store):
    """A sampler whose row times say every row is static walks rows dated after the observation time: the rows the
    certificate randomizes (by the store's own times) change its contexts, and each leak names the row's table,
    key and column."""
    store = small_planted_store
    task = _temporal_tasks(store)[0]
    data = SamplerData.from_store(store)
    static = np.full_like(np.asarray(data.row_time), STATIC_TIME)
    leaky = dataclasses.replace(data, row_time=static, child_time=np.full_like(np.asarray(data.child_time),
                                                                              STATIC_TIME))
    cert = certify_task(store, CFG, task, _test_seeds(store, task), context="test", data=leaky)
    assert not cert.passed
    future = [x for x in cert.leaks if x.what == FUTURE_CELL]
    assert future, cert.leaks[:3]
    x = future[0]
    assert x.task == task and x.table in {t.name for t in store.tables} and "=" in x.row and x.column
    assert x.table in x.message() and x.column in x.message() and task in x.message()
    # the same seeds with the sampler's own times: no leak
    assert certify_task(store, CFG, task, _test_seeds(store, task), context="test").passed


class _Horizon:
    """The store, but its metadata says `task`'s labels are known `horizon` after the observation time."""

    def __init__(self, store, task, horizon):
        self._store = store
        meta = dict(store.meta)
        db = dict(meta["database"])
        db["tasks"] = {**db["tasks"], task: {**db["tasks"][task], "horizon": horizon}}
        self.meta = {**meta, "database": db}

    def __getattr__(self, name):
        return getattr(self._store, name)


def test_a_label_shown_before_its_horizon_is_named(small_planted_store):
    """The sampler shows a derived task's labels from their observation time (its metadata: horizon 0); if they
    were really known only ten years later, every label a context shows is read before it is known: the
    certificate, judging by the true horizon, names them."""
    store = small_planted_store
    task = _temporal_tasks(store)[0]
    truth = _Horizon(store, task, "3650 days")
    cert = certify_task(truth, CFG, task, _test_seeds(store, task), context="test",
                        data=SamplerData.from_store(store))
    assert not cert.passed
    labels = [x for x in cert.leaks if x.what == UNKNOWN_LABEL]
    assert labels and all(x.task == task for x in labels), cert.leaks[:3]
    assert cert.unknown_labels > 0


@pytest.mark.parametrize("what", [FUTURE_CELL, UNKNOWN_LABEL])
def test_the_cli_fails_naming_the_leak(what, capsys):
    """`evaluate --certify` prints a verdict per task and exits 1 with each leak named: task, anchor, time, what
    leaked, table, row and column."""
    import typer

    from confluence.cli.eval_cmds import _print_certificate

    leak = {"task": "t", "anchor": "customers customer_id=3", "observation_time": 10**15, "table": "orders",
            "row": "order_id=9", "column": "amount", "what": what}
    results = {"t": {"certificate": {"passed": False, "seeds": 4, "n_leaks": 1, "leaks": [leak], "digest": "d"}}}
    with pytest.raises(typer.Exit) as exc:
        _print_certificate(results)
    assert exc.value.exit_code == 1
    out = capsys.readouterr()
    assert "certificate t: 4 contexts rebuilt with the future randomized: 1 leaking cell(s)" in out.out
    assert "customers customer_id=3 at 2001-09-09 01:46:40" in out.err and what in out.err
    assert "orders order_id=9 column 'amount'" in out.err


def test_a_target_copied_into_a_same_row_column_is_a_warning(tmp_path):
    """A column of the anchor row that restates the target (here `orders.rating_copy` = the rating task's target)
    is what the task's definition lets through: no randomization of the future finds it, the single-column check
    names it; the honest columns raise nothing."""
    import pyarrow as pa

    from confluence.evaluation.certify import same_row_warnings
    from confluence.preprocess.pipeline import preprocess
    from confluence.store import Store
    from tests.fixtures.bookstore import (
        HashEncoder,
        bookstore_metadata,
        bookstore_tables,
        write_bookstore,
        write_metadata,
    )

    tables = bookstore_tables("small")
    orders = tables["orders"]
    tables["orders"] = orders.append_column("rating_copy", pa.compute.multiply(orders["rating"], 2.0))
    meta = bookstore_metadata()
    meta["tables"]["orders"]["columns"]["rating_copy"] = {"stype": "numerical"}
    store = Store.open(preprocess(write_bookstore(tmp_path, tables=tables), write_metadata(tmp_path, meta),
                                  tmp_path / "store", encoder=HashEncoder(8), progress=False))
    s = Sampler([store], CFG)
    found = same_row_warnings(store, "order_rating", s.seed_ids("train", "order_rating"),
                              s.seed_ids("val", "order_rating"))
    assert len(found) == 1 and "orders.rating_copy" in found[0] and "exclude_columns" in found[0], found
    assert same_row_warnings(store, "order_status", s.seed_ids("train", "order_status"),
                             s.seed_ids("val", "order_status")) == []
    s.close()


def test_the_report_shows_the_certificate():
    from confluence.evaluation.report import certificate_html

    cert = {"passed": False, "seeds": 12, "n_leaks": 1, "digest": "abc123",
            "leaks": [{"task": "t", "anchor": "customers customer_id=3", "observation_time": 0, "table": "orders",
                       "row": "order_id=9", "column": "amount", "what": FUTURE_CELL}],
            "warnings": ["column orders.copy alone predicts 't' almost exactly"]}
    page = certificate_html(cert)
    assert "1 leaking cell(s)" in page and "orders order_id=9 column &#x27;amount&#x27;" in page
    assert "warning: column orders.copy" in page and "digest abc123" in page
    assert certificate_html(None) == ""
    assert "no leak" in certificate_html({**cert, "passed": True, "leaks": [], "n_leaks": 0})


def test_predict_certifies_its_own_anchors(small_planted_store, tmp_path):
    """`predict(certify=...)` checks the predicted seeds (and anchors from a file) and carries the certificate in the
    table's metadata; a sampler that admits future rows fails it through the same function (`certify_task` with
    anchors), naming the row."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    from confluence.evaluation.predict import certificate_of, predict
    from confluence.training.loop import open_stream, train
    from tests.fixtures.model import tiny_run_config

    store = small_planted_store
    task = _temporal_tasks(store)[0]
    cfg = tiny_run_config(model={"d_t": 16}, sampler={"batch_size": 8, "seq_len": 96, "max_rows": 24, "labels": 4})
    with open_stream([store.path], cfg) as stream:
        train(cfg, stream, tmp_path / "run", progress=False)
    table = predict(tmp_path / "run", store.path, task, split="test", max_seeds=12, certify=8, draws=1)
    cert = certificate_of(table)
    assert cert["passed"] and cert["seeds"] > 0 and len(cert["digest"]) == 64
    arrays = store.task_arrays(task)
    info = store.table(store.task(task).anchor_table)
    keys = store.keys(info.name)
    rows = arrays.anchor_row[:6] - info.row_offset
    times = [str(np.datetime64(int(t), "us")) for t in arrays.obs_time[:6]]
    path = tmp_path / "anchors.csv"
    pacsv.write_csv(pa.table({"key": keys.take(pa.array(rows)), "observation_time": times}), path)
    table = predict(tmp_path / "run", store.path, task, anchors=path, certify=6, draws=1)
    assert certificate_of(table)["passed"]
    data = SamplerData.from_store(store)
    leaky = dataclasses.replace(data, row_time=np.full_like(np.asarray(data.row_time), STATIC_TIME),
                                child_time=np.full_like(np.asarray(data.child_time), STATIC_TIME))
    later = np.full(6, np.asarray(arrays.obs_time[:6]).min(), np.int64)  # earlier cut-offs: more rows after them
    cert = certify_task(store, CFG, task, np.arange(6), context="all", data=leaky,
                        anchors=(np.asarray(arrays.anchor_row[:6]), later))
    assert not cert.passed and any(x.what == FUTURE_CELL for x in cert.leaks)
