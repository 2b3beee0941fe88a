"""Attention over the three relational masks, behind one interface (seed 000 section 4, spec/training.md).

Interface shared by every implementation (the reference below and the block-sparse GPU kernel):

    fn(q, k, v, kind, row_ids, col_ids, is_padding, fk_adj) -> out

* `q`, `k`, `v`: [B, S, H, dh] already gathered into the sublayer's permuted order. `q` is already L2-normalised
  and multiplied by the learned per-head temperature, `k` is L2-normalised: logits are exactly `q . k`.
* `kind`: "outbound" | "inbound" | "column".
* `row_ids`, `col_ids` (int32) and `is_padding` (bool): [B, S], permuted the same way as q / k / v.
* `fk_adj`: [B, R, R] bool, indexed by sequence-local row id (not permuted).
* returns [B, S, H, dh] in the same permuted order; a query with no visible key gets exactly 0 (no NaN).

Masks (all AND-ed with ~pad[i] and ~pad[j]):
    outbound[i, j] = row[i] == row[j] or fk_adj[row[i], row[j]]
    inbound[i, j]  = fk_adj[row[j], row[i]]
    column[i, j]   = col[i] == col[j]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import jax
import jax.numpy as jnp

MaskKind = Literal["outbound", "inbound", "column"]
MASK_KINDS: tuple[MaskKind, ...] = ("outbound", "inbound", "column")

AttentionFn = Callable[..., jax.Array]


def dense_mask(
    kind: MaskKind, row_ids: jax.Array, col_ids: jax.Array, is_padding: jax.Array, fk_adj: jax.Array
) -> jax.Array:
    """The [B, S, S] boolean mask of one sublayer. Used only by the reference path (and tests)."""
    if kind == "column":
        m = col_ids[:, :, None] == col_ids[:, None, :]
    else:
        bidx = jnp.arange(row_ids.shape[0])[:, None, None]
        ri = row_ids[:, :, None]
        rj = row_ids[:, None, :]
        if kind == "outbound":
            m = (ri == rj) | fk_adj[bidx, ri, rj]
        elif kind == "inbound":
            m = fk_adj[bidx, rj, ri]
        else:
            raise ValueError(f"unknown attention kind {kind!r}; expected one of {MASK_KINDS}")
    valid = ~is_padding
    return m & valid[:, :, None] & valid[:, None, :]


def reference_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    kind: MaskKind,
    row_ids: jax.Array,
    col_ids: jax.Array,
    is_padding: jax.Array,
    fk_adj: jax.Array,
) -> jax.Array:
    """Dense masked softmax attention; FP32 logits and softmax statistics. Runs on any backend."""
    mask = dense_mask(kind, row_ids, col_ids, is_padding, fk_adj)  # [B, S, S]
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
    logits = jnp.where(mask[:, None, :, :], logits, -jnp.inf)
    row_max = jnp.max(logits, axis=-1, keepdims=True)
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
    p = jnp.exp(logits - row_max)  # exp(-inf) = 0 at masked positions
    denom = jnp.sum(p, axis=-1, keepdims=True)
    p = p / jnp.where(denom > 0, denom, 1.0)
    out = jnp.einsum("bhqk,bkhd->bqhd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return out.astype(v.dtype)


# --- Registry: the model picks its attention implementation by name (ModelConfig.attention_impl). ---------------
# "block_sparse" resolves lazily to `confluence.model.kernels.block_sparse_attention` (imported on first use, so the
# model has no hard dependency on Pallas); other implementations can be added with `register_attention`.

_ATTENTION_IMPLS: dict[str, AttentionFn] = {"reference": reference_attention}


def register_attention(name: str, fn: AttentionFn) -> None:
    """Make `fn` (same signature as `reference_attention`) selectable as `attention_impl=name`."""
    _ATTENTION_IMPLS[name] = fn


def get_attention(name: str) -> AttentionFn:
    """Resolve an attention implementation by name; raises ValueError listing the available ones.
    "auto" is the block-sparse kernel when the default backend is a GPU and the reference elsewhere."""
    if name == "auto":
        name = "block_sparse" if jax.default_backend() == "gpu" else "reference"
    if name == "block_sparse" and name not in _ATTENTION_IMPLS:
        from confluence.model.kernels import block_sparse_attention

        _ATTENTION_IMPLS[name] = block_sparse_attention
    try:
        return _ATTENTION_IMPLS[name]
    except KeyError:
        raise ValueError(f"unknown attention_impl {name!r}; available: {sorted(_ATTENTION_IMPLS)}") from None
