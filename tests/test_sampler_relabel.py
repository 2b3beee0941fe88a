"""Re-coded answers (`sampler.relabel`, `confluence.sampler.relabel`): in a re-coded training context every cell of
the task's answers is re-coded the same way (one permutation of the classes, one swap of the booleans, one affine map
of the numbers per sequence), nothing else changes, evaluation contexts never change, and the draw is
deterministic."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from confluence.errors import ConfigError
from confluence.sampler import Sampler, SplitConfig
from confluence.store import Store
from confluence.stypes import SemanticType as ST
from tests.fixtures.bookstore import build_bookstore
from tests.fixtures.configs import seed_sampler

CFG = seed_sampler(batch_size=8, seq_len=96, width=2, max_rows=32, row_buckets=(8, 32), text_buckets=(8, 32),
                    split=SplitConfig(fractions=(0.6, 0.3, 0.1)), labels=4)
ANSWERS = ("categorical_embed_ids", "bool_values", "numeric_values")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return Store.open(build_bookstore(tmp_path_factory.mktemp("relabel"), "small", dim=8))


def _fields(batch):
    return {k: v for k, v in vars(batch).items() if isinstance(v, np.ndarray)}


def test_answers_are_recoded_consistently_and_nothing_else_changes(store):
    plain, coded = Sampler([store], CFG, seed=3), Sampler([store], replace(CFG, relabel=1.0), seed=3)
    seen = set()
    for task in store.tasks:
        ids = np.arange(min(task.num_seeds, CFG.batch_size))
        a = _fields(plain.build(task.name, ids, context="training").batch)
        b = _fields(coded.build(task.name, ids, context="training").batch)
        for k in a:
            if k not in ANSWERS:
                np.testing.assert_array_equal(a[k], b[k], err_msg=f"{task.name}: {k} changed")
        st = ST(int(task.target_stype))
        changed = False
        for i in range(len(ids)):
            valid = ~a["is_null"][i]
            col = (a["column_ids"][i] == task.target_column_idx) & (a["semantic_types"][i] == int(st)) & valid
            if st == ST.CATEGORICAL:
                lo, hi = task.cat_block_start, task.cat_block_start + task.cat_count
                x, y = a["categorical_embed_ids"][i], b["categorical_embed_ids"][i]
                block = (a["semantic_types"][i] == int(ST.CATEGORICAL)) & valid & (x >= lo) & (x < hi)
                np.testing.assert_array_equal(x[~block], y[~block])
                pairs = set(zip(x[block].tolist(), y[block].tolist(), strict=True))
                assert len({p[0] for p in pairs}) == len(pairs) == len({p[1] for p in pairs})  # one bijection
                assert all(lo <= q < hi for _, q in pairs)
                changed |= any(p != q for p, q in pairs)
            elif st == ST.BOOLEAN:
                x, y = a["bool_values"][i], b["bool_values"][i]
                np.testing.assert_array_equal(y[col], ~x[col])
                np.testing.assert_array_equal(y[~col], x[~col])
                changed |= bool(col.any())
            elif st == ST.NUMERICAL:
                x, y = a["numeric_values"][i], b["numeric_values"][i]
                np.testing.assert_array_equal(y[~col], x[~col])
                if col.sum() >= 2 and np.ptp(x[col]) > 1e-3:
                    slope, shift = np.polyfit(x[col].astype(np.float64), y[col].astype(np.float64), 1)
                    np.testing.assert_allclose(y[col], slope * x[col] + shift, atol=1e-4)  # one affine map
                    assert 0.5 - 1e-4 <= abs(slope) <= 2 + 1e-4 and abs(shift) <= 1 + 1e-4
                changed |= not np.array_equal(x[col], y[col])
            else:  # timestamps are left as they are
                for k in ANSWERS:
                    np.testing.assert_array_equal(a[k][i], b[k][i])
        if st != ST.TIMESTAMP:
            assert changed, task.name
            seen.add(st)
        # evaluation contexts are never re-coded, an evaluation of the train split neither
        for context in ("train", "val", "test"):
            pa = _fields(plain.build(task.name, ids, context=context).batch)
            pb = _fields(coded.build(task.name, ids, context=context).batch)
            for k in pa:
                np.testing.assert_array_equal(pa[k], pb[k], err_msg=f"{task.name} {context}: {k}")
    assert seen == {ST.CATEGORICAL, ST.BOOLEAN, ST.NUMERICAL}


def test_the_draw_is_deterministic_and_a_share(store):
    task = next(t for t in store.tasks if int(t.target_stype) == int(ST.NUMERICAL))
    ids = np.arange(min(task.num_seeds, CFG.batch_size))
    one = [Sampler([store], replace(CFG, relabel=0.5), seed=1).build(task.name, ids, epoch=e).batch for e in range(4)]
    two = [Sampler([store], replace(CFG, relabel=0.5), seed=1).build(task.name, ids, epoch=e).batch for e in range(4)]
    for x, y in zip(one, two, strict=True):
        np.testing.assert_array_equal(x.numeric_values, y.numeric_values)
    plain = [Sampler([store], CFG, seed=1).build(task.name, ids, epoch=e).batch for e in range(4)]
    same = [bool(np.array_equal(p.numeric_values[i], x.numeric_values[i]))
            for p, x in zip(plain, one, strict=True) for i in range(len(ids))]
    assert 0 < sum(same) < len(same)  # some sequences re-coded, some not


def test_share_is_validated():
    with pytest.raises(ConfigError, match="relabel"):
        seed_sampler(relabel=1.5)
