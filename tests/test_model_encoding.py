"""Value encoding: each type path, null gating, target masking priority, padding -> h0 = 0."""

import jax.numpy as jnp
import numpy as np

from confluence.stypes import SemanticType as ST
from tests.fixtures.configs import seed_model
from tests.fixtures.model import D_T, TINY, tiny_model

COL = np.random.default_rng(0).standard_normal((6, D_T)).astype(np.float16)
CAT = np.random.default_rng(1).standard_normal((5, D_T)).astype(np.float16)
TXT = np.random.default_rng(2).standard_normal((3, D_T)).astype(np.float16)


def _inputs(stypes, **over):
    s = len(stypes)
    inp = {
        "semantic_types": np.array([stypes], np.int8),
        "column_ids": np.arange(s, dtype=np.int32)[None] % 6,
        "is_null": np.zeros((1, s), bool),
        "numeric_values": np.zeros((1, s), np.float32),
        "timestamp_values": np.zeros((1, s, 15), np.float32),
        "bool_values": np.zeros((1, s), bool),
        "categorical_embed_ids": np.zeros((1, s), np.uint32),
        "text_embed_ids": np.zeros((1, s), np.uint32),
        "is_target": np.zeros((1, s), bool),
        "is_padding": np.zeros((1, s), bool),
        "text_batch_embeddings": TXT,
    }
    for k, v in over.items():
        inp[k] = v
    return inp


def _col(enc, c):
    return np.asarray(enc.column_name_encoder(jnp.asarray(COL[c], jnp.float32)))


def test_each_type_path_matches_its_encoder():
    enc = tiny_model().encoder
    ts = np.linspace(-1, 1, 15, dtype=np.float32)
    stypes = [ST.IDENTIFIER, ST.NUMERICAL, ST.TIMESTAMP, ST.BOOLEAN, ST.CATEGORICAL, ST.TEXT]
    inp = _inputs(
        stypes,
        numeric_values=np.array([[0, 1.5, 0, 0, 0, 0]], np.float32),
        timestamp_values=np.stack([np.zeros(15), np.zeros(15), ts, np.zeros(15), np.zeros(15), np.zeros(15)])[None]
        .astype(np.float32),
        bool_values=np.array([[0, 0, 0, 1, 0, 0]], bool),
        categorical_embed_ids=np.array([[0, 0, 0, 0, 3, 0]], np.uint32),
        text_embed_ids=np.array([[0, 0, 0, 0, 0, 2]], np.uint32),
    )
    out = np.asarray(enc(inp, jnp.asarray(COL), jnp.asarray(CAT)))[0]
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    expect = [
        np.asarray(enc.identifier_emb),
        np.asarray(enc.numerical_encoder(f32([1.5]))),
        np.asarray(enc.timestamp_encoder(f32(ts))),
        np.asarray(enc.boolean_encoder[1]),
        np.asarray(enc.categorical_encoder(f32(CAT[3]))),
        np.asarray(enc.text_encoder(f32(TXT[2]))),
    ]
    for i, e in enumerate(expect):
        np.testing.assert_allclose(out[i], _col(enc, i) + e, rtol=1e-5, atol=1e-6, err_msg=f"stype {stypes[i]!r}")
    # Boolean false uses row 0, a different vector.
    inp["bool_values"][0, 3] = False
    out0 = np.asarray(enc(inp, jnp.asarray(COL), jnp.asarray(CAT)))[0]
    np.testing.assert_allclose(out0[3], _col(enc, 3) + np.asarray(enc.boolean_encoder[0]), rtol=1e-5, atol=1e-6)


def test_null_gating_and_target_mask_priority():
    enc = tiny_model().encoder
    stypes = [ST.NUMERICAL] * 4
    inp = _inputs(
        stypes,
        numeric_values=np.array([[2.0, 2.0, 2.0, 2.0]], np.float32),
        is_null=np.array([[False, True, False, True]]),
        is_target=np.array([[False, False, True, True]]),
    )
    out = np.asarray(enc(inp, jnp.asarray(COL), jnp.asarray(CAT)))[0]
    np.testing.assert_allclose(out[1], _col(enc, 1) + np.asarray(enc.null_emb), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[2], _col(enc, 2) + np.asarray(enc.mask_emb), rtol=1e-5, atol=1e-6)
    # null AND target: the mask embedding wins; the column encoding is kept.
    np.testing.assert_allclose(out[3], _col(enc, 3) + np.asarray(enc.mask_emb), rtol=1e-5, atol=1e-6)
    # The value of a null or target cell does not leak into the encoding.
    inp2 = dict(inp, numeric_values=np.array([[2.0, -7.0, 9.0, 5.0]], np.float32))
    out2 = np.asarray(enc(inp2, jnp.asarray(COL), jnp.asarray(CAT)))[0]
    np.testing.assert_array_equal(out[1:], out2[1:])


