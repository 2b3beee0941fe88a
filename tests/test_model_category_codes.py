"""Category identity codes: fixed, the same for every database, and what makes short codes separable."""

from __future__ import annotations

import numpy as np
import pytest

from confluence.errors import ConfigError
from confluence.model.config import ModelConfig
from confluence.model.inputs import DbTables, identity_codes, value_codes


def test_codes_are_fixed_unit_rows_and_prefix_stable():
    a, b = identity_codes(10, 32), identity_codes(50, 32)
    np.testing.assert_array_equal(a, b[:10])  # row i does not depend on the table's size
    np.testing.assert_allclose(np.linalg.norm(b, axis=1), 1.0, rtol=1e-5)
    gram = b @ b.T - np.eye(50)
    assert np.abs(gram).max() < 0.75  # nearly orthogonal in 32 dimensions


def test_codes_make_near_identical_category_embeddings_distinct():
    rng = np.random.default_rng(0)
    base = rng.standard_normal(256).astype(np.float32)
    # three categories whose text embeddings have cosine ~0.999 ("throws is R" / "throws is L" / ...)
    cats = np.stack([base + 0.03 * rng.standard_normal(256) for _ in range(3)]).astype(np.float32)
    cats /= np.linalg.norm(cats, axis=1, keepdims=True)
    cols = np.eye(4, 256, dtype=np.float32)

    def min_distance(codes: float) -> float:
        t = DbTables.build("db", cols, cats, 3, 8, category_codes=codes).categorical_embeddings[:3].astype(np.float32)
        return min(np.linalg.norm(t[i] - t[j]) for i in range(3) for j in range(i + 1, 3))

    assert min_distance(0.0) < 0.1
    assert min_distance(1.0) > 1.0
    plain = DbTables.build("db", cols, cats, 3, 8).categorical_embeddings
    coded = DbTables.build("db", cols, cats, 3, 8, category_codes=0.5).categorical_embeddings
    np.testing.assert_allclose(coded[:3].astype(np.float32), plain[:3].astype(np.float32)
                               + 0.5 * identity_codes(3, 256), atol=2e-3)
    assert not coded[3:].any()  # the padding stays zero


def test_negative_scale_is_a_config_error():
    with pytest.raises(ConfigError, match="category_codes"):
        ModelConfig(category_codes=-1.0)


def test_value_codes_follow_the_string_not_the_row():
    vals = ["web", "store", "phone", "web"]
    c = value_codes(vals, 64)
    np.testing.assert_array_equal(c[0], c[3])  # the same string: the same code, wherever its row is
    np.testing.assert_allclose(np.linalg.norm(c, axis=1), 1.0, rtol=1e-5)
    assert abs(float(c[0] @ c[1])) < 0.6 and abs(float(c[1] @ c[2])) < 0.6
    np.testing.assert_array_equal(value_codes(["phone"], 64)[0], c[2])  # fixed: not a function of the list
    cols = np.eye(4, 64, dtype=np.float32)
    cats = np.zeros((4, 64), np.float32)
    t = DbTables.build("db", cols, cats, 4, 8, category_codes=1.0, category_values=vals).categorical_embeddings
    np.testing.assert_allclose(t[:4].astype(np.float32), c, atol=2e-3)
    with pytest.raises(ValueError, match="3 category values"):
        DbTables.build("db", cols, cats, 4, 8, category_codes=1.0, category_values=vals[:3])


def test_store_category_values_cover_the_table_and_key_codes_across_blocks(tmp_path):
    """Every row of a store's category table has its value string; a derived task's answer block and the column
    it is computed from get the same code for the same value (the planted `customer_last_channel`)."""
    from confluence.model.inputs import category_values
    from confluence.preprocess.pipeline import preprocess
    from confluence.store import Store
    from confluence.synth import PlantedSpec, write_planted
    from tests.fixtures.bookstore import HashEncoder

    db = tmp_path / "db"
    write_planted(db, PlantedSpec(seed=0, customers=120))
    store = Store.open(preprocess(db / "raw", db / "planted.metadata.json", tmp_path / "store",
                                  encoder=HashEncoder(64), progress=False))
    vals = category_values(store)
    assert len(vals) == store.categorical_embeddings.shape[0]
    task = store.task("customer_last_channel")
    channel = store.table("orders").column("channel")
    task_vals = vals[task.cat_block_start:task.cat_block_start + task.cat_count]
    col_vals = channel.stats["categories"]
    assert sorted(task_vals) == sorted(col_vals)
    tabs = DbTables.from_store(store, 128, 1.0, "value").categorical_embeddings.astype(np.float32)
    rows = DbTables.from_store(store, 128, 1.0, "row").categorical_embeddings.astype(np.float32)
    emb = np.asarray(store.categorical_embeddings, np.float32)
    for j, v in enumerate(col_vals):
        i = task.cat_block_start + task_vals.index(v)
        k = channel.stats["cat_emb_start"] + j
        code_task, code_col = tabs[i] - emb[i], tabs[k] - emb[k]
        np.testing.assert_allclose(code_task, code_col, atol=4e-3)  # keyed by value: one code for "web"
        assert np.abs((rows[i] - emb[i]) - (rows[k] - emb[k])).max() > 0.05  # keyed by row: unrelated codes


def test_codes_key_is_validated():
    with pytest.raises(ConfigError, match="category_codes_by"):
        ModelConfig(category_codes_by="column")


def test_a_store_whose_category_lists_miss_a_row_is_a_clear_error():
    from types import SimpleNamespace

    from confluence.errors import StoreError
    from confluence.model.inputs import category_values

    col = SimpleNamespace(stats={"categories": ["a", "b"], "cat_emb_start": 0})
    store = SimpleNamespace(name="shop", categorical_embeddings=np.zeros((3, 4)), columns=[col], tasks=[])
    with pytest.raises(StoreError, match=r"store 'shop': category-table row 2 has no value string"):
        category_values(store)
    store.categorical_embeddings = np.zeros((2, 4))
    assert category_values(store) == ["a", "b"]
