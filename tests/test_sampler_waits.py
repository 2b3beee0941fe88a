"""Waits (`confluence.sampler.waits`): a timestamp task with observation times carries, per sequence, its
observation time's epoch plus the task's median wait (`wait_ref`) and the waits' mean absolute deviation
(`wait_scale`), both from the train split only. Checked against numpy on the real pipeline's store, for the
leak rule (nothing of a validation or test answer, nor of the seed's own, reaches them) and for the tasks that
must have none (other types, a row's own timestamp cell)."""

import dataclasses

import numpy as np
import pytest

from confluence.model.inputs import TARGET_FIELDS, batch_to_inputs
from confluence.preprocess.pipeline import preprocess
from confluence.sampler.config import SamplerConfig
from confluence.sampler.sampler import Sampler
from confluence.sampler.waits import MIN_WAITS, wait_stats, with_waits
from confluence.store import Store
from tests.fixtures.bookstore import HashEncoder, bookstore_metadata, write_bookstore, write_metadata

NEXT = "next_order_at"
NEXT_TASK = {
    "query": "WITH obs AS (SELECT unnest(generate_series(TIMESTAMP '2024-02-01', TIMESTAMP '2024-10-01',"
             " INTERVAL 1 MONTH)) AS obs_time)"
             " SELECT c.customer_id, obs.obs_time, min(o.ordered_at) AS next_at"
             " FROM customers c CROSS JOIN obs LEFT JOIN orders o ON o.customer_id = c.customer_id"
             " AND o.ordered_at > obs.obs_time WHERE c.signed_up_at <= obs.obs_time GROUP BY ALL",
    "anchor_table": "customers", "anchor_key": "customer_id",
    "target_column": "next_at", "target_stype": "timestamp", "observation_time_column": "obs_time",
    "horizon": "0 seconds", "description": "when the customer orders next",
}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("waits")
    meta = bookstore_metadata()
    meta["tasks"][NEXT] = NEXT_TASK
    src = write_bookstore(d, "parquet", "small")
    return Store.open(preprocess(src, write_metadata(d, meta), d / "store", encoder=HashEncoder(16), progress=False))


def _sampler(store):
    return Sampler([store], SamplerConfig(batch_size=8, seq_len=64, max_rows=12))


def _known(task, ids):
    valid = np.unpackbits(task.tgt_valid, count=task.num_seeds, bitorder="little").astype(bool)
    return ids[valid[ids]]


def test_a_when_next_task_waits_are_its_train_splits_median_and_deviation(store):
    s = _sampler(store)
    task = s.entry(NEXT).task
    train = _known(task, s.seed_ids("train", NEXT))
    assert train.shape[0] >= MIN_WAITS
    waits = task.tgt_ts[train, -1].astype(np.float64) - task.obs_ts[train, -1].astype(np.float64)
    assert task.wait_median == pytest.approx(np.median(waits), rel=1e-9)
    assert task.wait_scale == pytest.approx(np.mean(np.abs(waits - np.median(waits))), rel=1e-9)
    assert task.wait_median > 0 and task.wait_scale > 0  # the next order comes after the observation time
    # in days, read back through the store's timestamp z-score: a plausible wait of this database's orders
    days = task.wait_median * store.timestamp_stats[1] / 86_400e6
    assert 0 < days < 300
    # the train seeds drawn for the waits are the ones `seed_ids` serves (one process: drawn once, kept)
    from confluence.sampler.splits import split_seed_ids, task_split

    fresh = split_seed_ids(NEXT, task.anchor_row, task.obs_time, task_split(store, NEXT, s.config.split), "train")
    np.testing.assert_array_equal(s.seed_ids("train", NEXT), fresh)
    assert s.seed_ids("train", NEXT) is s.seed_ids("train", NEXT)


def test_every_other_task_has_no_wait(store):
    s = _sampler(store)
    for e in s.entries:
        if e.task.name != NEXT:
            # a numerical task with observation times, a row's own timestamp cell ("order_time"), the rest
            assert (e.task.wait_median, e.task.wait_scale) == (0.0, 0.0), e.task.name
            batch = s.build(e.task.name, s.seed_ids("train", e.task.name)[:8]).batch
            assert not batch.wait_ref.any() and not batch.wait_scale.any()


def test_a_sequence_carries_its_observation_time_plus_the_median_wait(store):
    s = _sampler(store)
    task = s.entry(NEXT).task
    ids = s.seed_ids("test", NEXT)[:8]
    batch = s.build(NEXT, ids).batch
    want = (task.obs_ts[ids, -1].astype(np.float64) + task.wait_median).astype(np.float32)
    np.testing.assert_array_equal(batch.wait_ref, want)
    np.testing.assert_array_equal(batch.wait_scale, np.full(8, task.wait_scale, np.float32))
    inputs = batch_to_inputs(batch)
    np.testing.assert_array_equal(inputs["wait_ref"], want)


def test_no_answer_outside_the_train_split_reaches_the_waits(store):
    """Rewriting every validation and test answer (and their nullness) leaves the statistics and every input of
    a validation batch as they were; rewriting train answers moves them."""
    s = _sampler(store)
    task = s.entry(NEXT).task
    train = s.seed_ids("train", NEXT)
    rng = np.random.default_rng(0)
    other = np.setdiff1d(np.arange(task.num_seeds), train)
    assert other.shape[0] > 0
    ts = np.array(task.tgt_ts)
    ts[other, -1] += rng.normal(0, 1, other.shape[0]).astype(np.float32)
    valid = np.unpackbits(task.tgt_valid, count=task.num_seeds, bitorder="little")
    valid[other] = rng.integers(0, 2, other.shape[0])
    changed = dataclasses.replace(task, tgt_ts=ts, tgt_valid=np.packbits(valid, bitorder="little"))
    assert wait_stats(changed, train) == (task.wait_median, task.wait_scale)
    moved = np.array(task.tgt_ts)
    moved[train, -1] += 0.5
    assert wait_stats(dataclasses.replace(task, tgt_ts=moved), train)[0] != task.wait_median

    val = s.seed_ids("val", NEXT)[:8]
    before = batch_to_inputs(s.build(NEXT, val).batch)
    after = batch_to_inputs(s.build(with_waits(changed, train), val).batch)
    for k in before:
        if k not in TARGET_FIELDS:
            np.testing.assert_array_equal(before[k], after[k], err_msg=k)


def test_too_few_or_identical_waits_give_none(store):
    s = _sampler(store)
    task = s.entry(NEXT).task
    train = _known(task, s.seed_ids("train", NEXT))
    assert wait_stats(task, train[: MIN_WAITS - 1]) == (0.0, 0.0)
    same = np.array(task.tgt_ts)
    same[:, -1] = task.obs_ts[:, -1] + 0.01
    assert wait_stats(dataclasses.replace(task, tgt_ts=same), train) == (0.0, 0.0)


def test_sample_show_says_how_a_wait_is_answered(store):
    s = _sampler(store)
    task = s.entry(NEXT).task
    text = s.render(NEXT, int(s.seed_ids("val", NEXT)[0]))
    days = task.wait_median * store.timestamp_stats[1] / 86_400e6
    assert f"median wait ({days:.1f} days)" in text
    assert "median wait" not in s.render("orders_next_30d", int(s.seed_ids("val", "orders_next_30d")[0]))
