"""RoPE / PoPE attention against direct per-position computations; masking, causality, DropPath schedule."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from confluence.textmodel.model import (
    SelfAttention,
    TextModelConfig,
    TextTransformer,
    attention_mask,
    masked_attention,
    pope_scores,
    rope_rotate,
)

jax.config.update("jax_enable_x64", False)


def _direct_attention(q, k, v, allowed, score_fn):
    """Loop over batch, head, query: softmax over allowed keys of score_fn(b, h, i, j); 0 with no allowed key."""
    B, L, H, dh = q.shape
    out = np.zeros((B, L, H, dh))
    for b in range(B):
        for h in range(H):
            for i in range(L):
                keys = [j for j in range(L) if allowed[b, i, j]]
                if not keys:
                    continue
                s = np.array([score_fn(b, h, i, j) for j in keys])
                p = np.exp(s - s.max())
                p /= p.sum()
                out[b, i, h] = sum(pj * v[b, j, h] for pj, j in zip(p, keys, strict=True))
    return out


def _rand(shape, seed):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def test_rope_attention_matches_rotation_matrices() -> None:
    B, L, H, dh, base = 2, 7, 2, 6, 100.0
    q, k, v = _rand((B, L, H, dh), 0), _rand((B, L, H, dh), 1), _rand((B, L, H, dh), 2)
    pos = np.tile(np.arange(L), (B, 1))
    visible = np.ones((B, L), bool)
    visible[1, 5:] = False
    allowed = np.asarray(attention_mask(jnp.asarray(visible), True))
    half = dh // 2

    def rot(x, p):  # explicit 2x2 rotation of pairs (c, c + half) by angle p * base^(-c/half)
        y = np.zeros_like(x, dtype=np.float64)
        for c in range(half):
            a = p * base ** (-c / half)
            y[c] = math.cos(a) * x[c] - math.sin(a) * x[c + half]
            y[c + half] = math.sin(a) * x[c] + math.cos(a) * x[c + half]
        return y

    ref = _direct_attention(q, k, v, allowed,
                            lambda b, h, i, j: rot(q[b, i, h], i) @ rot(k[b, j, h], j) / math.sqrt(dh))
    qr, kr = rope_rotate(jnp.asarray(q), jnp.asarray(pos), base), rope_rotate(jnp.asarray(k), jnp.asarray(pos), base)
    s = jnp.einsum("bqhd,bkhd->bhqk", qr, kr) / math.sqrt(dh)
    got = np.asarray(masked_attention(s, jnp.asarray(v), jnp.asarray(allowed)))
    np.testing.assert_allclose(got, ref, atol=2e-5)
    # RoPE scores depend only on the offset: shifting all positions leaves them unchanged
    q2, k2 = rope_rotate(jnp.asarray(q), jnp.asarray(pos + 13), base), rope_rotate(jnp.asarray(k), jnp.asarray(pos + 13), base)
    np.testing.assert_allclose(np.asarray(jnp.einsum("bqhd,bkhd->bhqk", q2, k2)) / math.sqrt(dh), np.asarray(s), atol=1e-4)


def test_pope_scores_match_complex_formula() -> None:
    B, L, H, dh, base = 2, 6, 2, 4, 50.0
    q, k = _rand((B, L, H, dh), 3), _rand((B, L, H, dh), 4)
    delta = np.random.default_rng(5).uniform(-2 * math.pi, 0, (H, dh)).astype(np.float32)
    pos = np.tile(np.arange(L), (B, 1))
    got = np.asarray(pope_scores(jnp.asarray(q), jnp.asarray(k), jnp.asarray(pos), jnp.asarray(pos), base,
                                 jnp.asarray(delta)))
    sp = lambda x: np.log1p(np.exp(x))  # noqa: E731
    ref = np.zeros((B, H, L, L))
    for b in range(B):
        for h in range(H):
            for i in range(L):
                for j in range(L):
                    theta = base ** (-np.arange(dh) / dh)
                    zq = sp(q[b, i, h]) * np.exp(1j * i * theta)
                    zk = sp(k[b, j, h]) * np.exp(1j * (j * theta + delta[h]))
                    ref[b, h, i, j] = np.real(np.sum(np.conj(zq) * zk)) / math.sqrt(dh)
    np.testing.assert_allclose(got, ref, atol=2e-5)


def test_pope_self_attention_module_matches_direct() -> None:
    d, H, L = 8, 2, 5
    att = SelfAttention(d, H, "pope", 100.0, True, jax.random.PRNGKey(0))
    x = _rand((1, L, d), 6)
    visible = np.array([[True, False, True, True, False]])
    allowed = np.asarray(attention_mask(jnp.asarray(visible), False)) & visible[:, :, None]
    got = np.asarray(att(jnp.asarray(x), jnp.arange(L)[None], jnp.asarray(allowed)))
    wq, wk, wv, wo = (np.asarray(w.weight) for w in (att.wq, att.wk, att.wv, att.wo))
    q, k, v = (x @ wq).reshape(1, L, H, 4), (x @ wk).reshape(1, L, H, 4), (x @ wv).reshape(1, L, H, 4)
    delta = np.asarray(att.pope_delta)
    theta = 100.0 ** (-np.arange(4) / 4)
    sp = lambda z: np.log1p(np.exp(z))  # noqa: E731

    def score(b, h, i, j):
        return np.sum(sp(q[b, i, h]) * sp(k[b, j, h]) * np.cos((j - i) * theta + delta[h])) / 2.0

    ref = _direct_attention(q, k, v, allowed, score).reshape(1, L, d) @ wo
    np.testing.assert_allclose(got, ref, atol=2e-5)
    assert np.all(got[0, ~visible[0]] == 0), "masked query positions must output exactly 0"


def test_encoder_masking_isolates_masked_tokens() -> None:
    """Changing a masked token (or a pad token) never changes the encoder's visible outputs or pooled vector."""
    cfg = TextModelConfig(vocab_size=50, max_seq_len=12, d_model=16, n_heads=2, n_layers=2, predictor_n_layers=1,
                          decoder_n_layers=0)
    model = TextTransformer(cfg, jax.random.PRNGKey(1))
    tok = np.array([[5, 6, 7, 8, 9, 10, 11, 0, 0, 0, 0, 0]], np.int32)
    vis = tok != 0
    vis[0, 2] = False
    a = model.encode(jnp.asarray(tok), jnp.asarray(vis))
    tok2 = tok.copy()
    tok2[0, 2] = 33
    tok2[0, 9] = 44
    b = model.encode(jnp.asarray(tok2), jnp.asarray(vis))
    np.testing.assert_array_equal(np.asarray(a["pooled"]), np.asarray(b["pooled"]))
    np.testing.assert_array_equal(np.asarray(a["post"][0, vis[0]]), np.asarray(b["post"][0, vis[0]]))
    # pooled = post-final-norm representation at the last visible position
    np.testing.assert_allclose(np.asarray(a["pooled"][0]), np.asarray(a["post"][0, 6]), atol=1e-6)


