"""Column codes: a fixed code per column, keyed by the column's embedded text, that keeps columns whose names embed
alike (x1 / x2 / x3; "... in the last 7 days" / "... 30 days") apart on input."""

from __future__ import annotations

import numpy as np
import pytest

from confluence.errors import ConfigError
from confluence.model.inputs import DbTables, column_keys, value_codes
from tests.fixtures.configs import seed_model


def _near_identical(n: int, d: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = rng.standard_normal(d).astype(np.float32)
    e = np.stack([base + 0.03 * rng.standard_normal(d) for _ in range(n)]).astype(np.float32)
    return e / np.linalg.norm(e, axis=1, keepdims=True)


def test_codes_make_near_identical_column_embeddings_distinct_and_keep_padding_zero():
    cols = _near_identical(3, 64)  # cosine ~0.999, like the names of the windowed counts
    cats = np.zeros((2, 64), np.float32)
    keys = ["x1 of customers", "x2 of customers", "x3 of customers"]

    def min_distance(codes: float) -> float:
        t = DbTables.build("db", cols, cats, 2, 8, column_codes=codes, column_keys=keys)
        e = t.column_embeddings[:3].astype(np.float32)
        return min(np.linalg.norm(e[i] - e[j]) for i in range(3) for j in range(i + 1, 3))

    assert min_distance(0.0) < 0.1
    assert min_distance(1.0) > 1.0
    coded = DbTables.build("db", cols, cats, 2, 8, column_codes=0.5, column_keys=keys).column_embeddings
    want = cols + 0.5 * value_codes([f"column:{k}" for k in keys], 64)
    np.testing.assert_allclose(coded[:3].astype(np.float32), want, atol=3e-3)
    assert coded.shape[0] > 3 and not coded[3:].any()  # the padding rows stay zero: no id points at them
    # the categories are untouched by column codes
    plain = DbTables.build("db", cols, cats, 2, 8)
    np.testing.assert_array_equal(plain.categorical_embeddings,
                                  DbTables.build("db", cols, cats, 2, 8, column_codes=1.0,
                                                 column_keys=keys).categorical_embeddings)


def test_the_same_key_gets_the_same_code_in_any_database():
    keys_a = ["amount of orders", "x1 of customers"]
    keys_b = ["x1 of customers", "price of items", "amount of orders"]
    a = DbTables.build("a", np.zeros((2, 32), np.float32), np.zeros((0, 32), np.float32), 0, 8,
                       column_codes=1.0, column_keys=keys_a).column_embeddings.astype(np.float32)
    b = DbTables.build("b", np.zeros((3, 32), np.float32), np.zeros((0, 32), np.float32), 0, 8,
                       column_codes=1.0, column_keys=keys_b).column_embeddings.astype(np.float32)
    np.testing.assert_array_equal(a[0], b[2])
    np.testing.assert_array_equal(a[1], b[0])
    assert abs(float(a[0] @ a[1])) < 0.6


def test_missing_or_short_keys_are_an_error_naming_the_database():
    cols, cats = np.eye(3, 16, dtype=np.float32), np.zeros((0, 16), np.float32)
    with pytest.raises(ValueError, match="'shop'.*3.*got 2"):
        DbTables.build("shop", cols, cats, 0, 8, column_codes=1.0, column_keys=["a", "b"])
    with pytest.raises(ValueError, match="'shop'.*got None"):
        DbTables.build("shop", cols, cats, 0, 8, column_codes=1.0)
    DbTables.build("shop", cols, cats, 0, 8, column_keys=["a", "b"])  # without codes, keys are not read


def test_negative_scale_is_a_config_error():
    with pytest.raises(ConfigError, match="column_codes"):
        seed_model(column_codes=-0.5)


def test_store_keys_are_the_embedded_texts_and_tell_the_planted_columns_apart(tmp_path):
    """Every row of a real store's column table has a key; the planted numbers x1 / x2 / x3 and the windowed count
    columns each get their own; training and inference build the same coded tables from a run's config."""
    from confluence.preprocess.pipeline import preprocess
    from confluence.store import Store
    from confluence.synth import PlantedSpec, write_planted
    from tests.fixtures.bookstore import HashEncoder

    db = tmp_path / "db"
    write_planted(db, PlantedSpec(seed=0, customers=120))
    store = Store.open(preprocess(db / "raw", db / "planted.metadata.json", tmp_path / "store",
                                  encoder=HashEncoder(64), progress=False))
    keys = column_keys(store)
    assert len(keys) == np.asarray(store.column_embeddings).shape[0]
    assert len(set(keys)) == len(keys)  # no two columns of this store share a code
    by_idx = {c.column_idx: c for c in store.columns}
    assert all(keys[i] == c.text for i, c in by_idx.items() if c.text)
    windows = [k for k in keys if k.startswith("number of orders rows by customer_id in the last")]
    assert len(windows) == 5
    coded = DbTables.from_store(store, 128, column_codes=1.0).column_embeddings[: len(keys)].astype(np.float32)
    plain = np.asarray(store.column_embeddings, np.float32)
    np.testing.assert_allclose(coded - plain, value_codes([f"column:{k}" for k in keys], 64), atol=4e-3)
    # training, inference and scripts build a run's tables through one call that reads the model's settings
    model = seed_model(category_codes=1.0, column_codes=1.0)
    via_model = DbTables.for_model(store, 128, model)
    direct = DbTables.from_store(store, 128, 1.0, 1.0)
    np.testing.assert_array_equal(via_model.column_embeddings, direct.column_embeddings)
    np.testing.assert_array_equal(via_model.categorical_embeddings, direct.categorical_embeddings)
