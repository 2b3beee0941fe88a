"""Each loss term against a hand computation (seed 004), null gating, max_K padding, z-loss, selection."""

import jax.numpy as jnp
import numpy as np
import pytest

from confluence.model.config import LossConfig
from confluence.model.heads import ModelOutput
from confluence.model.inputs import split_targets
from confluence.model.loss import compute_loss, timestamp_loss
from confluence.stypes import SemanticType as ST
from tests.fixtures.model import D_T, TINY, tiny_model

B, S, D = 3, 4, TINY.d_model
RNG = np.random.default_rng(0)


def _sig(x):
    return 1 / (1 + np.exp(-x))


def _bce(logit, y):
    p = _sig(logit)
    return -(y * np.log(p) + (1 - y) * np.log(1 - p))


def _huber(e, d=1.0):
    a = np.abs(e)
    return np.where(a <= d, 0.5 * e * e, d * (a - 0.5 * d))


def _setup(stype, cat_start=0, cat_count=0):
    out = ModelOutput(
        h=np.zeros((B, S, D), np.float32),
        null_logits=RNG.standard_normal((B, S)).astype(np.float32),
        num_preds=(RNG.standard_normal((B, S)) * 2).astype(np.float32),
        bool_logits=RNG.standard_normal((B, S)).astype(np.float32),
        ts_preds=RNG.standard_normal((B, S, 15)).astype(np.float32),
        cat_preds=RNG.standard_normal((B, S, D)).astype(np.float32),
    )
    target_pos = np.array([1, 0, 3])
    is_target = np.zeros((B, S), bool)
    is_target[np.arange(B), target_pos] = True
    inputs = {
        "is_target": is_target,
        "is_null": np.zeros((B, S), bool),
        "seq_valid": np.ones(B, bool),
        "numeric_values": RNG.standard_normal((B, S)).astype(np.float32),
        "bool_values": RNG.random((B, S)) < 0.5,
        "timestamp_values": RNG.standard_normal((B, S, 15)).astype(np.float32),
        "categorical_embed_ids": np.zeros((B, S), np.uint32),
        "target_stype": np.int32(stype),
        "cat_block_start": np.int32(cat_start),
        "cat_count": np.int32(cat_count),
    }
    inputs["is_null"][1, 0] = True  # the second sequence's target is NULL
    return out, inputs, target_pos


def _loss(out, inputs, table=None, max_k=8, **cfg):
    model = tiny_model()
    table = np.zeros((8, D_T), np.float16) if table is None else table
    inputs = split_targets(inputs)
    return compute_loss(ModelOutput(*(None if x is None else jnp.asarray(x) for x in out)), {k: jnp.asarray(v) for k, v in inputs.items()},
                        model.encoder, jnp.asarray(table), LossConfig(max_k=max_k, **cfg)), model


def _hand(out, inputs, t, type_loss):
    b = np.arange(B)
    null = inputs["is_null"][b, t].astype(np.float64)
    cell = _bce(out.null_logits[b, t].astype(np.float64), null) + (1 - null) * type_loss
    return cell.mean(), cell


def test_numerical_huber_with_null_gating():
    out, inputs, t = _setup(ST.NUMERICAL)
    b = np.arange(B)
    out.num_preds[0, t[0]] = inputs["numeric_values"][0, t[0]] + 0.5  # quadratic zone
    out.num_preds[2, t[2]] = inputs["numeric_values"][2, t[2]] - 3.0  # linear zone
    parts, _ = _loss(out, inputs)
    expect, _ = _hand(out, inputs, t, _huber(out.num_preds[b, t] - inputs["numeric_values"][b, t]))
    assert float(parts.loss) == pytest.approx(expect, rel=1e-5)
    # The null target contributes only its null BCE: changing its value prediction changes nothing.
    out.num_preds[1, t[1]] += 100.0
    assert float(_loss(out, inputs)[0].loss) == pytest.approx(expect, rel=1e-5)


def test_timestamp_cyclic_mean_plus_weighted_scalar():
    out, inputs, t = _setup(ST.TIMESTAMP)
    b = np.arange(B)
    h = _huber(out.ts_preds[b, t] - inputs["timestamp_values"][b, t])
    type_loss = h[:, :14].mean(axis=1) + 2.0 * h[:, 14]
    parts, _ = _loss(out, inputs)
    assert float(parts.loss) == pytest.approx(_hand(out, inputs, t, type_loss)[0], rel=1e-5)
    # ts_scalar_weight is configurable
    parts3, _ = _loss(out, inputs, ts_scalar_weight=3.0)
    type3 = h[:, :14].mean(axis=1) + 3.0 * h[:, 14]
    assert float(parts3.loss) == pytest.approx(_hand(out, inputs, t, type3)[0], rel=1e-5)
    np.testing.assert_allclose(np.asarray(timestamp_loss(jnp.zeros(15), jnp.full(15, 2.0), 1.0, 2.0)), 1.5 + 3.0)