def test_causal_encoder_ignores_future_tokens() -> None:
    cfg = TextModelConfig(vocab_size=50, max_seq_len=8, d_model=16, n_heads=2, n_layers=1, predictor_n_layers=0,
                          decoder_n_layers=0, causal=True, attn_type="rope")
    model = TextTransformer(cfg, jax.random.PRNGKey(2))
    t1 = np.array([[5, 6, 7, 8, 9, 10, 11, 12]], np.int32)
    t2 = t1.copy()
    t2[0, 5:] = [20, 21, 22]
    vis = np.ones_like(t1, bool)
    a = model.encode(jnp.asarray(t1), jnp.asarray(vis))["post"]
    b = model.encode(jnp.asarray(t2), jnp.asarray(vis))["post"]
    np.testing.assert_allclose(np.asarray(a[0, :5]), np.asarray(b[0, :5]), atol=1e-6)
    assert not np.allclose(np.asarray(a[0, 5:]), np.asarray(b[0, 5:]))


def test_drop_path_linear_schedule_and_optional_parts() -> None:
    cfg = TextModelConfig(vocab_size=30, max_seq_len=8, d_model=8, n_heads=2, n_layers=5, drop_path_rate=0.2,
                          predictor_n_layers=0, decoder_n_layers=0)
    model = TextTransformer(cfg, jax.random.PRNGKey(0))
    np.testing.assert_allclose([b.drop_rate for b in model.encoder], [0.0, 0.05, 0.1, 0.15, 0.2])
    assert model.predictor == [] and model.decoder == [] and model.mask_pos_emb is None
    logits = model.embed.unembed(model.embed(jnp.arange(3)))
    assert logits.shape == (3, 30) and logits.dtype == jnp.float32
