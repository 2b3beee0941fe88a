"""Value encoding (seed 002): column-name encoder + six type encoders on the dense layout, null gating, target
masking (priority over null). Returns `col_enc + val_final` with padding zeroed; the transformer applies the h0
RMSNorm (kept outside so this module's parameters are exactly the seed's 203,264 at D = D_t = 256).

The categorical and text encoders are linear, so `Linear(table)[ids] == Linear(table[ids])`. We project the
(small, deduplicated) tables first and gather the projected rows: the same function as projecting the gathered
per-cell vectors, with fewer FLOPs (Vc or U rows instead of B*S) and no [B, S, D_t] intermediate.
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
        col_enc = self.column_name_encoder(column_table.astype(dt))[col_ids]  # [B, S, D]
        # The six type encoders, all evaluated on every position (dense layout).
        enc = {
            SemanticType.IDENTIFIER: jnp.broadcast_to(self.identifier_emb, col_enc.shape),
            SemanticType.NUMERICAL: self.numerical_encoder(inputs["numeric_values"].astype(dt)[..., None]),
            SemanticType.TIMESTAMP: self.timestamp_encoder(inputs["timestamp_values"].astype(dt)),
            SemanticType.BOOLEAN: self.boolean_encoder[inputs["bool_values"].astype(jnp.int32)],
            SemanticType.CATEGORICAL: self.categorical_encoder(category_table.astype(dt))[
                inputs["categorical_embed_ids"].astype(jnp.int32)
            ],
            SemanticType.TEXT: self.text_encoder(inputs["text_batch_embeddings"].astype(dt))[
                inputs["text_embed_ids"].astype(jnp.int32)
            ],
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
