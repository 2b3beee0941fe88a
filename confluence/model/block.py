"""The transformer block (seed 001): three gated attention sublayers (outbound, inbound, column) + SwiGLU FFN.

Each attention sublayer: permute -> Q/K/V projections -> QK L2-norm with a learned per-head temperature
(initialised to sqrt(d_head)) -> masked multi-head attention (pluggable implementation) -> unpermute -> W_O, then
multiplied by sigmoid(x_norm @ W_gate). No biases in any core layer.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp

from confluence.model.attention import AttentionFn, MaskKind
from confluence.model.config import ModelConfig
from confluence.toolkit.layers import RMSNorm, SwiGLU, xavier_uniform

PERM_FIELD: dict[str, str] = {"outbound": "out_perm", "inbound": "in_perm", "column": "col_perm"}


def _l2norm(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    x32 = x.astype(jnp.float32)
    return x32 * jax.lax.rsqrt(jnp.sum(x32 * x32, axis=-1, keepdims=True) + eps)


def inverse_permutation(perm: jax.Array) -> jax.Array:
    """inv[b, perm[b, i]] = i, computed on the device in O(S)."""
    b, s = perm.shape
    iota = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
    return jnp.zeros((b, s), jnp.int32).at[jnp.arange(b)[:, None], perm].set(iota)


def _gather_seq(x: jax.Array, idx: jax.Array) -> jax.Array:
    """x[b, idx[b, i], ...] for x of shape [B, S, ...]."""
    idx = idx.reshape(idx.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, idx, axis=1)


class Structure(eqx.Module):
    """Per-batch structure shared by all layers: ids, padding, adjacency, permutations and their inverses."""

    row_ids: jax.Array
    col_ids: jax.Array
    is_padding: jax.Array
    fk_adj: jax.Array
    perms: dict[str, jax.Array]
    inv_perms: dict[str, jax.Array]

    @classmethod
    def from_inputs(cls, inputs: dict[str, jax.Array]) -> Structure:
        perms = {kind: inputs[f].astype(jnp.int32) for kind, f in PERM_FIELD.items()}
        return cls(
            row_ids=inputs["seq_row_ids"].astype(jnp.int32),
            col_ids=inputs["column_ids"].astype(jnp.int32),
            is_padding=inputs["is_padding"],
            fk_adj=inputs["fk_adj"],
            perms=perms,
            inv_perms={k: inverse_permutation(p) for k, p in perms.items()},
        )


class GatedAttention(eqx.Module):
    """One attention sublayer of kind outbound / inbound / column, with SDPA output gating."""

    w_q: jax.Array
    w_k: jax.Array
    w_v: jax.Array
    w_o: jax.Array
    w_gate: jax.Array
    temperature: jax.Array  # [H], initialised to sqrt(d_head)
    kind: MaskKind = eqx.field(static=True)
    n_heads: int = eqx.field(static=True)

    def __init__(self, cfg: ModelConfig, kind: MaskKind, *, key: jax.Array):
        k = jax.random.split(key, 5)
        d = cfg.d_model
        self.w_q = xavier_uniform(k[0], d, d)
        self.w_k = xavier_uniform(k[1], d, d)
        self.w_v = xavier_uniform(k[2], d, d)
        self.w_o = xavier_uniform(k[3], d, d, scale=1.0 / math.sqrt(4 * cfg.n_layers))
        self.w_gate = xavier_uniform(k[4], d, d)
        self.temperature = jnp.full((cfg.n_heads,), math.sqrt(cfg.d_head), jnp.float32)
        self.kind = kind
        self.n_heads = cfg.n_heads

    def __call__(self, x_norm: jax.Array, st: Structure, attn_fn: AttentionFn) -> jax.Array:
        b, s, d = x_norm.shape
        h = self.n_heads
        perm, inv = st.perms[self.kind], st.inv_perms[self.kind]
        xp = _gather_seq(x_norm, perm)  # permute
        q = (xp @ self.w_q).reshape(b, s, h, d // h)
        k = (xp @ self.w_k).reshape(b, s, h, d // h)
        v = (xp @ self.w_v).reshape(b, s, h, d // h)
        q = (_l2norm(q) * self.temperature.astype(jnp.float32)[:, None]).astype(x_norm.dtype)
        k = _l2norm(k).astype(x_norm.dtype)
        o = attn_fn(
            q, k, v, self.kind, _gather_seq(st.row_ids, perm), _gather_seq(st.col_ids, perm),
            _gather_seq(st.is_padding, perm), st.fk_adj,
        )
        o = _gather_seq(o.reshape(b, s, d).astype(x_norm.dtype), inv)  # unpermute
        gate = jax.nn.sigmoid(x_norm @ self.w_gate)
        return (o @ self.w_o) * gate


class Block(eqx.Module):
    """Pre-norm: x += GA_out(N(x)); x += GA_in(N(x)); x += GA_col(N(x)); x += FFN(N(x))."""

    norm_out: RMSNorm
    attn_out: GatedAttention
    norm_in: RMSNorm
    attn_in: GatedAttention
    norm_col: RMSNorm
    attn_col: GatedAttention
    norm_ffn: RMSNorm
    ffn: SwiGLU

    def __init__(self, cfg: ModelConfig, *, key: jax.Array):
        k = jax.random.split(key, 4)
        self.norm_out, self.norm_in, self.norm_col, self.norm_ffn = (RMSNorm(cfg.d_model, cfg.norm_eps) for _ in range(4))
        self.attn_out = GatedAttention(cfg, "outbound", key=k[0])
        self.attn_in = GatedAttention(cfg, "inbound", key=k[1])
        self.attn_col = GatedAttention(cfg, "column", key=k[2])
        self.ffn = SwiGLU(cfg.d_model, cfg.d_ff, key=k[3], out_scale=1.0 / math.sqrt(4 * cfg.n_layers))

    def __call__(self, x: jax.Array, st: Structure, attn_fn: AttentionFn) -> jax.Array:
        x = x + self.attn_out(self.norm_out(x), st, attn_fn)
        x = x + self.attn_in(self.norm_in(x), st, attn_fn)
        x = x + self.attn_col(self.norm_col(x), st, attn_fn)
        return x + self.ffn(self.norm_ffn(x))
