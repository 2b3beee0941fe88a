"""Category identity codes: fixed, the same for every database, and what makes short codes separable."""

from __future__ import annotations

import numpy as np
import pytest

from confluence.errors import ConfigError
from confluence.model.inputs import DbTables, identity_codes, value_codes
from tests.fixtures.configs import seed_model


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
        seed_model(category_codes=-1.0)


def test_value_codes_follow_the_string_not_the_row():
    """`value_codes` (the column codes' key) gives one fixed code per string, wherever it appears."""
    vals = ["web", "store", "phone", "web"]
    c = value_codes(vals, 64)
    np.testing.assert_array_equal(c[0], c[3])  # the same string: the same code, wherever its row is
    np.testing.assert_allclose(np.linalg.norm(c, axis=1), 1.0, rtol=1e-5)
    assert abs(float(c[0] @ c[1])) < 0.6 and abs(float(c[1] @ c[2])) < 0.6
    np.testing.assert_array_equal(value_codes(["phone"], 64)[0], c[2])  # fixed: not a function of the list


def test_removed_settings_load_at_their_off_value_and_are_named_otherwise():
    """A checkpoint or recipe written before a setting was removed (docs/design/decisions.md, "Removed settings") still
    loads when it names the setting off; any other value is an error naming the setting."""
    from confluence.training.config import RunConfig

    old = {"model": {"category_codes_by": "row", "numeric_frequencies": 0, "numeric_frequency_scale": 3.0,
                     "category_codes": 1.0}}
    assert RunConfig.from_dict(old).model.category_codes == 1.0
    for name, value in (("category_codes_by", "value"), ("numeric_frequencies", 8)):
        with pytest.raises(ConfigError, match=rf"model\.{name}.*removed.*Removed settings"):
            RunConfig.from_dict({"model": {name: value}})
    with pytest.raises(ConfigError, match="unknown setting"):
        RunConfig.from_dict({"model": {"numeric_frequency": 0}})
    # removed 2026-11-27: the epoch's smooth-L1 loss and the "before" scaling of windowed counts
    later = {"loss": {"epoch_loss": "huber", "epoch_median_delta": 1e-3}, "sampler": {"window_count_stats": "at_child"}}
    assert RunConfig.from_dict(later).loss.huber_delta == 1.0
    for section, name, value in (("loss", "epoch_loss", "median"), ("sampler", "window_count_stats", "before")):
        with pytest.raises(ConfigError, match=rf"{section}\.{name}.*removed.*Removed settings"):
            RunConfig.from_dict({section: {name: value}})


def test_the_shipped_models_name_removed_settings_off_and_load():
    """The fifth pretrained model (`pretrained:small-v5`, the demo's start) was saved while the removed settings
    existed and names them off; its config and the sixth's load."""
    import json

    from confluence.toolkit.shipped import checkpoint_path
    from confluence.training.config import RunConfig

    meta = json.loads((checkpoint_path("pretrained:small-v5") / "meta.json").read_text())
    model = meta["config"]["model"]
    assert model["numeric_frequencies"] == 0 and model["category_codes_by"] == "row"
    for name in ("small", "small-v5"):
        meta = json.loads((checkpoint_path(f"pretrained:{name}") / "meta.json").read_text())
        assert RunConfig.from_dict(meta["config"]).model.d_model == meta["config"]["model"]["d_model"]