def test_padding_positions_get_zero_h0():
    model = tiny_model()
    inp = _inputs([ST.NUMERICAL, ST.TEXT, ST.BOOLEAN], is_padding=np.array([[False, True, True]]),
                  numeric_values=np.array([[1.0, 3.0, 0]], np.float32))
    x = model.encoder(inp, jnp.asarray(COL), jnp.asarray(CAT))
    assert not np.any(np.asarray(x)[0, 1:])
    h0 = np.asarray(model.h0_norm(x))
    assert not np.any(h0[0, 1:]) and np.all(np.isfinite(h0))
    assert TINY.d_model == h0.shape[-1]


def test_row_age_adds_its_features_to_every_cell_of_a_row_with_an_age_and_nothing_otherwise():
    import dataclasses

    from confluence.model.encoding import age_features

    plain = tiny_model().encoder
    enc = tiny_model(dataclasses.replace(TINY, row_age=True)).encoder
    assert plain.row_age_emb is None and enc.row_age_emb.shape[1] == TINY.d_model
    stypes = [ST.NUMERICAL, ST.CATEGORICAL, ST.NUMERICAL]
    ages = np.array([[3.0, 45.0, -1.0]], np.float32)
    base = _inputs(stypes)
    out = np.asarray(enc({**base, "row_age": ages}, jnp.asarray(COL), jnp.asarray(CAT)))[0]
    none = np.asarray(enc({**base, "row_age": np.full_like(ages, -1.0)}, jnp.asarray(COL), jnp.asarray(CAT)))[0]
    feats = np.asarray(age_features(jnp.asarray(ages[0])))
    for i in range(3):
        np.testing.assert_allclose(out[i] - none[i], feats[i] @ np.asarray(enc.row_age_emb), rtol=3e-2, atol=3e-2)
    np.testing.assert_array_equal(out[2], none[2])  # unknown age: exactly the seed's encoding
    # off (the default), the ages are not read at all
    a = np.asarray(plain({**base, "row_age": ages}, jnp.asarray(COL), jnp.asarray(CAT)))
    b = np.asarray(plain(base, jnp.asarray(COL), jnp.asarray(CAT)))
    np.testing.assert_array_equal(a, b)


def test_numeric_by_column_moves_each_number_along_its_own_columns_direction():
    import dataclasses

    plain = tiny_model().encoder
    enc = tiny_model(dataclasses.replace(TINY, numeric_by_column=True)).encoder
    assert plain.numeric_column_weight is None and enc.numeric_column_weight.shape == (D_T, TINY.d_model)
    stypes = [ST.NUMERICAL, ST.NUMERICAL, ST.CATEGORICAL]
    x = np.array([[1.5, -0.5, 9.0]], np.float32)
    base = _inputs(stypes)
    out = np.asarray(enc({**base, "numeric_values": x}, jnp.asarray(COL), jnp.asarray(CAT)))[0]
    zero = np.asarray(enc(base, jnp.asarray(COL), jnp.asarray(CAT)))[0]
    w = np.asarray(enc.numeric_column_weight)
    seed_dir = np.asarray(enc.numerical_encoder.weight)[0]
    for i in range(2):  # column i's own direction beside the shared one
        want = x[0, i] * (COL[i].astype(np.float32) @ w + seed_dir)
        np.testing.assert_allclose(out[i] - zero[i], want, rtol=3e-2, atol=3e-2)
    np.testing.assert_array_equal(out[2], zero[2])  # a categorical cell's numeric slot reaches nothing


def test_numeric_by_column_init_scales_the_projection_and_zero_starts_as_the_seed():
    import dataclasses

    import pytest

    from confluence.errors import ConfigError

    one = tiny_model(dataclasses.replace(TINY, numeric_by_column=True)).encoder
    half = tiny_model(dataclasses.replace(TINY, numeric_by_column=True, numeric_by_column_init=0.5)).encoder
    zero = tiny_model(dataclasses.replace(TINY, numeric_by_column=True, numeric_by_column_init=0.0)).encoder
    np.testing.assert_allclose(np.asarray(half.numeric_column_weight), 0.5 * np.asarray(one.numeric_column_weight))
    inp = _inputs([ST.NUMERICAL, ST.CATEGORICAL], numeric_values=np.array([[2.0, 0.0]], np.float32))
    seed = tiny_model().encoder(inp, jnp.asarray(COL), jnp.asarray(CAT))
    np.testing.assert_array_equal(np.asarray(zero(inp, jnp.asarray(COL), jnp.asarray(CAT))), np.asarray(seed))
    with pytest.raises(ConfigError, match="numeric_by_column_init"):
        seed_model(numeric_by_column_init=-1.0)
