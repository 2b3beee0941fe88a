"""The transformer block (seed 001): three gated attention sublayers (outbound, inbound, column) + SwiGLU FFN.

Each attention sublayer: permute -> Q/K/V projections -> QK L2-norm with a learned per-head temperature
(initialised to sqrt(d_head)) -> masked multi-head attention (pluggable implementation) -> unpermute -> W_O, then
multiplied by sigmoid(x_norm @ W_gate). No biases in any core layer.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from confluence.model.attention import Attention, MaskKind
from confluence.model.config import ModelConfig
from confluence.toolkit.layers import HIGHEST, RMSNorm, SwiGLU, matmul, split_last, xavier_uniform

PERM_FIELD: dict[str, str] = {"outbound": "out_perm", "inbound": "in_perm", "column": "col_perm"}


def _l2norm(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    x32 = x.astype(jnp.float32)
    return x32 * jax.lax.rsqrt(jnp.sum(x32 * x32, axis=-1, keepdims=True) + eps)


def _head_sums(x: jax.Array, heads: int) -> jax.Array:
    """[..., H * dh] -> [..., H]: the sum over each head's dh channels, as a product with a 0 / 1 matrix (XLA's CPU
    backend runs a reduction over a short last axis several times slower than this small matmul)."""
    return jnp.matmul(x, _head_matrix(heads, x.shape[-1] // heads).T, precision=HIGHEST)


def _per_channel(x: jax.Array, dh: int) -> jax.Array:
    """[..., H] -> [..., H * dh]: each head's value repeated over its channels, as a product too."""
    return jnp.matmul(x, _head_matrix(x.shape[-1], dh), precision=HIGHEST)


def _head_matrix(heads: int, dh: int) -> jax.Array:
    return jnp.repeat(jnp.eye(heads, dtype=jnp.float32), dh, axis=1)  # [H, H * dh]


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def scaled_l2norm(x: jax.Array, scale: jax.Array, eps: float = 1e-6) -> jax.Array:
    """`scale[h] * x_h / |x_h|` for each head h of `x` [..., H * dh] (`scale` [H]), FP32 inside, in x's dtype: the
    QK norm with the learned temperatures, for queries and keys at once. Sums over a head's channels are small
    matmuls and the gradient is written out (the scale's a matrix-vector product over the positions, where
    autodiff's reduction over all cells runs windowed and slow on XLA's CPU backend)."""
    x32 = x.astype(jnp.float32)
    r = jax.lax.rsqrt(_head_sums(x32 * x32, scale.shape[0]) + eps)
    return (x32 * _per_channel(r * scale.astype(jnp.float32), x.shape[-1] // scale.shape[0])).astype(x.dtype)


def _scaled_l2norm_fwd(x, scale, eps):
    return scaled_l2norm(x, scale, eps), (x, scale)


def _scaled_l2norm_bwd(eps, res, g):
    x, scale = res
    h = scale.shape[0]
    dh = x.shape[-1] // h
    x32, g32, s32 = x.astype(jnp.float32), g.astype(jnp.float32), scale.astype(jnp.float32)
    r = jax.lax.rsqrt(_head_sums(x32 * x32, h) + eps)  # [..., H]
    gx = _head_sums(g32 * x32, h)  # [..., H]
    # y = s r x  =>  dx = s r g - s r^3 (g . x) x;  ds = sum over positions of r (g . x)
    dx = _per_channel(s32 * r, dh) * g32 - _per_channel(s32 * r**3 * gx, dh) * x32
    rgx = (r * gx).reshape(-1, h)
    dscale = jnp.matmul(jnp.ones((1, rgx.shape[0]), jnp.float32), rgx, precision=HIGHEST)[0]
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
    sink: jax.Array | None  # [H] learned sink logits (ModelConfig.attention_sink), None without
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
        self.sink = jnp.zeros((cfg.n_heads,), jnp.float32) if kind in cfg.attention_sink else None
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
        q, k, v = (x.reshape(b, s, h, d // h) for x in (*split_last(scaled_l2norm(qk, scale), (d, d)), v))
        if self.sink is None:
            o = attention.attend(q, k, v, self.kind, ks.prepared)
        else:
            o = attention.attend(q, k, v, self.kind, ks.prepared, sink=self.sink)
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
