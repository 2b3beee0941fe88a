"""Batch tensors: permutations, text dedup, R/U buckets, determinism across runs and thread counts."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from confluence.errors import ConfluenceError
from confluence.sampler.config import SamplerConfig, SplitConfig, bucket_size
from confluence.sampler.sampler import Sampler
from confluence.stypes import SemanticType
from tests.conftest_sampler import bookstore, random_store

CFG = SamplerConfig(batch_size=8, seq_len=96, width=3, max_rows=32, row_buckets=(8, 16, 32), text_buckets=(8, 32))


def _check_perm(perm, n_real, s_len):
    assert sorted(perm.tolist()) == list(range(s_len))
    assert (perm[n_real:] >= n_real).all()  # padding last
    assert (perm[:n_real] < n_real).all()


def _contiguous(keys):
    """True when equal keys form one run each."""
    seen, prev = set(), None
    for k in keys.tolist():
        if k != prev:
            if k in seen:
                return False
            seen.add(k)
            prev = k
    return True


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_permutations(seed):
    store = random_store(seed, n_tables=5, max_rows=60)
    s = Sampler([store], CFG)
    for e in s.entries:
        res = s.build(e.task.name, np.arange(min(8, e.task.num_seeds)))
        b = res.batch
        for i in range(b.batch_size):
            n = int(res.n_real[i])
            for perm in (b.col_perm[i], b.out_perm[i], b.in_perm[i]):
                _check_perm(perm, n, b.seq_len)
            cols = b.column_ids[i][b.col_perm[i][:n]]
            assert (np.diff(cols) >= 0).all()  # grouped, ascending
            for perm in (b.out_perm[i], b.in_perm[i]):
                assert _contiguous(b.seq_row_ids[i][perm[:n]])


def test_bookstore_outbound_order_matches_seed_example():
    # Cuthill-McKee from the row with the fewest parents: book 42 (r2) or customer 23 (r1) first, then the
    # orders that point at it; the dense 6x6 band holds every edge.
    res = Sampler([bookstore()], CFG).build("rating", np.array([0]))
    b = res.batch
    n = int(res.n_real[0])
    rows_out = [int(r) for r in dict.fromkeys(b.seq_row_ids[0][b.out_perm[0][:n]].tolist())]
    rank = {r: k for k, r in enumerate(rows_out)}
    adj = b.fk_adj[0]
    band = max(abs(rank[i] - rank[j]) for i, j in zip(*np.nonzero(adj), strict=True))
    ident_band = max(abs(i - j) for i, j in zip(*np.nonzero(adj), strict=True))
    assert band <= ident_band
    assert b.fk_adj[0][rows_out[1], rows_out[0]]  # the second row points at the first


def test_text_dedup_round_trip():
    store = random_store(7, n_tables=4, max_rows=50)
    s = Sampler([store], CFG)
    text_cols = {c.column_idx: (c.table, c.name) for c in store.columns if c.stype == SemanticType.TEXT}
    for e in s.entries:
        res = s.build(e.task.name, np.arange(min(8, e.task.num_seeds)))
        b = res.batch
        u_used = 0
        for i in range(b.batch_size):
            for p in range(int(res.n_real[i])):
                if b.semantic_types[i, p] != SemanticType.TEXT or b.is_null[i, p]:
                    continue
                row = int(res.rows[i, b.seq_row_ids[i, p]])
                t, c = text_cols[int(b.column_ids[i, p])]
                local = row - store.offsets[t]
                gid = int(store.values(t, c)[local])
                assert np.array_equal(b.text_batch_embeddings[b.text_embed_ids[i, p]], store.text_embeddings[gid])
                u_used = max(u_used, int(b.text_embed_ids[i, p]) + 1)
        assert b.text_batch_embeddings.shape[0] in (8, 32) or b.text_batch_embeddings.shape[0] % 32 == 0
        # local ids are dense: every row below U_used is referenced
        ids = b.text_embed_ids[(b.semantic_types == SemanticType.TEXT) & ~b.is_null & ~b.is_padding]
        assert set(ids.tolist()) == set(range(u_used))


def test_row_bucket_and_cap():
    store = bookstore(extra_orders=40)
    cfg = SamplerConfig(batch_size=2, seq_len=2048, width=50, max_rows=20, row_buckets=(8, 16, 32))
    res = Sampler([store], cfg).build("country", np.array([0]))
    assert res.nrows.max() == 20  # capped
    assert res.batch.fk_adj.shape == (2, 20, 20)  # bucket 32 is above the cap, so R = the cap
    assert bucket_size(3, (8, 16)) == 8 and bucket_size(17, (8, 16)) == 32 and bucket_size(0, (4,)) == 4


def _arrays(batch):
    return {k: v.copy() for k, v in batch.arrays().items()}


def test_determinism_across_runs_and_threads():
    store = random_store(11, n_tables=5, max_rows=80)
    out = []
    for threads in (1, 2, 3):
        cfg = SamplerConfig(batch_size=8, seq_len=64, width=2, max_rows=32, row_buckets=(8, 32), threads=threads,
                            seed=5, batches_per_epoch=3)
        with Sampler([store], cfg) as s:
            out.append([_arrays(b) for b in s.batches("train", epoch=1)])
    for other in out[1:]:
        for a, b in zip(out[0], other, strict=True):
            for k in a:
                np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    # another epoch or sampling seed changes the batches
    cfg = SamplerConfig(batch_size=8, seq_len=64, width=2, max_rows=32, row_buckets=(8, 32), seed=5, batches_per_epoch=3)
    other_epoch = [_arrays(b) for b in Sampler([store], cfg).batches("train", epoch=2)]
    assert any(not np.array_equal(a["seed_ids"], b["seed_ids"]) for a, b in zip(out[0], other_epoch, strict=True))


def test_batch_for_seeds_partial_and_errors():
    store = random_store(3)
    s = Sampler([store], CFG)
    e = s.entries[0]
    b = s.batch_for_seeds(e.task.name, np.array([0]))
    assert b.seq_valid.tolist() == [True] + [False] * 7
    assert (b.seed_ids == 0).all()
    with pytest.raises(ConfluenceError, match="out of range"):
        s.batch_for_seeds(e.task.name, np.array([10**6]))
    with pytest.raises(ConfluenceError, match="not served"):
        s.batch_for_seeds("nope", np.array([0]))
    with pytest.raises(ConfluenceError, match="seq_len"):
        SamplerConfig(seq_len=1).check()


def test_several_databases_and_weights():
    s1, s2 = random_store(1), random_store(2)
    cfg = SamplerConfig(batch_size=4, seq_len=32, max_rows=16, row_buckets=(16,), batches_per_epoch=40,
                        task_weights={"random1/x_t0": 1.0}, tasks=("random1/x_t0", "random2/x_t1"))
    # weight only for one task: the other falls back to its seed count
    s = Sampler([s1, s2], cfg)
    dbs = [b.db_idx for b in s.batches("train", 0)]
    assert set(dbs) <= {0, 1} and len(dbs) == 40
    cfg0 = SamplerConfig(batch_size=4, seq_len=32, max_rows=16, row_buckets=(16,), batches_per_epoch=20,
                         task_weights={"x_t0": 1.0, "x_t1": 0.0}, tasks=("random1/x_t0", "random2/x_t1"))
    assert {b.db_idx for b in Sampler([s1, s2], cfg0).batches("train", 0)} == {0}


def test_render_text():
    s = Sampler([bookstore()], CFG)
    text = s.render("rating", 0)
    assert "TARGET" in text and "outbound mask" in text and "inbound mask" in text and "column mask" in text
    assert "r1 <- {" in text and "customers" in text and "orders.rating" in text
    import confluence.sampler as pkg

    assert pkg.Sampler is Sampler


def test_parallel_text_gather_matches_serial(monkeypatch):
    import confluence.sampler.builder as builder

    store = random_store(21, n_tables=4, max_rows=60)
    base = dict(batch_size=8, seq_len=128, width=3, max_rows=32, row_buckets=(32,), text_buckets=(8,))
    serial = Sampler([store], SamplerConfig(**base, threads=1))
    monkeypatch.setattr(builder, "_PARALLEL_GATHER_MIN", 1)
    with Sampler([store], SamplerConfig(**base, threads=2)) as par:
        for e in serial.entries:
            ids = np.arange(min(8, e.task.num_seeds))
            a, b = serial.batch_for_seeds(e.task.name, ids), par.batch_for_seeds(e.task.name, ids)
            np.testing.assert_array_equal(a.text_batch_embeddings, b.text_batch_embeddings)
            np.testing.assert_array_equal(a.text_embed_ids, b.text_embed_ids)


def test_kernels_release_the_gil_and_are_cached():
    from confluence.sampler import linearize, perms, textgather, walk

    kernels = [walk.walk_chunk, walk.anchor_cells_chunk, linearize.linearize_chunk, linearize.fill_adjacency,
               perms.perms_chunk, textgather.dedup_text, textgather.gather_rows]
    for k in kernels:
        assert k.targetoptions.get("nogil") is True, k.py_func.__name__
        assert type(k._cache).__name__ == "FunctionCache", k.py_func.__name__  # cache=True: compiled once


STREAM = dict(batch_size=8, seq_len=64, width=2, max_rows=32, row_buckets=(8, 32), text_buckets=(8, 32), seed=7,
              batches_per_epoch=9, split=SplitConfig(fractions=(0.6, 0.3, 0.1)))


def _stream(stores, threads, split, epoch=1):
    with Sampler(stores, SamplerConfig(**STREAM, threads=threads)) as s:
        got = [_arrays(b) for b in s.batches(split, epoch)]
        assert s.cpu_timings["walk"] > 0 and s.timings["linearize"] > 0  # accumulated as batches are yielded
    return got


def test_stream_identical_across_thread_counts():
    """Whole batches built concurrently (threads > 1) come out in order and bit-identical to one thread."""
    stores = [random_store(12, n_tables=5, max_rows=80), random_store(13, n_tables=4, max_rows=60)]
    for split in ("train", "val"):
        ref = _stream(stores, 1, split)
        assert len(ref) > 2 * 3  # longer than the lookahead of 3 threads
        for threads in (2, 3):
            got = _stream(stores, threads, split)
            assert len(got) == len(ref)
            for a, b in zip(ref, got, strict=True):
                for k in a:
                    np.testing.assert_array_equal(a[k], b[k], err_msg=f"{split} threads={threads} {k}")


def test_stream_build_error_reaches_consumer_in_order(monkeypatch):
    import confluence.sampler.builder as builder

    store = random_store(14, n_tables=4, max_rows=60)
    cfg = SamplerConfig(**STREAM, threads=2)
    ref = [b.seed_ids.copy() for b in Sampler([store], SamplerConfig(**STREAM)).batches("train", 0)]
    bad_ids = ref[3]
    real_build = builder.BatchBuilder.build
    calls = []

    def build(self, task, seed_ids, epoch=0, n_valid=None, serial=False):
        calls.append(serial)
        if np.array_equal(np.resize(np.asarray(seed_ids), bad_ids.shape), bad_ids):
            raise ValueError("boom in a build")
        return real_build(self, task, seed_ids, epoch, n_valid, serial)

    monkeypatch.setattr(builder.BatchBuilder, "build", build)
    with Sampler([store], cfg) as s:
        stream = s.batches("train", 0)
        got = [next(stream).seed_ids.copy() for _ in range(3)]
        with pytest.raises(ValueError, match="boom in a build"):
            next(stream)
        assert all(np.array_equal(a, b) for a, b in zip(ref, got, strict=False))
        assert all(calls)  # every build of the stream ran serially inside one worker
        with s.prefetch("train", 0) as p:
            for _ in range(3):
                next(p)
            with pytest.raises(ValueError, match="boom in a build"):
                next(p)


def test_stream_abandon_and_close_do_not_hang():
    store = random_store(15, n_tables=4, max_rows=60)
    cfg = SamplerConfig(**{**STREAM, "batches_per_epoch": 10**6}, threads=2)
    ref = list(zip(range(8), Sampler([store], SamplerConfig(**{**STREAM, "batches_per_epoch": 10**6})).batches("train", 0), strict=False))
    s = Sampler([store], cfg)
    t0 = time.perf_counter()
    for _ in range(3):  # abandoned after a few batches: its pending builds are cancelled
        stream = s.batches("train", 0)
        next(stream)
        del stream
    with s.prefetch("train", 0) as p:
        next(p)
    stream = s.batches("train", 0)
    got = [next(stream) for _ in range(4)]
    s.close()  # a stream still open when the sampler closes goes on, building in the consumer
    got += [next(stream) for _ in range(4)]
    stream.close()
    assert time.perf_counter() - t0 < 30
    for (_, a), b in zip(ref, got, strict=True):
        np.testing.assert_array_equal(a.seed_ids, b.seed_ids)
        np.testing.assert_array_equal(a.column_ids, b.column_ids)
    assert threading.active_count() < 20
