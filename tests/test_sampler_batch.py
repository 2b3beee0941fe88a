"""Batch tensors: permutations, text dedup, R/U buckets, determinism across runs and thread counts."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from confluence.errors import ConfluenceError
from confluence.sampler.config import bucket_size
from confluence.sampler.sampler import Sampler
from confluence.stypes import SemanticType
from tests.fixtures.configs import seed_sampler
from tests.fixtures.graphs import local_row, random_store, walk_example

CFG = seed_sampler(batch_size=8, seq_len=96, width=3, max_rows=32, row_buckets=(8, 16, 32), text_buckets=(8, 32))


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
            assert _contiguous(cols)  # grouped (ascending ids unless packing the groups visits fewer tiles)
            for perm in (b.out_perm[i], b.in_perm[i]):
                assert _contiguous(b.seq_row_ids[i][perm[:n]])


def _visited_tiles(b, i, kind, tile):
    """Tiles of the kind's dense mask (padding excluded) holding a visible pair, positions in the kind's order."""
    perm = {"outbound": b.out_perm, "inbound": b.in_perm, "column": b.col_perm}[kind][i].astype(np.int64)
    rows, pad = b.seq_row_ids[i][perm].astype(np.int64), b.is_padding[i][perm]
    if kind == "column":
        cols = b.column_ids[i][perm].astype(np.int64)
        mask = (cols[:, None] == cols[None, :]) & ~pad[:, None] & ~pad[None, :]
    else:
        adj = b.fk_adj[i].astype(bool)
        m = adj | np.eye(len(adj), dtype=bool) if kind == "outbound" else adj.T
        r = np.where(pad, 0, rows)
        mask = m[r][:, r] & ~pad[:, None] & ~pad[None, :]
    nt = -(-b.seq_len // tile)
    mask = np.pad(mask, (0, nt * tile - b.seq_len))
    return int(mask.reshape(nt, tile, nt, tile).any(axis=(1, 3)).sum())


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_tile_aware_row_orders_never_visit_more_tiles(seed):
    """`perm_tile` picks, per sequence and kind, the order visiting the fewest tiles: never more than seed 000's
    orders (`perm_tile = 0`: Cuthill-McKee rows, ascending column ids), fewer somewhere; rows and columns stay
    contiguous, padding last, and every other field of the batch is unchanged."""
    store = random_store(seed, n_tables=6, max_rows=80)
    seed_cfg = dataclasses.replace(CFG, perm_tile=0)
    fewer = {"outbound": 0, "inbound": 0, "column": 0}
    for e in Sampler([store], CFG).entries:
        ids = np.arange(min(8, e.task.num_seeds))
        old = Sampler([store], seed_cfg).build(e.task.name, ids)
        new = Sampler([store], dataclasses.replace(CFG, perm_tile=16)).build(e.task.name, ids)
        for name in ("seq_row_ids", "column_ids", "is_padding", "fk_adj", "numeric_values"):
            np.testing.assert_array_equal(getattr(old.batch, name), getattr(new.batch, name))
        for i in range(new.batch.batch_size):
            n = int(new.n_real[i])
            for kind, perms, key in (("outbound", new.batch.out_perm, new.batch.seq_row_ids),
                                     ("inbound", new.batch.in_perm, new.batch.seq_row_ids),
                                     ("column", new.batch.col_perm, new.batch.column_ids)):
                _check_perm(perms[i], n, new.batch.seq_len)
                assert _contiguous(key[i][perms[i][:n]])
                a, c = _visited_tiles(old.batch, i, kind, 16), _visited_tiles(new.batch, i, kind, 16)
                assert c <= a, (e.task.name, i, kind)
                fewer[kind] += c < a
    assert fewer["outbound"] > 0 and fewer["column"] > 0, fewer


def test_perm_tile_must_be_zero_or_a_power_of_two():
    for bad in (8, 48, -64, True):
        with pytest.raises(ConfluenceError, match="perm_tile"):
            dataclasses.replace(CFG, perm_tile=bad)


def test_walk_example_outbound_order_matches_the_seed():
    # Cuthill-McKee from the row with the fewest parents: book 42 (r2) or customer 23 (r1) first, then the
    # orders that point at it; the dense 6x6 band holds every edge.
    store = walk_example()
    first = int(np.flatnonzero(np.asarray(store.task_arrays("rating").anchor_row) == local_row(store, "orders", 1))[0])
    res = Sampler([store], dataclasses.replace(CFG, perm_tile=0)).build("rating", np.array([first]))
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
                local = row - store.table(t).row_offset
                gid = int(store.values(t, c)[local])
                assert np.array_equal(b.text_batch_embeddings[b.text_embed_ids[i, p]], store.text_embeddings[gid])
                u_used = max(u_used, int(b.text_embed_ids[i, p]) + 1)
        assert b.text_batch_embeddings.shape[0] in (8, 32) or b.text_batch_embeddings.shape[0] % 32 == 0
        # local ids are dense: every row below U_used is referenced
        ids = b.text_embed_ids[(b.semantic_types == SemanticType.TEXT) & ~b.is_null & ~b.is_padding]
        assert set(ids.tolist()) == set(range(u_used))


def test_row_bucket_and_cap():
    store = walk_example(extra_orders=40)
    cfg = seed_sampler(batch_size=2, seq_len=2048, width=50, max_rows=20, row_buckets=(8, 16, 32))
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
        cfg = seed_sampler(batch_size=8, seq_len=64, width=2, max_rows=32, row_buckets=(8, 32), threads=threads)
        with Sampler([store], cfg, seed=5) as s:
            out.append([_arrays(s.batch_for_seeds(e.task.name, np.arange(min(8, e.task.num_seeds)), epoch=1))
                        for e in s.entries])
    for other in out[1:]:
        for a, b in zip(out[0], other, strict=True):
            for k in a:
                np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    # another epoch or sampling seed changes the walks
    cfg = seed_sampler(batch_size=8, seq_len=64, width=2, max_rows=32, row_buckets=(8, 32))
    for seed, epoch in ((5, 2), (6, 1)):
        s = Sampler([store], cfg, seed=seed)
        other = [_arrays(s.batch_for_seeds(e.task.name, np.arange(min(8, e.task.num_seeds)), epoch=epoch))
                 for e in s.entries]
        assert any(not np.array_equal(a["column_ids"], b["column_ids"]) for a, b in zip(out[0], other, strict=True))


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
        seed_sampler(seq_len=1)


def test_render_text():
    s = Sampler([walk_example()], CFG)
    text = s.render("rating", 0)
    assert "TARGET" in text and "outbound mask" in text and "inbound mask" in text and "column mask" in text
    assert "r1 <- {" in text and "customers" in text and "orders.rating" in text
    import confluence.sampler as pkg

    assert pkg.Sampler is Sampler


def test_parallel_text_gather_matches_serial(monkeypatch):
    import confluence.sampler.builder as builder

    store = random_store(21, n_tables=4, max_rows=60)
    base = dict(batch_size=8, seq_len=128, width=3, max_rows=32, row_buckets=(32,), text_buckets=(8,))
    serial = Sampler([store], seed_sampler(**base, threads=1))
    monkeypatch.setattr(builder, "_PARALLEL_GATHER_MIN", 1)
    with Sampler([store], seed_sampler(**base, threads=2)) as par:
        for e in serial.entries:
            ids = np.arange(min(8, e.task.num_seeds))
            a, b = serial.batch_for_seeds(e.task.name, ids), par.batch_for_seeds(e.task.name, ids)
            np.testing.assert_array_equal(a.text_batch_embeddings, b.text_batch_embeddings)
            np.testing.assert_array_equal(a.text_embed_ids, b.text_embed_ids)


def test_kernels_release_the_gil_and_are_cached():
    from confluence.sampler import linearize, perms, textgather, walk

    kernels = [walk.walk_chunk, linearize.linearize_chunk, linearize.fill_adjacency,
               perms.perms_chunk, textgather.dedup_text, textgather.gather_rows]
    for k in kernels:
        assert k.targetoptions.get("nogil") is True, k.py_func.__name__
        assert type(k._cache).__name__ == "FunctionCache", k.py_func.__name__  # cache=True: compiled once
