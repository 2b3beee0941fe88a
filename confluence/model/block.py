"""The transformer block (seed 001): three gated attention sublayers (outbound, inbound, column) + SwiGLU FFN.

Each attention sublayer: permute -> Q/K/V projections -> QK L2-norm with a learned per-head temperature
(initialised to sqrt(d_head)) -> masked multi-head attention (pluggable implementation) -> unpermute -> W_O, then
multiplied by sigmoid(x_norm @ W_gate). No biases in any core layer.
"""

from __future__ import annotations

import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from confluence.model.attention import Attention, MaskKind
from confluence.model.config import ModelConfig
from confluence.toolkit.layers import RMSNorm, SwiGLU, matmul, split, split_last, xavier_uniform

PERM_FIELD: dict[str, str] = {"outbound": "out_perm", "inbound": "in_perm", "column": "col_perm"}


def _l2norm(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    x32 = x.astype(jnp.float32)
    return x32 * jax.lax.rsqrt(jnp.sum(x32 * x32, axis=-1, keepdims=True) + eps)


@jax.custom_vjp
def scaled_l2norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    """`scale[h] * x / |x|` over the last axis of `x` [..., H, dh] (FP32 inside, result in x's dtype): the QK norm
    with the learned temperatures, queries and keys together. The gradient is written out; the scale's is a
    matrix-vector product over the positions (autodiff's reduction over all cells runs windowed and slow on XLA's
    CPU backend)."""
    return (_l2norm(x) * scale.astype(jnp.float32)[:, None]).astype(x.dtype)


def _scaled_l2norm_fwd(x, scale):
    return scaled_l2norm(x, scale), (x, scale)


def _scaled_l2norm_bwd(res, g):
    x, scale = res
    x32 = x.astype(jnp.float32)
    r = jax.lax.rsqrt(jnp.sum(x32 * x32, axis=-1, keepdims=True) + 1e-6)
    xh = x32 * r
    g32 = g.astype(jnp.float32)
    gs = g32 * scale.astype(jnp.float32)[:, None]
    dx = r * (gs - xh * jnp.sum(gs * xh, axis=-1, keepdims=True))
    per_head = jnp.sum(g32 * xh, axis=-1).reshape(-1, x.shape[-2])  # [cells, H]
    dscale = jnp.matmul(jnp.ones((1, per_head.shape[0]), jnp.float32), per_head)[0]
    return dx.astype(x.dtype), dscale.astype(scale.dtype)


scaled_l2norm.defvjp(_scaled_l2norm_fwd, _scaled_l2norm_bwd)


def inverse_permutation(perm: jax.Array) -> jax.Array:
    """inv[b, perm[b, i]] = i, computed on the device in O(S)."""
    b, s = perm.shape
    iota = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
    return jnp.zeros((b, s), jnp.int32).at[jnp.arange(b)[:, None], perm].set(iota)


def _gather_seq(x: jax.Array, idx: jax.Array) -> jax.Array:
    """x[b, idx[b, i], ...] for x of shape [B, S, ...]."""
    idx = idx.reshape(idx.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, idx, axis=1)


@jax.custom_vjp
def permute(x: jax.Array, perm: jax.Array, inv: jax.Array) -> jax.Array:
    """x[b, perm[b, i]] along the sequence axis, `inv` being perm's inverse. The gradient of a gather is a scatter-
    add; for a permutation it is the inverse permutation's gather, which is what the backward pass runs."""
    return _gather_seq(x, perm)


def _permute_fwd(x, perm, inv):
    return _gather_seq(x, perm), (perm, inv)


def _permute_bwd(res, g):
    perm, inv = res
    return _gather_seq(g, inv), None, None


permute.defvjp(_permute_fwd, _permute_bwd)


class KindStructure(eqx.Module):
    """One attention kind's share of a batch's structure: its permutation and the inverse (None when the attention
    implementation works in any order), and what the implementation prepared for it (once per batch, shared by
    every layer)."""

    perm: jax.Array | None
    inv: jax.Array | None
    prepared: Any


class Structure(eqx.Module):
    """Per-batch structure shared by all layers, one `KindStructure` per attention kind."""

    kinds: dict[str, KindStructure]

    @classmethod
    def from_inputs(cls, inputs: dict[str, jax.Array], attention: Attention) -> Structure:
        row_ids = inputs["seq_row_ids"].astype(jnp.int32)
        col_ids = inputs["column_ids"].astype(jnp.int32)
        kinds = {}
        for kind, field in PERM_FIELD.items():
            if not attention.permuted:
                prepared = attention.prepare(kind, row_ids, col_ids, inputs["is_padding"], inputs["fk_adj"])
                kinds[kind] = KindStructure(None, None, prepared)
                continue
            perm = inputs[field].astype(jnp.int32)
            prepared = attention.prepare(
                kind, _gather_seq(row_ids, perm), _gather_seq(col_ids, perm), _gather_seq(inputs["is_padding"], perm),
                inputs["fk_adj"],
            )
            kinds[kind] = KindStructure(perm, inverse_permutation(perm), prepared)
        return cls(kinds)


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

    def __call__(self, x_norm: jax.Array, st: Structure, attention: Attention) -> jax.Array:
        b, s, d = x_norm.shape
        h = self.n_heads
        ks = st.kinds[self.kind]
        # Q, K, V and the gate in one matmul (the per-position projection commutes with the permutation).
        w = jnp.concatenate([self.w_q, self.w_k, self.w_v, self.w_gate], axis=1)
        qkv, gate = split_last(matmul(x_norm, w), (3 * d, d))
        if ks.perm is not None:
            qkv = permute(qkv, ks.perm, ks.inv)
        qk, v = split_last(qkv, (2 * d, d))
        # QK norm of queries (times the temperatures) and keys at once: heads 0..H-1 are queries, H..2H-1 keys
        scale = jnp.concatenate([self.temperature, jnp.ones_like(self.temperature)])
        q, k = split(scaled_l2norm(qk.reshape(b, s, 2 * h, d // h), scale), (h, h), axis=2)
        v = v.reshape(b, s, h, d // h)
        o = attention.attend(q, k, v, self.kind, ks.prepared)
        o = o.reshape(b, s, d).astype(x_norm.dtype)
        if ks.perm is not None:
            o = permute(o, ks.inv, ks.perm)  # unpermute
        return matmul(o, self.w_o) * jax.nn.sigmoid(gate)


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

    def __call__(self, x: jax.Array, st: Structure, attention: Attention) -> jax.Array:
        x = x + self.attn_out(self.norm_out(x), st, attention)
        x = x + self.attn_in(self.norm_in(x), st, attention)
        x = x + self.attn_col(self.norm_col(x), st, attention)
        return x + self.ffn(self.norm_ffn(x))
