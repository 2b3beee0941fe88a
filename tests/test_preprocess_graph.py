"""KeyIndex lookups (dense, sparse and string keys) and CSR construction on a hand-made edge list."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from confluence.errors import DataError
from confluence.preprocess.graph import KeyIndex, build_graph, table_edges


@pytest.mark.parametrize("keys", [
    [3, 1, 2, 0],                         # dense: direct table
    [10, 1_000_000, -5, 7**12],           # sparse: binary search
    ["c", "a", "b", "zz"],                # strings: Arrow hash lookup
])
def test_key_index_lookup(keys):
    idx = KeyIndex("p", "id", pa.array(keys))
    probe = pa.array([keys[2], None, keys[0], keys[3], keys[1], keys[2]])
    assert idx.lookup(probe, "t.c").tolist() == [2, -1, 0, 3, 1, 2]
    missing = 999_999_999 if isinstance(keys[0], int) else "nope"
    assert idx.lookup(pa.array([missing, keys[1]]), "t.c").tolist() == [-1, 1]


def test_key_index_casts_and_rejects():
    idx = KeyIndex("p", "id", pa.array([5, 6, 7], pa.int64()))
    assert idx.lookup(pa.array([7, 5], pa.int32()), "t.c").tolist() == [2, 0]
    with pytest.raises(DataError, match="t.c: foreign key values of type string do not convert"):
        idx.lookup(pa.array(["x"]), "t.c")
    with pytest.raises(DataError, match="row 1: primary key is NULL"):
        KeyIndex("p", "id", pa.array([1, None]))


def test_csr_from_edges():
    # rows 0,1 parents; rows 2..4 children with FK columns 7 and 8; child times 30, 10, 10
    row_time = np.array([0, 0, 30, 10, 10], dtype=np.int64)
    child, parent, column = table_edges([np.array([0, 0, 1]), np.array([1, -1, 0])], [7, 8], row_offset=2)
    assert child.tolist() == [2, 2, 3, 4, 4] and parent.tolist() == [0, 1, 0, 1, 0]
    g = build_graph(5, child, parent, column, row_time)
    assert g.parent_indptr.tolist() == [0, 0, 0, 2, 3, 5]
    assert g.child_indptr.tolist() == [0, 3, 5, 5, 5, 5]
    assert g.child_indices.tolist() == [3, 4, 2, 4, 2]  # parent 0: t=10 (row 3), t=10 (row 4, col 8), t=30
    assert g.child_column.tolist() == [7, 8, 7, 7, 8]
    assert g.child_time.tolist() == [10, 10, 30, 10, 30]


def test_child_order_matches_lexsort():
    from confluence.preprocess.graph import child_order

    rng = np.random.default_rng(3)
    n_rows, n_edges = 500, 20_000
    parent = rng.integers(0, n_rows, n_edges)
    parent[:3000] = 7  # one big bucket (merge sort path)
    ctime = rng.integers(0, 50, n_edges).astype(np.int64)  # many ties: stability matters
    indptr = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(parent, minlength=n_rows), out=indptr[1:])
    np.testing.assert_array_equal(child_order(parent, ctime, indptr), np.lexsort((ctime, parent)))


@given(
    n_parents=st.integers(1, 12),
    fks=st.lists(st.lists(st.one_of(st.none(), st.integers(-2, 15)), min_size=0, max_size=30), min_size=1,
                 max_size=3),
    times=st.lists(st.integers(0, 5), min_size=30, max_size=30),
)
def test_graph_matches_reference(n_parents, fks, times):
    """Random FK columns of one child table against a pure-Python reference of both CSR directions."""
    n_child = min(len(c) for c in fks)
    fks = [c[:n_child] for c in fks]
    keys = KeyIndex("p", "id", pa.array(list(range(0, 2 * n_parents, 2))))  # even keys: odd values dangle
    parents = [keys.lookup(pa.array(c, pa.int64()), "c.fk") for c in fks]
    dangling = [sum(v is not None and not (0 <= v < 2 * n_parents and v % 2 == 0) for v in c) for c in fks]
    assert [int(((p < 0) & np.array([v is not None for v in c], bool)).sum()) for p, c in zip(parents, fks,
                                                                                           strict=True)] == dangling
    num_rows = n_parents + n_child
    row_time = np.concatenate([np.full(n_parents, -1), np.array(times[:n_child])]).astype(np.int64)
    child, parent, column = table_edges(parents, [10 + i for i in range(len(fks))], row_offset=n_parents)
    g = build_graph(num_rows, child, parent, column, row_time)
    ref_parent = {r: [] for r in range(num_rows)}
    ref_child = {r: [] for r in range(num_rows)}
    for i in range(n_child):
        for j, c in enumerate(fks):
            v = c[i]
            if v is not None and 0 <= v < 2 * n_parents and v % 2 == 0:
                ref_parent[n_parents + i].append((v // 2, 10 + j))
                ref_child[v // 2].append((row_time[n_parents + i], n_parents + i, 10 + j))
    for r in range(num_rows):
        a, b = g.parent_indptr[r], g.parent_indptr[r + 1]
        assert list(zip(g.parent_indices[a:b].tolist(), g.parent_column[a:b].tolist(), strict=True)) == ref_parent[r]
        a, b = g.child_indptr[r], g.child_indptr[r + 1]
        got = list(zip(g.child_time[a:b].tolist(), g.child_indices[a:b].tolist(), g.child_column[a:b].tolist(),
                       strict=True))
        assert got == sorted(ref_child[r])
