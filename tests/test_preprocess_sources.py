"""Preprocessing reads every source kind (the data engineer's bookstore) into the same store content."""

from __future__ import annotations

import numpy as np
import pytest

from confluence.preprocess import preprocess
from confluence.schema.metadata import parse_metadata
from confluence.store import Store
from tests.fixtures.bookstore import HashEncoder, bookstore_metadata, write_bookstore


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    d = tmp_path_factory.mktemp("kinds")
    meta = parse_metadata(bookstore_metadata())
    out = {}
    for kind in ("parquet", "duckdb", "sqlite", "csv"):
        src = write_bookstore(d, kind, size="small")
        out[kind] = Store.open(preprocess(src, meta, d / f"store_{kind}", encoder=HashEncoder(), progress=False))
    return out


@pytest.mark.parametrize("kind", ["duckdb", "sqlite", "csv"])
def test_same_content_as_parquet(stores, kind):
    a, b = stores["parquet"], stores[kind]
    assert a.num_rows == b.num_rows and a.num_columns == b.num_columns
    for name in ("row_time", "parent_indptr", "parent_indices", "child_indptr", "child_indices", "child_time",
                 "categorical_embeddings", "text_embeddings"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=f"{kind}: {name}")
    for t in a.tables:
        for c in t.columns:
            np.testing.assert_array_equal(a.validity(t.name, c.name), b.validity(t.name, c.name))
            va, vb = a.values(t.name, c.name), b.values(t.name, c.name)
            if va is not None:
                np.testing.assert_allclose(va, vb, rtol=1e-6, err_msg=f"{kind}: {t.name}.{c.name}")
    for k in a.tasks:
        x, y = a.task_arrays(k.name), b.task_arrays(k.name)
        np.testing.assert_array_equal(x.anchor_row, y.anchor_row)
        np.testing.assert_array_equal(x.obs_time, y.obs_time)
        np.testing.assert_allclose(x.target_values, y.target_values, rtol=1e-6)


def test_bookstore_graph_invariants(stores):
    s = stores["parquet"]
    indptr = s.child_indptr
    for r in range(s.num_rows):
        t = s.child_time[indptr[r]:indptr[r + 1]]
        assert (np.diff(t) >= 0).all()
    assert int(s.parent_indptr[-1]) == s.meta["graph"]["num_parent_edges"] == int(s.child_indptr[-1])
    assert s.meta["graph"]["num_dangling"] == sum(s.meta["graph"]["dangling"].values())
