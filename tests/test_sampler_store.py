"""The sampler on real processed stores: the preprocessed bookstore, the CLI, and (slow) nycflights13."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from confluence.cli.main import app
from confluence.preprocess.pipeline import preprocess
from confluence.sampler.data import SamplerData
from confluence.sampler.sampler import Sampler
from confluence.store import Store
from confluence.stypes import SemanticType
from tests.fixtures.bookstore import HashEncoder, bookstore_files
from tests.fixtures.configs import seed_sampler


@pytest.fixture(scope="module")
def bookstore_path(tmp_path_factory):
    d = tmp_path_factory.mktemp("sampler_store")
    src, meta = bookstore_files(d)
    return preprocess(src, meta, d / "store", encoder=HashEncoder(16), progress=False)


def _bit(bits, i):
    return bool((bits[i >> 3] >> (i & 7)) & 1)


def test_every_task_of_the_preprocessed_bookstore(bookstore_path):
    store = Store.open(bookstore_path)
    data = SamplerData.from_store(store)
    s = Sampler([data], seed_sampler(batch_size=4, seq_len=48, max_rows=16, row_buckets=(16,), text_buckets=(8,)))
    for info in store.tasks:
        arrs = store.task_arrays(info.name)
        ids = np.arange(min(4, info.num_seeds))
        res = s.build(info.name, ids)
        b = res.batch
        b.validate()
        assert b.target_stype == int(info.target_stype) and b.task_idx == info.index
        for i, sid in enumerate(ids):
            assert b.is_target[i].sum() == 1 and b.column_ids[i, 0] == info.target_column_idx
            assert b.anchor_rows[i] == arrs.anchor_row[sid] and b.obs_times[i] == arrs.obs_time[sid]
            assert b.is_null[i, 0] == (not _bit(arrs.target_valid, int(sid)))
            if not b.is_null[i, 0]:
                if info.target_stype == SemanticType.NUMERICAL:
                    assert b.numeric_values[i, 0] == arrs.target_values[sid]
                elif info.target_stype == SemanticType.CATEGORICAL:
                    k = int(b.categorical_embed_ids[i, 0]) - b.cat_block_start
                    assert 0 <= k < b.cat_count and b.cat_count == info.cat_count
                elif info.target_stype == SemanticType.BOOLEAN:
                    assert b.bool_values[i, 0] == _bit(arrs.target_values, int(sid))
            # no context row after the observation time
            rows = res.rows[i, 1 : res.nrows[i]]
            assert (store.row_time[rows] <= b.obs_times[i]).all()
            # excluded columns are hidden on the anchor row
            anchor_cols = set(b.column_ids[i][(b.seq_row_ids[i] == 0) & ~b.is_padding[i]].tolist())
            assert not anchor_cols & set(info.exclude_column_idxs)
        text = (b.semantic_types == SemanticType.TEXT) & ~b.is_null & ~b.is_padding
        for i, p in zip(*np.nonzero(text), strict=True):
            row = int(res.rows[i, b.seq_row_ids[i, p]])
            col = store.columns[int(b.column_ids[i, p])]
            t = store.table(col.table)
            gid = int(store.values(t.name, col.name)[row - t.row_offset])
            assert np.array_equal(b.text_batch_embeddings[b.text_embed_ids[i, p]], store.text_embeddings[gid])


def test_order_status_excludes_rating_and_book(bookstore_path):
    store = Store.open(bookstore_path)
    info = store.task("order_status")
    assert info.exclude_column_idxs  # rating, book_id
    b = Sampler([store], seed_sampler(batch_size=2, seq_len=64, max_rows=16, row_buckets=(16,))).batch_for_seeds(
        "order_status", np.array([0, 1]))
    for i in range(2):
        anchor_cols = b.column_ids[i][(b.seq_row_ids[i] == 0) & ~b.is_padding[i]]
        for c in info.exclude_column_idxs:
            assert c not in anchor_cols


def test_cli_show(bookstore_path):
    r = CliRunner().invoke(app, ["sample", "show", "--db", str(bookstore_path), "--task", "order_rating",
                                 "--seed-index", "1", "--set", "sampler.seq_len=64"])
    assert r.exit_code == 0, r.output
    for needle in ("rows (", "cells (", "TARGET", "outbound mask", "inbound mask", "column mask", "orders"):
        assert needle in r.output
    r = CliRunner().invoke(app, ["sample", "show", "--db", str(bookstore_path), "--task", "nope"])
    assert r.exit_code == 1 and "no task 'nope'" in r.output and "order_rating" in r.output
    r = CliRunner().invoke(app, ["sample", "show", "--db", str(bookstore_path), "--task", "order_rating",
                                 "--config", "demo", "--set", "sampler.seq_len=64"])
    assert r.exit_code == 0, r.output  # the demo's contexts: its sampler settings
    r = CliRunner().invoke(app, ["sample", "show", "--db", str(bookstore_path), "--task", "order_rating",
                                 "--set", "sampler.recnt=2"])
    assert r.exit_code == 1 and "sampler.recnt" in r.output


def test_cli_show_speaks_the_data_and_the_run(bookstore_path, tmp_path):
    """Values as in the data (numbers de-normalized, categories by name), rows by primary key; with --checkpoint
    the run's own sampler settings and seed, not the defaults."""
    import json
    import re

    from confluence.training.loop import prepare_run_dir
    from tests.fixtures.model import tiny_run_config

    store = Store.open(bookstore_path)
    base = ["sample", "show", "--db", str(bookstore_path), "--task", "order_rating", "--seed-index", "0"]
    r = CliRunner().invoke(app, [*base, "--set", "sampler.seq_len=64"])
    assert r.exit_code == 0, r.output
    anchor = int(store.task_arrays("order_rating").anchor_row[0]) - store.table("orders").row_offset
    key = store.keys("orders")[anchor].as_py()
    assert f"anchor orders {store.table('orders').primary_key}={key!r}" in r.output
    assert "row " not in r.output.split("cells (")[0].split("rows (")[1]  # rows named by their keys
    prices = re.findall(r"books\.price\s+numerical\s+([-0-9.]+) \(z=", r.output)
    assert prices and set(prices) <= {"10", "20", "30"}, r.output  # the fixture's prices, z-score beside
    raw = CliRunner().invoke(app, [*base, "--set", "sampler.seq_len=64", "--raw"])
    assert raw.exit_code == 0 and "z=" in raw.output and "(z=" not in raw.output
    # a run's settings: a checkpoint whose sampler used S = 48 and width 4
    run = tmp_path / "run"
    cfg = tiny_run_config(sampler={"seq_len": 48, "max_rows": 16, "row_buckets": [16], "text_buckets": [64],
                                   "width": 4}, seed=3)
    prepare_run_dir(run, resume=False, force=False)
    ck = run / "checkpoints" / "step_00000001"
    ck.mkdir(parents=True)
    (ck / "meta.json").write_text(json.dumps({"step": 1, "config": cfg.to_dict()}))
    (ck / "state.eqx").write_bytes(b"")  # only the settings are read
    (run / "checkpoints" / "LATEST").write_text("step_00000001")
    r = CliRunner().invoke(app, [*base, "--checkpoint", str(run)])
    assert r.exit_code == 0, r.output
    assert "= S 48;" in r.output  # the run's sequence length, not the default recipe's 128
    both = CliRunner().invoke(app, [*base, "--checkpoint", str(run), "--config", "demo"])
    assert both.exit_code == 1 and "not both" in both.output