def test_boolean_bce():
    out, inputs, t = _setup(ST.BOOLEAN)
    b = np.arange(B)
    type_loss = _bce(out.bool_logits[b, t].astype(np.float64), inputs["bool_values"][b, t].astype(np.float64))
    parts, _ = _loss(out, inputs)
    assert float(parts.loss) == pytest.approx(_hand(out, inputs, t, type_loss)[0], rel=1e-5)


def test_categorical_cross_entropy_with_max_k_padding_and_z_loss():
    start, k, max_k = 2, 3, 8
    out, inputs, t = _setup(ST.CATEGORICAL, start, k)
    b = np.arange(B)
    inputs["categorical_embed_ids"][b, t] = start + np.array([0, 1, 2])
    table = RNG.standard_normal((16, D_T)).astype(np.float16)
    parts, model = _loss(out, inputs, table, max_k)
    w = np.asarray(model.encoder.categorical_encoder.weight, np.float64)
    bias = np.asarray(model.encoder.categorical_encoder.bias, np.float64)
    proj = table[start:start + k].astype(np.float64) @ w + bias  # [K, D]
    logits = out.cat_preds[b, t].astype(np.float64) @ proj.T  # [B, K]
    lse = np.log(np.exp(logits).sum(axis=1))
    ce = lse - logits[b, [0, 1, 2]]
    type_loss = ce + 1e-4 * lse**2
    assert float(parts.loss) == pytest.approx(_hand(out, inputs, t, type_loss)[0], rel=1e-4)
    # Entries of the table beyond the target's K categories (max_K padding) do not affect the loss.
    table2 = table.copy()
    table2[start + k:] = 50.0
    assert float(_loss(out, inputs, table2, max_k)[0].loss) == pytest.approx(float(parts.loss), rel=1e-6)


def test_type_selection_and_sequence_weights():
    out, inputs, t = _setup(ST.NUMERICAL)
    base = float(_loss(out, inputs)[0].loss)
    inputs2 = dict(inputs, bool_values=~inputs["bool_values"],
                   timestamp_values=inputs["timestamp_values"] + 5)
    assert float(_loss(out, inputs2)[0].loss) == pytest.approx(base, rel=1e-6)  # other types not selected
    # A filler sequence (seq_valid False) is excluded from the mean.
    inputs3 = dict(inputs, seq_valid=np.array([True, True, False]))
    b = np.arange(B)
    _, cell = _hand(out, inputs, t, _huber(out.num_preds[b, t] - inputs["numeric_values"][b, t]))
    parts, _ = _loss(out, inputs3)
    assert float(parts.loss) == pytest.approx(cell[:2].mean(), rel=1e-5)
    assert np.asarray(parts.weight).tolist() == [1.0, 1.0, 0.0]


def test_median_loss_is_smooth_l1_on_numbers_only():
    """numeric_loss="median": huber(e, d) / d on the numerical target; timestamps keep seed 004's Huber."""
    d = 0.05
    out, inputs, t = _setup(ST.NUMERICAL)
    b = np.arange(B)
    out.num_preds[0, t[0]] = inputs["numeric_values"][0, t[0]] + 0.01  # quadratic zone
    parts, _ = _loss(out, inputs, numeric_loss="median", median_delta=d)
    err = out.num_preds[b, t] - inputs["numeric_values"][b, t]
    expect, _ = _hand(out, inputs, t, _huber(err, d) / d)
    assert float(parts.loss) == pytest.approx(expect, rel=1e-5)

    out, inputs, t = _setup(ST.TIMESTAMP)
    parts, _ = _loss(out, inputs, numeric_loss="median", median_delta=d)
    e = out.ts_preds[b, t] - inputs["timestamp_values"][b, t]
    ts = _huber(e[:, :14]).mean(axis=1) + 2.0 * _huber(e[:, 14])
    expect, _ = _hand(out, inputs, t, ts)
    assert float(parts.loss) == pytest.approx(expect, rel=1e-5)


def test_median_loss_minimiser_is_the_median():
    """A constant prediction fitted to a skewed sample lands on its median (Huber with delta 1 on its mean side)."""
    import jax

    from confluence.model.loss import numeric_point_loss

    y = jnp.asarray(np.concatenate([np.zeros(70), np.full(30, 10.0)]).astype(np.float32))  # median 0, mean 3
    for cfg, lo, hi in ((LossConfig(numeric_loss="median"), -0.1, 0.1), (LossConfig(), 0.3, 10.0)):
        grad = jax.jit(jax.grad(lambda c, cfg=cfg: jnp.mean(numeric_point_loss(c - y, cfg))))
        c = 0.0
        for _ in range(2000):
            c -= 0.05 * float(grad(c))
        assert lo < c < hi, (cfg.numeric_loss, c)


def test_unknown_numeric_loss_is_refused():
    from confluence.errors import ConfigError

    with pytest.raises(ConfigError, match="numeric_loss"):
        LossConfig(numeric_loss="l3")
