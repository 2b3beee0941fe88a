"""Value encoding (seed 002): column-name encoder + six type encoders on the dense layout, null gating, target
masking (priority over null). Returns `col_enc + val_final` with padding zeroed; the transformer applies the h0
RMSNorm (kept outside so this module's parameters are exactly the seed's 203,264 at D = D_t = 256).

The column-name, categorical and text encoders are `Linear(table[ids])` (seed 002) on a frozen table. Which of two
equal forms runs depends on the table's size, and neither has a scatter in its gradient: a table of at most D_t
rows is projected first and its rows picked by a one-hot contraction (B x S x V x D work, the gradient a dense
matmul); a larger one has each cell's frozen row gathered (no gradient: the table is an input) and projected
(B x S x D_t x D). Gathering rows of a projected table, the cheapest forward, has as gradient a scatter-add of all
B x S cells into the few rows of the table, which serialises on a GPU's atomics (docs/decisions.md, "Training
speed"). The boolean embedding is a select between its two rows for the same reason.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from confluence.model.config import ModelConfig
from confluence.stypes import SemanticType
from confluence.toolkit.layers import Linear, normal_init

ENCODED_STYPES = (
    SemanticType.IDENTIFIER,
    SemanticType.NUMERICAL,
    SemanticType.TIMESTAMP,
    SemanticType.BOOLEAN,
    SemanticType.CATEGORICAL,
    SemanticType.TEXT,
)


def embed_rows(linear: Linear, table: jax.Array, ids: jax.Array, dtype) -> jax.Array:
    """`linear(table[ids])` [B, S, D] for a frozen table [V, D_t], in `dtype`, with a gradient free of scatters
    (module doc): a one-hot contraction with the projected table when V <= D_t, else a gather and a projection."""
    table = jax.lax.stop_gradient(table).astype(dtype)
    ids = ids.astype(jnp.int32)
    if table.shape[0] <= table.shape[1]:
        onehot = jax.nn.one_hot(ids, table.shape[0], dtype=dtype)
        return jnp.einsum("...v,vd->...d", onehot, linear(table), preferred_element_type=jnp.float32).astype(dtype)
    return linear(table[ids])


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

    def __init__(self, cfg: ModelConfig, *, key: jax.Array):
        k = jax.random.split(key, 9)
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

    def __call__(self, inputs: dict[str, jax.Array], column_table: jax.Array, category_table: jax.Array) -> jax.Array:
        dt = self.identifier_emb.dtype
        stypes = inputs["semantic_types"].astype(jnp.int32)
        col_ids = inputs["column_ids"].astype(jnp.int32)
        # Column identity: frozen table row -> Linear(D_t, D).
        col_enc = embed_rows(self.column_name_encoder, column_table, col_ids, dt)  # [B, S, D]
        # The six type encoders, all evaluated on every position (dense layout).
        enc = {
            SemanticType.IDENTIFIER: jnp.broadcast_to(self.identifier_emb, col_enc.shape),
            SemanticType.NUMERICAL: self.numerical_encoder(inputs["numeric_values"].astype(dt)[..., None]),
            SemanticType.TIMESTAMP: self.timestamp_encoder(inputs["timestamp_values"].astype(dt)),
            SemanticType.BOOLEAN: jnp.where(
                inputs["bool_values"][..., None], self.boolean_encoder[1], self.boolean_encoder[0]
            ),
            SemanticType.CATEGORICAL: embed_rows(
                self.categorical_encoder, category_table, inputs["categorical_embed_ids"], dt
            ),
            SemanticType.TEXT: embed_rows(self.text_encoder, inputs["text_batch_embeddings"], inputs["text_embed_ids"], dt),
        }
        raw_val = jnp.zeros_like(col_enc)
        for t in ENCODED_STYPES:  # sum_t one_hot(stype, t) * encoder_t(values)
            raw_val = raw_val + (stypes == int(t))[..., None].astype(dt) * enc[t]
        is_null = inputs["is_null"][..., None]
        is_target = inputs["is_target"][..., None]
        val = jnp.where(is_null, self.null_emb, raw_val)  # null gating
        val = jnp.where(is_target, self.mask_emb, val)  # target masking takes priority
        keep = ~inputs["is_padding"][..., None]
        return jnp.where(keep, col_enc + val, jnp.zeros((), dt))  # padding: both encodings zeroed
