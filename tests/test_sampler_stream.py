"""The batch stream: training batches (task choice, per-epoch seed shuffles, resumable position) and ordered
passes, the same whatever the worker threads and the prefetch depth; errors reach the consumer in order; abandoning
or closing never hangs."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from confluence.errors import ConfluenceError
from confluence.sampler import BatchStream, Sampler, SplitConfig
from tests.fixtures.configs import seed_sampler
from tests.fixtures.graphs import DAY, random_store

STREAM = seed_sampler(batch_size=8, seq_len=64, width=2, max_rows=32, row_buckets=(8, 32), text_buckets=(8, 32),
                       split=SplitConfig(fractions=(0.6, 0.3, 0.1)))


def _arrays(batch):
    return {k: v.copy() for k, v in batch.arrays().items()}


def _open(stores, seed=7, **changes):
    return BatchStream(Sampler(stores, replace(STREAM, **changes), seed=seed))


def _train(stores, n, **changes):
    with _open(stores, **changes) as s:
        got = [_arrays(s.next_train()) for _ in range(n)]
        assert s.sampler.cpu_timings["walk"] > 0 and s.sampler.timings["linearize"] > 0
    return got


def _passes(stores, **changes):
    with _open(stores, **changes) as s:
        return [_arrays(b) for e in s.tasks for b in s.split("val", e.task.name, e.db_idx)]


def test_identical_across_threads_and_prefetch():
    """Whole batches built concurrently (threads > 1) and ahead of the consumer (prefetch) come out in order and
    bit-identical to building each when asked."""
    stores = [random_store(12, n_tables=5, max_rows=80), random_store(13, n_tables=4, max_rows=60)]
    ref_train, ref_val = _train(stores, 12, prefetch=0), _passes(stores, prefetch=0)
    assert len(ref_val) > 2 * 3  # longer than the lookahead of 3 threads
    for threads, prefetch in ((1, 2), (2, 0), (3, 4)):
        for ref, got in ((ref_train, _train(stores, 12, threads=threads, prefetch=prefetch)),
                         (ref_val, _passes(stores, threads=threads, prefetch=prefetch))):
            assert len(got) == len(ref)
            for a, b in zip(ref, got, strict=True):
                for k in a:
                    np.testing.assert_array_equal(a[k], b[k], err_msg=f"threads={threads} prefetch={prefetch} {k}")


def test_each_task_walks_its_shuffled_seeds_epoch_after_epoch():
    store = random_store(11, n_tables=5, max_rows=80)
    task = max(store.tasks, key=lambda t: t.num_seeds).name
    with _open([store], tasks=(task,), prefetch=0) as s:
        e = s.tasks[0]
        ids = s.train_seed_ids(e)
        assert len(ids) >= 16
        per_epoch = max(len(ids) // 8, 1)
        epochs = [[s.next_train() for _ in range(per_epoch)] for _ in range(2)]
        pos = s.position()["streams"][e.key]
    assert pos == {"epoch": 2, "batch": 0}
    first = np.concatenate([b.seed_ids for b in epochs[0]])
    assert len(set(first.tolist())) == len(first)  # no seed twice within an epoch
    assert set(first.tolist()) <= set(ids.tolist())
    # another epoch: another shuffle (and another walk seed)
    assert not np.array_equal(first, np.concatenate([b.seed_ids for b in epochs[1]]))
    # another sampling seed: other batches
    with _open([store], seed=8, tasks=(task,)) as other:
        assert not np.array_equal(other.next_train().seed_ids, epochs[0][0].seed_ids)


def test_database_first_choice_over_several_databases():
    s1, s2 = random_store(1), random_store(2, max_rows=80)
    with Sampler([s2], STREAM) as probe:
        second = [f"random2/{e.task.name}" for e in probe.entries if probe.seed_ids("train", e.task.name).size][:3]
    assert len(second) == 3
    tasks = ("random1/x_t0", *second)
    with _open([s1, s2], tasks=tasks, task_choice="database_first", prefetch=0) as s:
        probs = s.task_probabilities()
        assert probs["random1/x_t0"] == pytest.approx(0.5) and probs[second[1]] == pytest.approx(0.5 / 3)
        dbs = Counter(s.next_train().db_idx for _ in range(200))
    assert 0.4 < dbs[0] / 200 < 0.6  # half the batches from each database although 1 task vs 3
    with _open([s1, s2], tasks=tasks, prefetch=0) as s:
        assert s.task_probabilities()["random1/x_t0"] == pytest.approx(0.25)


def test_ordered_passes_cover_a_split_in_order_with_padding():
    store = random_store(5, n_tables=3, max_rows=40)
    with _open([store], batch_size=4, split=SplitConfig(fractions=(0.5, 0.3, 0.2))) as s:
        for e in s.tasks:
            want = s.sampler.seed_ids("val", e.task.name).tolist()
            batches = list(s.split("val", e.task.name))
            got = [i for b in batches for i in b.seed_ids[b.seq_valid].tolist()]
            assert got == want
            assert all(b.seq_valid.all() for b in batches[:-1])
            assert sum(1 for _ in s.split("val", e.task.name, max_batches=1)) == min(1, len(batches))


def test_capped_validation_passes_draw_across_the_split():
    """Regression: `split(max_batches=k)` (the training loop's validation loss) took the split's first k batches,
    the oldest seeds of a hash split, whose contexts have no history (flights.carrier at 24,000 steps: loss 1.88
    on them, 0.0001 across the split). Now a fixed draw over the whole split, in ascending order, the same every
    time."""
    store = random_store(5, n_tables=3, max_rows=200)
    with _open([store], batch_size=4, split=SplitConfig(fractions=(0.2, 0.6, 0.2))) as s:
        checked = 0
        for e in s.tasks:
            ids = s.sampler.seed_ids("val", e.task.name)
            if len(ids) < 40:
                continue
            got = [i for b in s.split("val", e.task.name, max_batches=2) for i in b.seed_ids[b.seq_valid].tolist()]
            again = [i for b in s.split("val", e.task.name, max_batches=2) for i in b.seed_ids[b.seq_valid].tolist()]
            assert got == again == sorted(got) and len(got) == 8 and set(got) <= set(ids.tolist())
            assert got != ids[:8].tolist()  # not the oldest seeds
            assert got[-1] > ids[len(ids) // 2]  # reaches the split's second half
            checked += 1
    assert checked


def test_anchor_tasks_are_ordered_passes_too():
    store = random_store(3)
    with _open([store], prefetch=1) as s:
        e = s.tasks[0]
        rows, obs = e.task.anchor_row[:5], e.task.obs_time[:5]
        custom = s.sampler.anchor_task(e.task.name, rows, obs)
        (b,) = list(s.ordered(custom, np.arange(5)))
        np.testing.assert_array_equal(b.anchor_rows[:5], rows)
        assert b.is_null[b.is_target].all()  # the target of an anchor is unknown
        with pytest.raises(ConfluenceError, match="differ"):
            s.sampler.anchor_task(e.task.name, rows, obs[:3])


def test_no_training_seeds_is_named_unless_the_task_is_weighted_out():
    """Under a temporal split the tasks of static tables (no cut-off: test) have no training seeds: an error that
    names them, unless their weight is 0."""
    store = random_store(4)
    temporal = SplitConfig(mode="temporal", t_val=50 * DAY, t_test=80 * DAY)
    with _open([store], split=temporal) as s:
        empty = [e.task.name for e in s.tasks if s.train_seed_ids(e).size == 0]
        full = [e.task.name for e in s.tasks if s.train_seed_ids(e).size > 0]
        assert empty and full
        with pytest.raises(ConfluenceError, match=f"{empty[0]}.*no training seeds.*the weight 0"):
            s.next_train()
    with _open([store], split=temporal, task_weights=dict.fromkeys(empty, 0.0), prefetch=0) as s:
        drawn = {s.sampler.data[0].tasks[s.next_train().task_idx].name for _ in range(30)}
    assert drawn <= set(full) and drawn


def test_a_build_error_reaches_the_consumer_in_order(monkeypatch):
    import confluence.sampler.builder as builder

    store = random_store(14, n_tables=4, max_rows=60)
    ref = [b["seed_ids"] for b in _train([store], 6, prefetch=0)]
    bad_ids = ref[3]
    real_build = builder.BatchBuilder.build
    calls = []

    def build(self, task, seed_ids, epoch=0, n_valid=None, serial=False):
        calls.append(serial)
        if np.array_equal(np.resize(np.asarray(seed_ids), bad_ids.shape), bad_ids):
            raise ValueError("boom in a build")
        return real_build(self, task, seed_ids, epoch, n_valid, serial)

    monkeypatch.setattr(builder.BatchBuilder, "build", build)
    for threads, prefetch in ((2, 0), (2, 2), (1, 2)):
        with _open([store], threads=threads, prefetch=prefetch) as s:
            got = [s.next_train().seed_ids.copy() for _ in range(3)]
            with pytest.raises(ValueError, match="boom in a build"):
                s.next_train()
        assert all(np.array_equal(a, b) for a, b in zip(ref, got, strict=False))
    assert all(calls[:3]) and calls  # with threads, every build of the stream ran serially in one worker


def test_abandon_restore_and_close_do_not_hang():
    store = random_store(15, n_tables=4, max_rows=60)
    ref = [b["seed_ids"] for b in _train([store], 8, prefetch=0)]
    t0 = time.perf_counter()
    s = _open([store], threads=2, prefetch=3)
    for _ in range(3):  # abandoned passes: their pending builds are cancelled, their producers stop
        p = s.ordered(s.tasks[0].task.name, np.arange(s.tasks[0].task.num_seeds))
        next(p)
        del p
    got = [s.next_train().seed_ids.copy() for _ in range(4)]
    pos = s.position()
    s.next_train()
    s.restore(pos)  # the producer ran ahead: restoring drops what it built
    s.close()  # the pool is gone; the stream goes on, building in the consumer
    got += [s.next_train().seed_ids.copy() for _ in range(4)]
    s.close()
    assert time.perf_counter() - t0 < 30
    for a, b in zip(ref, got, strict=True):
        np.testing.assert_array_equal(a, b)
    assert threading.active_count() < 20
