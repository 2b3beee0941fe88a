"""The relational transformer: value encoding -> RMSNorm (h0) -> N blocks -> final RMSNorm -> decoder heads.

Parameters are float32 (master weights); the forward pass casts them to `ModelConfig.compute_dtype` (BF16 by
default) so activations and matmuls run in that dtype, while norms, QK-norm and softmax statistics use FP32.
"""

from __future__ import annotations

from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp

from confluence.model.attention import get_attention
from confluence.model.block import Block, Structure
from confluence.model.config import ModelConfig
from confluence.model.encoding import ValueEncoder
from confluence.model.heads import CopyHead, DecoderHeads, LinkHead, ModelOutput, TimeReference
from confluence.toolkit.layers import RMSNorm, cast_floating, run_layers


class RelationalTransformer(eqx.Module):
    encoder: ValueEncoder
    h0_norm: RMSNorm
    blocks: list[Block]
    final_norm: RMSNorm
    heads: DecoderHeads
    copy: CopyHead | None
    time_ref: TimeReference | None
    link: LinkHead | None
    cfg: ModelConfig = eqx.field(static=True)

    def __init__(self, cfg: ModelConfig, *, key: jax.Array):
        k_enc, k_blocks, k_heads = jax.random.split(key, 3)
        self.cfg = cfg
        self.encoder = ValueEncoder(cfg, key=k_enc)
        self.h0_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.blocks = [Block(cfg, key=k) for k in jax.random.split(k_blocks, cfg.n_layers)]
        self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.heads = DecoderHeads(cfg, key=k_heads)
        self.copy = (CopyHead(cfg.d_model, numbers=cfg.copy_numbers, key=jax.random.fold_in(key, 3))
                     if cfg.copy_head else None)
        self.time_ref = (TimeReference(cfg.d_model, key=jax.random.fold_in(key, 4),
                                       open_gate=cfg.time_reference_gate == "open", wait=cfg.time_wait)
                         if cfg.time_reference else None)
        self.link = LinkHead(cfg.d_model, key=jax.random.fold_in(key, 5)) if cfg.link_head else None

    def hidden(
        self, inputs: dict[str, jax.Array], column_table: jax.Array, category_table: jax.Array
    ) -> jax.Array:
        """The last block's output [B, S, D] in the compute dtype (before the final RMSNorm)."""
        return self._states(inputs, column_table, category_table)[1]

    def _states(
        self, inputs: dict[str, jax.Array], column_table: jax.Array, category_table: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """(h0, the last block's output), each [B, S, D] in the compute dtype: the cells as encoded (after the
        first RMSNorm, zero at padding) and as the blocks leave them."""
        inputs = {k: jnp.asarray(v) for k, v in inputs.items()}
        column_table, category_table = jnp.asarray(column_table), jnp.asarray(category_table)
        m = cast_floating(self, jnp.dtype(self.cfg.compute_dtype))
        attention = get_attention(self.cfg.attention_impl, kernel_heads=self.cfg.kernel_heads,
                                  kernel_warps=self.cfg.kernel_warps)
        keep = ~inputs["is_padding"][..., None]
        x = m.encoder(inputs, column_table, category_table)
        x = jnp.where(keep, m.h0_norm(x), jnp.zeros((), x.dtype))
        st = Structure.from_inputs(inputs, attention)  # permutations and masks: once per batch, not per layer
        return x, run_layers(m.blocks, x, lambda block, h: block(h, st, attention), scan=self.cfg.scan_layers,
                             remat=self.cfg.remat)

    def __call__(
        self, inputs: dict[str, jax.Array], column_table: jax.Array, category_table: jax.Array
    ) -> ModelOutput:
        """Forward pass on a device batch (see `confluence.model.inputs`) and the database's embedding tables: the
        five heads at every position (seed 004)."""
        m = cast_floating(self, jnp.dtype(self.cfg.compute_dtype))
        return m.heads(m.final_norm(self.hidden(inputs, column_table, category_table)))

    def at_targets(
        self, inputs: dict[str, jax.Array], column_table: jax.Array, category_table: jax.Array
    ) -> ModelOutput:
        """The heads at each sequence's target cell only: fields `[B]`, `[B, D_time]`, `[B, D]` (what the loss and
        prediction read). Equal to `__call__`'s outputs at those positions; the final norm and the heads run on
        B rows instead of B x S, and the gradient of the selection is dense (a one-hot contraction, no scatter)."""
        m = cast_floating(self, jnp.dtype(self.cfg.compute_dtype))
        inputs = {k: jnp.asarray(v) for k, v in inputs.items()}
        h = self.hidden(inputs, column_table, category_table)
        onehot = target_onehot(inputs["is_target"], h.dtype)
        h_t = jnp.einsum("bs,bsd->bd", onehot, h, preferred_element_type=jnp.float32).astype(h.dtype)
        hn_t = m.final_norm(h_t)
        out = m.heads(hn_t)
        if m.copy is None and m.time_ref is None:
            return out
        # the pointers' keys need every cell's final-normed state (the generating heads only the target's)
        hn = m.final_norm(h)
        if m.copy is not None:
            out = m.copy(out, hn, hn_t, inputs)
        if m.time_ref is not None:  # last: an open gate is the whole epoch (a context time plus an offset)
            out = m.time_ref(out, hn, hn_t, inputs)
        return out


    def link_states(
        self, inputs: dict[str, jax.Array], column_table: jax.Array, category_table: jax.Array, num_rows: int
    ) -> tuple[jax.Array, jax.Array]:
        """The question cell's final state [B, D] and every sequence-local row's mean final state over its real
        cells [B, num_rows, D] (float32): what the link head scores. With `cfg.link_values` each row's mean encoded
        state (its values) is added to its own, and the anchor row's (row 0) to the question."""
        m = cast_floating(self, jnp.dtype(self.cfg.compute_dtype))
        inputs = {k: jnp.asarray(v) for k, v in inputs.items()}
        h0, h = self._states(inputs, column_table, category_table)
        hn = m.final_norm(h)
        question = jnp.einsum("bs,bsd->bd", target_onehot(inputs["is_target"], hn.dtype), hn,
                              preferred_element_type=jnp.float32)
        member = jax.nn.one_hot(inputs["seq_row_ids"].astype(jnp.int32), num_rows, dtype=jnp.float32)
        member = member * (~inputs["is_padding"] & ~inputs["is_target"])[..., None]
        count = jnp.maximum(member.sum(axis=1), 1.0)[..., None]
        rows = jnp.einsum("bsr,bsd->brd", member, hn.astype(jnp.float32)) / count
        if self.cfg.link_values:
            values = jnp.einsum("bsr,bsd->brd", member, h0.astype(jnp.float32)) / count
            rows, question = rows + values, question + values[:, 0]
        return question, rows

    def link_scores(
        self, inputs: dict[str, jax.Array], column_table: jax.Array, category_table: jax.Array, num_rows: int
    ) -> jax.Array:
        """[B, num_rows] link logits: every sequence-local row's mean final state (over its real cells) scored
        against the target cell's by the link head. Needs `cfg.link_head`."""
        head = self._link_head()
        question, rows = self.link_states(inputs, column_table, category_table, num_rows)
        return head(question, rows)

    def link_queries(self, question: jax.Array) -> jax.Array:
        """[B, D]: questions (`link_states`) as the catalogue side reads them."""
        return self._link_head().queries(question)

    def catalogue_keys(
        self, inputs: dict[str, jax.Array], column_table: jax.Array, category_table: jax.Array
    ) -> jax.Array:
        """[B, D] float32: each sequence's anchor row (a target row in its own context) as a catalogue key."""
        head = self._link_head()
        _, rows = self.link_states(inputs, column_table, category_table, 1)
        return head.catalogue_keys(rows[:, 0])

    def _link_head(self) -> LinkHead:
        if self.link is None:
            raise ValueError("this model has no link head (model.link_head = false)")
        return self.link


def is_abstract_param(x: object) -> bool:
    """A floating-point leaf of an abstract model (`jax.eval_shape`): what a checkpoint's parameters fill in."""
    return isinstance(x, jax.ShapeDtypeStruct) and jnp.issubdtype(x.dtype, jnp.inexact)


def load_transformer(cfg: ModelConfig, checkpoint: Path) -> RelationalTransformer:
    """The model of `cfg` with the parameters of `checkpoint`, built without initialising it first (its random
    initialisation, op by op, took 6-9 s of every predict's start on a 2-core CPU; only shapes are needed)."""
    from confluence.toolkit.checkpoint import load_state

    abstract = eqx.filter_eval_shape(RelationalTransformer, cfg, key=jax.random.key(0))
    like, static = eqx.partition(abstract, is_abstract_param)
    params, _ = load_state(checkpoint, like)
    return eqx.combine(params, static)


def target_onehot(is_target: jax.Array, dtype) -> jax.Array:
    """[B, S] one-hot of each sequence's target position (the first True; position 0 when there is none, as the
    loss's argmax does)."""
    t = jnp.argmax(is_target, axis=1)
    return jax.nn.one_hot(t, is_target.shape[1], dtype=dtype)


def count_params(tree) -> int:
    """Number of scalar parameters in the floating-point array leaves of `tree`."""
    leaves = jax.tree.leaves(eqx.filter(tree, eqx.is_inexact_array))
    return int(sum(x.size for x in leaves))