@pytest.mark.slow
def test_nycflights13_demo_store(tmp_path):
    from confluence.demo import build_nycflights13, demo_metadata_path
    from confluence.textenc.default import StaticEncoder

    raw = build_nycflights13(tmp_path / "nycflights13")
    path = preprocess(raw, demo_metadata_path(), tmp_path / "store", encoder=StaticEncoder(), progress=False)
    store = Store.open(path)
    s = Sampler([store], seed_sampler(batch_size=8, seq_len=1024, threads=2))
    rng = np.random.default_rng(0)
    for e in s.entries:
        ids = rng.integers(0, e.task.num_seeds, 8)
        res = s.build(e.task.name, ids)
        b = res.batch
        b.validate()
        for i in range(8):
            rows = res.rows[i, 1 : res.nrows[i]]
            assert (store.row_time[rows] <= b.obs_times[i]).all()
            n = int(res.n_real[i])
            for perm in (b.col_perm[i], b.out_perm[i], b.in_perm[i]):
                assert np.array_equal(np.sort(perm), np.arange(b.seq_len)) and (perm[n:] >= n).all()
    s.close()


def test_observation_time_cell(bookstore_path):
    """A task with an observation_time_column shows that time as a timestamp cell of the anchor row (position 1);
    a task whose time is the anchor's own timestamp (or none) has no such cell."""
    from confluence.preprocess.encode import encode_timestamp

    store = Store.open(bookstore_path)
    ts = store.meta["timestamp_stats"]
    s = Sampler([store], seed_sampler(batch_size=4, seq_len=64, max_rows=16, row_buckets=(16,)))
    info = store.task("orders_next_30d")
    assert info.obs_column_idx >= 0
    col = store.columns[info.obs_column_idx]
    assert (col.task, col.name, col.stype) == ("orders_next_30d", "observation time", SemanticType.TIMESTAMP)
    arrs = store.task_arrays("orders_next_30d")
    b = s.batch_for_seeds("orders_next_30d", np.arange(4))
    want = encode_timestamp(arrs.obs_time[:4], ts["mean"], ts["std"])
    for i in range(4):
        assert b.column_ids[i, 1] == info.obs_column_idx and b.semantic_types[i, 1] == SemanticType.TIMESTAMP
        assert b.seq_row_ids[i, 1] == 0 and not b.is_null[i, 1] and not b.is_target[i, 1]
        np.testing.assert_array_equal(b.timestamp_values[i, 1], want[i])
        assert (b.column_ids[i] == info.obs_column_idx).sum() == 1
    for name in ("order_rating", "book_expensive"):
        other = store.task(name)
        assert other.obs_column_idx == -1
        ob = s.batch_for_seeds(name, np.arange(min(4, other.num_seeds)))
        assert not np.isin(ob.column_ids, [info.obs_column_idx]).any()


def test_cli_show_prints_numbers_as_the_data_holds_them(tmp_path):
    """A 0 of the data prints 0, not the float32 z-score's round trip (-1.5e-07); the other prices as written."""
    import re

    import pyarrow as pa

    from tests.fixtures.bookstore import bookstore_tables, write_bookstore, write_metadata

    tables = bookstore_tables("tiny")
    books = tables["books"]
    tables["books"] = books.set_column(books.schema.get_field_index("price"), "price", pa.array([0.0, 12.5, 7.3]))
    store = preprocess(write_bookstore(tmp_path, tables=tables), write_metadata(tmp_path), tmp_path / "store",
                       encoder=HashEncoder(16), progress=False)
    printed: set[str] = set()
    for seed in range(len(Store.open(store).task_arrays("order_rating").anchor_row)):
        r = CliRunner().invoke(app, ["sample", "show", "--db", str(store), "--task", "order_rating",
                                     "--seed-index", str(seed), "--set", "sampler.seq_len=64"])
        assert r.exit_code == 0, r.output
        printed |= set(re.findall(r"books\.price\s+numerical\s+(\S+) \(z=", r.output))
    assert "0" in printed and printed <= {"0", "12.5", "7.3"}, printed
