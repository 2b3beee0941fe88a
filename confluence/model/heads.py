"""Decoder heads (seed 004): all five run on every position; `ModelOutput` holds their dense outputs."""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax

from confluence.model.config import ModelConfig
from confluence.toolkit.layers import Linear


class ModelOutput(NamedTuple):
    """Dense outputs of the forward pass (seed 004). Float32 regardless of the compute dtype."""

    h: jax.Array  # [B, S, D] final hidden states (after the final RMSNorm)
    null_logits: jax.Array  # [B, S]
    num_preds: jax.Array  # [B, S] z-score scale
    bool_logits: jax.Array  # [B, S]
    ts_preds: jax.Array  # [B, S, D_time]
    cat_preds: jax.Array  # [B, S, D] in the space of `categorical_encoder`


class DecoderHeads(eqx.Module):
    null_head: Linear
    numerical_decoder: Linear
    boolean_decoder: Linear
    timestamp_decoder: Linear
    categorical_decoder: Linear

    def __init__(self, cfg: ModelConfig, *, key: jax.Array):
        k = jax.random.split(key, 5)
        d = cfg.d_model
        self.null_head = Linear(d, 1, key=k[0])
        self.numerical_decoder = Linear(d, 1, key=k[1])
        self.boolean_decoder = Linear(d, 1, key=k[2])
        self.timestamp_decoder = Linear(d, cfg.d_time, key=k[3])
        self.categorical_decoder = Linear(d, d, key=k[4])

    def __call__(self, h: jax.Array) -> ModelOutput:
        f32 = jax.numpy.float32
        return ModelOutput(
            h=h.astype(f32),
            null_logits=self.null_head(h)[..., 0].astype(f32),
            num_preds=self.numerical_decoder(h)[..., 0].astype(f32),
            bool_logits=self.boolean_decoder(h)[..., 0].astype(f32),
            ts_preds=self.timestamp_decoder(h).astype(f32),
            cat_preds=self.categorical_decoder(h).astype(f32),
        )
