"""`TextTransformer` (seed 003): token embedding, encoder, predictor and decoder, batched over [B, L].

Every module is an Equinox module holding float32 parameters; `cast_floating` casts them to the compute dtype for
the forward pass. The layers are the toolkit's (`Linear` with [in, out] weights, zero-centered `RMSNorm`, `SwiGLU`),
so the optimizer routes every 2-D matrix except the embedding tables to Muon, as for the relational model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from confluence.errors import ConfigError, ConfluenceError
from confluence.toolkit.config import one_of, positive
from confluence.toolkit.layers import Linear, RMSNorm, SwiGLU


@dataclass(frozen=True)
class TextModelConfig:
    """Architecture of a `TextTransformer` (section `model` of a text run's tree). `vocab_size` and `max_seq_len`
    come from the prepared data (0: not set yet)."""

    vocab_size: int = 0
    max_seq_len: int = 0
    d_model: int = 256
    n_heads: int = 4
    n_layers: int = 4
    mlp_ratio: float = 4.0
    predictor_n_layers: int = 2
    decoder_n_layers: int = 1
    max_decoder_span: int = 16
    attn_type: Literal["pope", "rope"] = "pope"
    causal: bool = False
    drop_path_rate: float = 0.0
    rope_base: float = 10000.0
    pope_phase_bias: bool = True
    embed_norm: bool = False
    mask_token_input: bool = False

    def __post_init__(self) -> None:
        one_of("attn_type", self.attn_type, ("pope", "rope"))
        positive(self, "d_model", "n_heads", "n_layers", "mlp_ratio", "max_decoder_span", "rope_base")
        if self.vocab_size < 0 or self.max_seq_len < 0:
            raise ConfigError("vocab_size" if self.vocab_size < 0 else "max_seq_len", "must be >= 0 (0: from the data)")
        if self.d_model % self.n_heads:
            raise ConfigError("d_model", f"{self.d_model} is not divisible by n_heads {self.n_heads}")
        if self.attn_type == "rope" and (self.d_model // self.n_heads) % 2:
            raise ConfigError("attn_type", f"RoPE needs an even head dim, got {self.d_model // self.n_heads}")
        if self.predictor_n_layers < 0 or self.decoder_n_layers < 0:
            raise ConfigError("predictor_n_layers" if self.predictor_n_layers < 0 else "decoder_n_layers", "must be >= 0")
        if self.decoder_n_layers > 0 and self.predictor_n_layers == 0:
            raise ConfigError("decoder_n_layers", "the decoder cross-attends to predictor outputs: decoder_n_layers > 0 "
                                                  "needs predictor_n_layers > 0")
        if not 0.0 <= self.drop_path_rate < 1.0:
            raise ConfigError("drop_path_rate", f"must be in [0, 1), got {self.drop_path_rate}")


# ---------------------------------------------------------------------------------------------- layers


class TokenEmbedding(eqx.Module):
    """Embedding table [vocab, d_model]; `unembed` projects back to vocabulary logits with the same weights."""

    weight: jax.Array
    norm: RMSNorm | None

    def __init__(self, vocab_size: int, d_model: int, key: jax.Array, embed_norm: bool = False):
        self.weight = jax.random.normal(key, (vocab_size, d_model), jnp.float32) * 0.02
        self.norm = RMSNorm(d_model) if embed_norm else None

    def __call__(self, ids: jax.Array) -> jax.Array:
        x = jnp.take(self.weight, ids, axis=0)
        return self.norm(x) if self.norm is not None else x

    def unembed(self, x: jax.Array) -> jax.Array:
        """Logits x @ weight.T, computed in float32."""
        return x.astype(jnp.float32) @ self.weight.astype(jnp.float32).T


def _dense(d_in: int, d_out: int, key: jax.Array, scale: float = 1.0) -> Linear:
    """The text model's bias-free projection: normal init with std scale / sqrt(d_in)."""
    return Linear(d_in, d_out, key=key, use_bias=False, scale=scale, init="normal")


def _mlp(d: int, mlp_ratio: float, key: jax.Array) -> SwiGLU:
    """SwiGLU with hidden size mlp_ratio * d (seed 003), its output projection initialised at half scale."""
    return SwiGLU(d, max(1, int(round(d * mlp_ratio))), key=key, out_scale=0.5, init="normal")


# ---------------------------------------------------------------------------------------------- attention core


def rope_rotate(x: jax.Array, pos: jax.Array, base: float) -> jax.Array:
    """Rotary embedding of x [..., L, H, dh] at integer positions pos [..., L] (rotate-half convention)."""
    dh = x.shape[-1]
    half = dh // 2
    inv = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    ang = pos.astype(jnp.float32)[..., :, None, None] * inv  # [..., L, 1, half]
    cos, sin = jnp.cos(ang), jnp.sin(ang)
    xf = x.astype(jnp.float32)
    x1, x2 = xf[..., :half], xf[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).astype(x.dtype)


def pope_scores(q: jax.Array, k: jax.Array, qpos: jax.Array, kpos: jax.Array, base: float,
                delta: jax.Array | None) -> jax.Array:
    """PoPE logits [B, H, Lq, Lk] = Re(q^H k) / sqrt(dh) for q [B, Lq, H, dh], k [B, Lk, H, dh].

    Magnitudes are softplus of the projections; phases are position * theta_c with theta_c = base^(-c/dh), plus
    the per-head, per-frequency phase bias `delta` [H, dh] on keys. Two real matmuls (cos and sin parts).
    """
    dh = q.shape[-1]
    theta = base ** (-jnp.arange(dh, dtype=jnp.float32) / dh)
    mq = jax.nn.softplus(q.astype(jnp.float32))
    mk = jax.nn.softplus(k.astype(jnp.float32))
    pq = qpos.astype(jnp.float32)[:, :, None, None] * theta  # [B, Lq, 1, dh]
    pk = kpos.astype(jnp.float32)[:, :, None, None] * theta
    if delta is not None:
        pk = pk + delta.astype(jnp.float32)[None, None]
    dt = q.dtype
    qc, qs = (mq * jnp.cos(pq)).astype(dt), (mq * jnp.sin(pq)).astype(dt)
    kc, ks = (mk * jnp.cos(pk)).astype(dt), (mk * jnp.sin(pk)).astype(dt)
    s = jnp.einsum("bqhd,bkhd->bhqk", qc, kc, preferred_element_type=jnp.float32)
    s = s + jnp.einsum("bqhd,bkhd->bhqk", qs, ks, preferred_element_type=jnp.float32)
    return s / math.sqrt(dh)


def masked_attention(scores: jax.Array, v: jax.Array, allowed: jax.Array) -> jax.Array:
    """softmax(scores) over allowed keys @ v; scores [B, H, Lq, Lk] f32, v [B, Lk, H, dh], allowed [B, Lq, Lk].

    A query with no allowed key gets exactly 0. Returns [B, Lq, H, dh] in v's dtype.
    """
    allowed = allowed[:, None]
    s = jnp.where(allowed, scores, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    p = jnp.where(allowed, jnp.exp(s - m), 0.0)
    z = jnp.sum(p, axis=-1, keepdims=True)
    p = p / jnp.where(z > 0, z, 1.0)
    return jnp.einsum("bhqk,bkhd->bqhd", p.astype(v.dtype), v, preferred_element_type=jnp.float32).astype(v.dtype)


def attention_mask(key_visible: jax.Array, causal: bool, query_len: int | None = None) -> jax.Array:
    """allowed [B, Lq, Lk]: key visible, and key position <= query position when causal."""
    B, Lk = key_visible.shape
    Lq = Lk if query_len is None else query_len
    allowed = jnp.broadcast_to(key_visible[:, None, :], (B, Lq, Lk))
    if causal:
        allowed = allowed & (jnp.arange(Lk)[None, None, :] <= jnp.arange(Lq)[None, :, None])
    return allowed


class SelfAttention(eqx.Module):
    """Multi-head self-attention with RoPE or PoPE (PoPE with an optional learned phase bias `pope_delta`)."""

    wq: Linear
    wk: Linear
    wv: Linear
    wo: Linear
    pope_delta: jax.Array | None
    n_heads: int = eqx.field(static=True)
    attn_type: str = eqx.field(static=True)
    base: float = eqx.field(static=True)

    def __init__(self, d: int, n_heads: int, attn_type: str, base: float, phase_bias: bool, key: jax.Array):
        kq, kk, kv, ko, kd = jax.random.split(key, 5)
        self.wq, self.wk, self.wv = _dense(d, d, kq), _dense(d, d, kk), _dense(d, d, kv)
        self.wo = _dense(d, d, ko, scale=0.5)
        self.n_heads, self.attn_type, self.base = n_heads, attn_type, base
        dh = d // n_heads
        self.pope_delta = (
            jax.random.uniform(kd, (n_heads, dh), jnp.float32, -2 * math.pi, 0.0)
            if attn_type == "pope" and phase_bias
            else None
        )

    def __call__(self, x: jax.Array, pos: jax.Array, allowed: jax.Array) -> jax.Array:
        B, L, D = x.shape
        H = self.n_heads
        q = self.wq(x).reshape(B, L, H, D // H)
        k = self.wk(x).reshape(B, L, H, D // H)
        v = self.wv(x).reshape(B, L, H, D // H)
        if self.attn_type == "rope":
            q, k = rope_rotate(q, pos, self.base), rope_rotate(k, pos, self.base)
            s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) / math.sqrt(D // H)
        else:
            s = pope_scores(q, k, pos, pos, self.base, self.pope_delta)
        return self.wo(masked_attention(s, v, allowed).reshape(B, L, D))


class CrossAttention(eqx.Module):
    """Non-causal multi-head attention from x [B, Lq, D] to memory [B, Lm, D], no positional encoding."""

    wq: Linear
    wk: Linear
    wv: Linear
    wo: Linear
    mem_norm: RMSNorm
    n_heads: int = eqx.field(static=True)

    def __init__(self, d: int, n_heads: int, key: jax.Array):
        kq, kk, kv, ko = jax.random.split(key, 4)
        self.wq, self.wk, self.wv = _dense(d, d, kq), _dense(d, d, kk), _dense(d, d, kv)
        self.wo = _dense(d, d, ko, scale=0.5)
        self.mem_norm = RMSNorm(d)
        self.n_heads = n_heads

    def __call__(self, x: jax.Array, memory: jax.Array, memory_valid: jax.Array) -> jax.Array:
        B, Lq, D = x.shape
        Lm = memory.shape[1]
        H = self.n_heads
        mem = self.mem_norm(memory)
        q = self.wq(x).reshape(B, Lq, H, D // H)
        k = self.wk(mem).reshape(B, Lm, H, D // H)
        v = self.wv(mem).reshape(B, Lm, H, D // H)
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) / math.sqrt(D // H)
        return self.wo(masked_attention(s, v, attention_mask(memory_valid, False, Lq)).reshape(B, Lq, D))


def drop_path(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
    """Per-sample stochastic depth on a residual branch x [B, ...] (identity when key is None or rate is 0)."""
    if key is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, (x.shape[0],) + (1,) * (x.ndim - 1))
    return jnp.where(keep, x / (1.0 - rate), 0.0).astype(x.dtype)


class TextBlock(eqx.Module):
    """Pre-norm block: x + DropPath(attn(norm x)); [x + DropPath(cross(norm x, memory))]; x + DropPath(mlp(norm x))."""

    norm1: RMSNorm
    attn: SelfAttention
    norm_x: RMSNorm | None
    cross: CrossAttention | None
    norm2: RMSNorm
    mlp: SwiGLU
    drop_rate: float = eqx.field(static=True)

    def __init__(self, cfg: TextModelConfig, drop_rate: float, key: jax.Array, cross: bool = False):
        ka, kc, km = jax.random.split(key, 3)
        d = cfg.d_model
        self.norm1 = RMSNorm(d)
        self.attn = SelfAttention(d, cfg.n_heads, cfg.attn_type, cfg.rope_base, cfg.pope_phase_bias, ka)
        self.norm_x = RMSNorm(d) if cross else None
        self.cross = CrossAttention(d, cfg.n_heads, kc) if cross else None
        self.norm2 = RMSNorm(d)
        self.mlp = _mlp(d, cfg.mlp_ratio, km)
        self.drop_rate = drop_rate

    def __call__(self, x: jax.Array, pos: jax.Array, allowed: jax.Array, key: jax.Array | None,
                 memory: jax.Array | None = None, memory_valid: jax.Array | None = None) -> jax.Array:
        k1 = k2 = k3 = None
        if key is not None:
            k1, k2, k3 = jax.random.split(key, 3)
        x = x + drop_path(self.attn(self.norm1(x), pos, allowed), self.drop_rate, k1)
        if self.cross is not None:
            x = x + drop_path(self.cross(self.norm_x(x), memory, memory_valid), self.drop_rate, k2)
        return x + drop_path(self.mlp(self.norm2(x)), self.drop_rate, k3)


def _stack(cfg: TextModelConfig, n: int, key: jax.Array, cross: bool = False) -> list[TextBlock]:
    keys = jax.random.split(key, max(n, 1))
    rates = np.linspace(0.0, cfg.drop_path_rate, n) if n > 1 else np.full(n, cfg.drop_path_rate)
    return [TextBlock(cfg, float(rates[i]), keys[i], cross) for i in range(n)]


def _run(blocks: list[TextBlock], x: jax.Array, pos: jax.Array, allowed: jax.Array, key: jax.Array | None,
         **kw: Any) -> jax.Array:
    keys = jax.random.split(key, len(blocks)) if key is not None else [None] * len(blocks)
    for blk, k in zip(blocks, keys, strict=True):
        x = blk(x, pos, allowed, k, **kw)
    return x


def last_valid_index(visible: jax.Array) -> jax.Array:
    """Index of the last True position of each row of visible [B, L] (0 for an all-False row)."""
    L = visible.shape[1]
    return jnp.max(jnp.where(visible, jnp.arange(L)[None, :], 0), axis=1)


# ---------------------------------------------------------------------------------------------- the model


class TextTransformer(eqx.Module):
    """Encoder + predictor + decoder of seed 003 with tied token embeddings."""

    embed: TokenEmbedding
    encoder: list[TextBlock]
    final_norm: RMSNorm
    out_mlp: SwiGLU
    mask_pos_emb: jax.Array | None
    predictor: list[TextBlock]
    predictor_norm: RMSNorm | None
    decoder: list[TextBlock]
    decoder_norm: RMSNorm | None
    cfg: TextModelConfig = eqx.field(static=True)

    def __init__(self, cfg: TextModelConfig, key: jax.Array):
        if cfg.vocab_size < 1 or cfg.max_seq_len < 1:
            raise ConfigError("model.vocab_size", "vocab_size and max_seq_len come from the prepared data; got "
                                                  f"{cfg.vocab_size} and {cfg.max_seq_len}")
        ke, kenc, kmlp, kmask, kp, kd = jax.random.split(key, 6)
        self.cfg = cfg
        self.embed = TokenEmbedding(cfg.vocab_size, cfg.d_model, ke, cfg.embed_norm)
        self.encoder = _stack(cfg, cfg.n_layers, kenc)
        self.final_norm = RMSNorm(cfg.d_model)
        self.out_mlp = _mlp(cfg.d_model, cfg.mlp_ratio, kmlp)
        has_pred = cfg.predictor_n_layers > 0
        self.mask_pos_emb = (
            jax.random.normal(kmask, (cfg.max_seq_len, cfg.d_model), jnp.float32) * 0.02 if has_pred else None
        )
        self.predictor = _stack(cfg, cfg.predictor_n_layers, kp)
        self.predictor_norm = RMSNorm(cfg.d_model) if has_pred else None
        self.decoder = _stack(cfg, cfg.decoder_n_layers, kd, cross=True)
        self.decoder_norm = RMSNorm(cfg.d_model) if cfg.decoder_n_layers > 0 else None

    def encode(self, tokens: jax.Array, visible: jax.Array, key: jax.Array | None = None) -> dict[str, jax.Array]:
        """Run the encoder on tokens [B, L] whose attention-visible positions are `visible` [B, L].

        Invisible positions are neither keys nor values, their attention outputs are 0 and their input embedding is
        zeroed (so their representations carry no token identity). Returns `pre` (pre-final-norm tokens), `post`
        (post-final-norm), `out` (post + extra SwiGLU, the predictor's input), `pooled_pre` and `pooled` (the
        pre/post-final-norm representation at the last visible position), all [B, L, D] / [B, D].
        """
        B, L = tokens.shape
        pos = jnp.broadcast_to(jnp.arange(L)[None, :], (B, L))
        x = self.embed(tokens)
        x = jnp.where(visible[..., None], x, 0).astype(x.dtype)
        allowed = attention_mask(visible, self.cfg.causal) & visible[:, :, None]
        pre = _run(self.encoder, x, pos, allowed, key)
        post = self.final_norm(pre)
        out = post + self.out_mlp(post)
        idx = last_valid_index(visible)
        take = jax.vmap(lambda a, i: a[i])
        return {"pre": pre, "post": post, "out": out, "pooled_pre": take(pre, idx), "pooled": take(post, idx)}

    def predict(self, enc_out: jax.Array, masked: jax.Array, valid: jax.Array,
                key: jax.Array | None = None) -> jax.Array:
        """Predictor outputs [B, L, D] before its final norm; masked positions enter as learned position embeddings."""
        if not self.predictor:
            raise ConfluenceError("this model has no predictor (predictor_n_layers = 0)")
        B, L, _ = enc_out.shape
        pos = jnp.broadcast_to(jnp.arange(L)[None, :], (B, L))
        x = jnp.where(masked[..., None], self.mask_pos_emb[None, :L].astype(enc_out.dtype), enc_out)
        allowed = attention_mask(valid, self.cfg.causal) & valid[:, :, None]
        return _run(self.predictor, x, pos, allowed, key)

    def decode(self, dec_tokens: jax.Array, dec_valid: jax.Array, memory: jax.Array, memory_valid: jax.Array,
               key: jax.Array | None = None) -> jax.Array:
        """Decoder logits [N, T, vocab] (float32): causal self-attention over tied-embedded dec_tokens [N, T] plus
        cross-attention over memory [N, Lm, D] (predictor outputs of one masked span)."""
        if not self.decoder:
            raise ConfluenceError("this model has no decoder (decoder_n_layers = 0)")
        N, T = dec_tokens.shape
        pos = jnp.broadcast_to(jnp.arange(T)[None, :], (N, T))
        x = self.embed(dec_tokens).astype(memory.dtype)
        allowed = attention_mask(dec_valid, True)
        h = _run(self.decoder, x, pos, allowed, key, memory=memory, memory_valid=memory_valid)
        return self.embed.unembed(self.decoder_norm(h))
