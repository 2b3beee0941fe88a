"""The relational transformer: value encoding -> RMSNorm (h0) -> N blocks -> final RMSNorm -> decoder heads.

Parameters are float32 (master weights); the forward pass casts them to `ModelConfig.compute_dtype` (BF16 by
default) so activations and matmuls run in that dtype, while norms, QK-norm and softmax statistics use FP32.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from confluence.model.attention import get_attention
from confluence.model.block import Block, Structure
from confluence.model.config import ModelConfig
from confluence.model.encoding import ValueEncoder
from confluence.model.heads import DecoderHeads, ModelOutput
from confluence.toolkit.layers import RMSNorm, cast_floating


class RelationalTransformer(eqx.Module):
    encoder: ValueEncoder
    h0_norm: RMSNorm
    blocks: list[Block]
    final_norm: RMSNorm
    heads: DecoderHeads
    cfg: ModelConfig = eqx.field(static=True)

    def __init__(self, cfg: ModelConfig, *, key: jax.Array):
        k_enc, k_blocks, k_heads = jax.random.split(key, 3)
        self.cfg = cfg
        self.encoder = ValueEncoder(cfg, key=k_enc)
        self.h0_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.blocks = [Block(cfg, key=k) for k in jax.random.split(k_blocks, cfg.n_layers)]
        self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.heads = DecoderHeads(cfg, key=k_heads)

    def __call__(
        self, inputs: dict[str, jax.Array], column_table: jax.Array, category_table: jax.Array
    ) -> ModelOutput:
        """Forward pass on a device batch (see `confluence.model.inputs`) and the database's embedding tables."""
        inputs = {k: jnp.asarray(v) for k, v in inputs.items()}
        column_table, category_table = jnp.asarray(column_table), jnp.asarray(category_table)
        m = cast_floating(self, jnp.dtype(self.cfg.compute_dtype))
        attn_fn = get_attention(self.cfg.attention_impl)
        keep = ~inputs["is_padding"][..., None]
        x = m.encoder(inputs, column_table, category_table)
        x = jnp.where(keep, m.h0_norm(x), jnp.zeros((), x.dtype))
        st = Structure.from_inputs(inputs)
        for block in m.blocks:
            if self.cfg.remat:
                x = eqx.filter_checkpoint(lambda b, x, st: b(x, st, attn_fn))(block, x, st)
            else:
                x = block(x, st, attn_fn)
        return m.heads(m.final_norm(x))


def count_params(tree) -> int:
    """Number of scalar parameters in the floating-point array leaves of `tree`."""
    leaves = jax.tree.leaves(eqx.filter(tree, eqx.is_inexact_array))
    return int(sum(x.size for x in leaves))
