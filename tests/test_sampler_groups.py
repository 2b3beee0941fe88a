"""The numba kernels' argument groups (`confluence.sampler.groups`): a few typed groups per kernel, each filled from
the same-named arrays of what it describes, the batch's cell tensors in the batch specification's order."""

from __future__ import annotations

import inspect

import numpy as np

from confluence.batch import SEQ_FIELDS
from confluence.sampler import groups as G
from confluence.sampler import labels, linearize, perms, walk
from confluence.sampler.sampler import Sampler
from tests.fixtures.configs import seed_sampler

KERNELS = [walk.walk_chunk, linearize.linearize_chunk, labels.choose_labels_chunk,
           labels.append_labels_chunk, perms.perms_chunk]


def test_cells_are_the_batch_specification():
    assert G.Cells._fields == tuple(SEQ_FIELDS)


def test_kernels_take_a_few_groups():
    for k in KERNELS:
        params = inspect.signature(k.py_func).parameters
        assert len(params) <= 12, (k.py_func.__name__, len(params))  # 31-66 positional arrays before the groups
        assert sum(p.annotation == "tuple" for p in params.values()) >= 2, k.py_func.__name__
        assert k.targetoptions.get("nogil") is True, k.py_func.__name__


def _same(group, source, names: dict[str, str]) -> None:
    """Every field of `group` is the very object `source` holds under the field's name (or `names[field]`)."""
    for f in group._fields:
        want = getattr(source, names.get(f, f))
        got = getattr(group, f)
        if isinstance(want, np.ndarray):
            assert got is want, f
        else:
            assert got == want, f


def test_groups_hold_the_named_arrays(small_planted_store):
    cfg = seed_sampler(labels=4, label_match=2, threads=1)
    with Sampler([small_planted_store], cfg) as sampler:
        d = sampler.data[0]
        _same(G.graph_of(d), d, {"p_ptr": "parent_indptr", "p_idx": "parent_indices", "p_col": "parent_column"})
        segs = d.child_segments(True)
        _same(G.segments_of(segs), segs, {})
        task = sampler.entries[0].task
        _same(G.target_of(task), task, {"stype": "target_stype", "col": "target_col", "f32": "tgt_f32",
                                        "ts": "tgt_ts", "u32": "tgt_u32", "bits": "tgt_bits", "valid": "tgt_valid"})
        index = sampler.label_index(task.name)
        _same(G.labels_of(index), index, {"f32": "tgt_f32", "ts": "tgt_ts", "u32": "tgt_u32", "bits": "tgt_bits",
                                          "valid": "tgt_valid"})
        counts = d.child_counts(True, (30,))
        shown = np.ones(counts.num, np.bool_)
        means = d.child_means(True)
        m_shown = np.ones(means.num, np.bool_)
        group = G.counts_of(counts, shown, True, means, m_shown, 32, 8)
        for f in ("tab_ptr", "col", "fk", "window", "mean", "std"):
            assert getattr(group, f) is getattr(counts, f), f
        for f in ("tab_ptr", "col", "fk", "val", "child_tab"):
            assert getattr(group, f"m_{f}") is getattr(means, f), f
        assert group.shown is shown and group.all_rows is True
        assert group.m_shown is m_shown and (group.m_rows, group.m_cells) == (32, 8)


def test_a_group_goes_to_the_kernels_as_a_plain_tuple():
    g = G.WalkLimits(128, 16, 4, 64, np.zeros(0, np.int32))
    t = G.args(g)
    assert type(t) is tuple and t == tuple(g)
