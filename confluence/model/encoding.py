"""Value encoding (seed 002): column-name encoder + six type encoders on the dense layout, null gating, target
masking (priority over null). Returns `col_enc + val_final` with padding zeroed; the transformer applies the h0
RMSNorm (kept outside so this module's parameters are exactly the seed's 203,264 at D = D_t = 256).

The column-name, categorical and text encoders are `Linear(table[ids])` (seed 002) on a frozen table. Which of two
equal forms runs depends on the table's size, and neither has a scatter in its gradient: a table of at most D_t
rows is projected first and its rows picked by a one-hot contraction (B x S x V x D work, the gradient a dense
matmul); a larger one has each cell's frozen row gathered (no gradient: the table is an input) and projected
(B x S x D_t x D). Gathering rows of a projected table, the cheapest forward, has as gradient a scatter-add of all
B x S cells into the few rows of the table, which serialises on a GPU's atomics (docs/design/decisions.md, "Training
speed"). Every other learned vector (numerical and timestamp weights and biases, the three tables' biases, the
identifier, boolean, null and mask embeddings) is a row of one small matrix, picked or scaled per cell by a
coefficient computed from the inputs: one product whose gradient is a product, where a bias or an embedding
broadcast to every cell has a reduction over all B x S cells as gradient (windowed and slow on XLA's CPU backend)
and an embedding lookup a scatter-add. The sum is the seed's: the one-hot type selection, null gating, target
masking with priority, padding zeroed.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from confluence.model.config import ModelConfig
from confluence.stypes import SemanticType
from confluence.toolkit.layers import Linear, matmul, normal_init


def project_rows(weight: jax.Array, table: jax.Array, ids: jax.Array, dtype) -> jax.Array:
    """`table[ids] @ weight` [B, S, D] for a frozen table [V, D_t], in `dtype`, with a gradient free of scatters
    (module doc): a one-hot contraction with the projected table when V <= D_t, else a gather and a projection."""
    table = jax.lax.stop_gradient(table).astype(dtype)
    ids = ids.astype(jnp.int32)
    if table.shape[0] <= table.shape[1]:
        return matmul(jax.nn.one_hot(ids, table.shape[0], dtype=dtype), matmul(table, weight))
    return matmul(table[ids], weight)


# Knots (days) of the piecewise-linear row-age encoding: an hour, a day, a week, a month, a quarter, a year, ...
AGE_KNOTS_DAYS = (0.0, 1 / 24, 1.0, 2.0, 7.0, 14.0, 30.0, 60.0, 90.0, 180.0, 365.0, 730.0, 3650.0)
N_AGE_FEATURES = len(AGE_KNOTS_DAYS) + 1  # a ramp per interval, log1p(age) / 8 and "has an age"


def age_features(row_age: jax.Array) -> jax.Array:
    """[..] row ages in days (< 0: unknown) -> [.., N_AGE_FEATURES] FP32 features, all 0 where unknown.

    Piecewise-linear encoding (Gorishniy et al. 2022, "PLE"): feature i ramps from 0 to 1 across
    [knot_i, knot_i+1], so a window such as "the last 30 days" is a linear threshold of the features, which one
    z-scored timestamp is not; plus log1p(age) / 8 (beyond the last knot) and an indicator that the age is known."""
    a = row_age.astype(jnp.float32)
    known = a >= 0
    a = jnp.where(known, a, 0.0)
    knots = jnp.asarray(AGE_KNOTS_DAYS, jnp.float32)
    ramps = jnp.clip((a[..., None] - knots[:-1]) / (knots[1:] - knots[:-1]), 0.0, 1.0)
    feats = jnp.concatenate([ramps, (jnp.log1p(a) / 8.0)[..., None], jnp.ones_like(a)[..., None]], axis=-1)
    return feats * known[..., None].astype(jnp.float32)


# Buckets of the recency rank (`child_rank`): 0..7 each their own, then 8-15, 16-31, 32-63 and 64 or more.
RANK_EXACT = 8
N_RANK_BUCKETS = RANK_EXACT + 4


def rank_buckets(child_rank: jax.Array, dtype) -> jax.Array:
    """[..] recency ranks (< 0: unknown) -> [.., N_RANK_BUCKETS] one-hot rows in `dtype`, all 0 where unknown:
    the latest children each get their own row, older ones share a row per doubling."""
    r = child_rank.astype(jnp.int32)
    log_bucket = RANK_EXACT - 3 + jnp.floor(jnp.log2(jnp.maximum(r, 1).astype(jnp.float32))).astype(jnp.int32)
    bucket = jnp.where(r < RANK_EXACT, r, jnp.minimum(log_bucket, N_RANK_BUCKETS - 1))
    return jax.nn.one_hot(jnp.where(r >= 0, bucket, -1), N_RANK_BUCKETS, dtype=dtype)


class ValueEncoder(eqx.Module):
    """Produces the pre-norm h0 [B, S, D] from a batch's cell tensors and the GPU-resident embedding tables."""

    column_name_encoder: Linear
    numerical_encoder: Linear
    timestamp_encoder: Linear
    boolean_encoder: jax.Array  # Embedding(2, D): row 0 = false, row 1 = true
    categorical_encoder: Linear
    text_encoder: Linear
    identifier_emb: jax.Array
    null_emb: jax.Array
    mask_emb: jax.Array
    numeric_column_weight: jax.Array | None  # [D_t, D]: column-name embedding -> the column's number direction
    row_age_emb: jax.Array | None  # [A, D]: the row-age features (`age_features`) -> D (row_age off: None)
    child_rank_emb: jax.Array | None  # [N_RANK_BUCKETS, D]: a row per recency-rank bucket (child_rank off: None)
    arrival_weight: jax.Array | None  # [D_t, D]: the arrival foreign key's name embedding -> D (arrival off: None)
    arrival_emb: jax.Array | None  # [2, D]: reached as a parent / as a child (arrival off: None)

    def __init__(self, cfg: ModelConfig, *, key: jax.Array):
        k = jax.random.split(key, 11)
        d = cfg.d_model
        self.column_name_encoder = Linear(cfg.d_t, d, key=k[0])
        self.numerical_encoder = Linear(1, d, key=k[1])
        self.timestamp_encoder = Linear(cfg.d_time, d, key=k[2])
        self.boolean_encoder = normal_init(k[3], (2, d))
        self.categorical_encoder = Linear(cfg.d_t, d, key=k[4])
        self.text_encoder = Linear(cfg.d_t, d, key=k[5])
        self.identifier_emb = normal_init(k[6], (d,))
        self.null_emb = normal_init(k[7], (d,))
        self.mask_emb = normal_init(k[8], (d,))
        self.row_age_emb = normal_init(jax.random.fold_in(key, 11), (N_AGE_FEATURES, d)) if cfg.row_age else None
        self.child_rank_emb = (normal_init(jax.random.fold_in(key, 13), (N_RANK_BUCKETS, d))
                               if cfg.child_rank else None)
        ncol = Linear(cfg.d_t, d, key=jax.random.fold_in(key, 12)).weight if cfg.numeric_by_column else None
        # scaled by `arrival_init` (0 by default: the model starts as the one without arrival, cell for cell)
        a = cfg.arrival_init
        self.arrival_weight = (a * Linear(cfg.d_t, d, key=jax.random.fold_in(key, 14)).weight if cfg.arrival
                               else None)
        self.arrival_emb = a * normal_init(jax.random.fold_in(key, 15), (2, d)) if cfg.arrival else None
        self.numeric_column_weight = None if ncol is None else cfg.numeric_by_column_init * ncol

    def __call__(self, inputs: dict[str, jax.Array], column_table: jax.Array, category_table: jax.Array) -> jax.Array:
        dt = self.identifier_emb.dtype
        stypes = inputs["semantic_types"].astype(jnp.int32)
        keep = ~inputs["is_padding"]
        is_null, is_target = inputs["is_null"], inputs["is_target"]
        valued = keep & ~is_null & ~is_target  # cells whose value is encoded (seed 002: target > null > value)

        def of(t: SemanticType) -> jax.Array:
            return valued & (stypes == int(t))

        def m(mask: jax.Array) -> jax.Array:
            return mask[..., None].astype(dt)

        # The frozen-table encoders (weights only; their biases join the learned vectors below).
        col = project_rows(self.column_name_encoder.weight, column_table, inputs["column_ids"], dt)
        cat = project_rows(self.categorical_encoder.weight, category_table, inputs["categorical_embed_ids"], dt)
        txt = project_rows(self.text_encoder.weight, inputs["text_batch_embeddings"], inputs["text_embed_ids"], dt)
        # Everything else is a learned row per cell, scaled by a coefficient computed from the inputs: the
        # numerical and timestamp encoders (value x weight + bias), the identifier, boolean, null and mask
        # embeddings and the three biases. One [B, S, K] x [K, D] product, whose gradient is a product too.
        is_bool = of(SemanticType.BOOLEAN)
        coef = jnp.concatenate([
            inputs["numeric_values"].astype(dt)[..., None] * m(of(SemanticType.NUMERICAL)),
            m(of(SemanticType.NUMERICAL)),
            inputs["timestamp_values"].astype(dt) * m(of(SemanticType.TIMESTAMP)),
            m(of(SemanticType.TIMESTAMP)),
            m(of(SemanticType.IDENTIFIER)),
            m(is_bool & ~inputs["bool_values"]),
            m(is_bool & inputs["bool_values"]),
            m(of(SemanticType.CATEGORICAL)),
            m(of(SemanticType.TEXT)),
            m(keep),
            m(keep & is_null & ~is_target),
            m(keep & is_target),
        ], axis=-1)
        rows = jnp.concatenate([
            self.numerical_encoder.weight, self.numerical_encoder.bias[None],
            self.timestamp_encoder.weight, self.timestamp_encoder.bias[None],
            self.identifier_emb[None], self.boolean_encoder,
            self.categorical_encoder.bias[None], self.text_encoder.bias[None], self.column_name_encoder.bias[None],
            self.null_emb[None], self.mask_emb[None],
        ], axis=0)
        h = (col * m(keep) + cat * m(of(SemanticType.CATEGORICAL)) + txt * m(of(SemanticType.TEXT))
             + matmul(coef, rows))
        if self.numeric_column_weight is not None:
            # x * (the column's own direction): numbers of different columns stay apart even when attention
            # averages the cells of a row, as categories (embedded with their column's name) already do
            xs = inputs["numeric_values"].astype(dt) * of(SemanticType.NUMERICAL).astype(dt)
            h = h + project_rows(self.numeric_column_weight, column_table, inputs["column_ids"], dt) * xs[..., None]
        if self.row_age_emb is not None:
            h = h + matmul((age_features(inputs["row_age"]) * m(keep)).astype(dt), self.row_age_emb)
        if self.child_rank_emb is not None:
            h = h + matmul(rank_buckets(inputs["child_rank"], dt) * m(keep), self.child_rank_emb)
        if self.arrival_weight is not None:
            # the foreign key the row came in through, by its column's name embedding, and which way: a match's
            # home and away team (two rows of one table, alike cell for cell) are told apart by it
            arrival = inputs["arrival"].astype(jnp.int32)
            came = keep & (arrival >= 0)
            fk = jnp.where(came, arrival >> 1, 0)
            as_child = (arrival & 1) == 1
            h = h + project_rows(self.arrival_weight, column_table, fk, dt) * m(came)
            h = h + matmul(jnp.stack([came & ~as_child, came & as_child], axis=-1).astype(dt), self.arrival_emb)
        return h
