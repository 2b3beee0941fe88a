"""SIGReg and every LeJEPA loss on hand-made cases; total_loss normalization and skipped zero-weight terms."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from confluence.errors import ConfluenceError
from confluence.textmodel import losses as L
from confluence.textmodel.config import load_text_config
from confluence.textmodel.model import TextTransformer
from confluence.textmodel.objective import compute_losses, host_batch
from confluence.textmodel.views import make_views
from confluence.toolkit.layers import RMSNorm

ROOT = Path(__file__).resolve().parents[1]


def _gauss(n: int, k: int, seed: int = 0) -> jnp.ndarray:
    return jnp.asarray(np.random.default_rng(seed).normal(size=(n, k)).astype(np.float32))


def test_sigreg_small_for_gaussian_large_for_collapse_and_scale() -> None:
    key = L.sigreg_key(0, 3)
    z = _gauss(1024, 32)
    g = float(L.sigreg(z, key, num_slices=128))
    collapsed = float(L.sigreg(jnp.tile(z[:1], (1024, 1)), key, num_slices=128))
    low_rank = float(L.sigreg(z.at[:, 1:].set(0.0), key, num_slices=128))
    scaled = float(L.sigreg(3.0 * z, key, num_slices=128))
    shifted = float(L.sigreg(z + 1.0, key, num_slices=128))
    # expectation under the null is about 1.06 whatever N (statistic x N); alternatives grow like N
    assert g < 2.5, g
    for name, v in {"collapsed": collapsed, "low_rank": low_rank, "scaled": scaled, "shifted": shifted}.items():
        assert v > 20 * g, (name, v, g)


def test_sigreg_by_hand_single_direction() -> None:
    """One sample at 0 in 1-D: phi(t) = 1, statistic = N * integral of (1 - e^{-t^2/2})^2 e^{-t^2/2}."""
    z = jnp.zeros((1, 1))
    got = float(L.sigreg(z, jax.random.PRNGKey(0), num_slices=4, num_knots=2001, t_max=8.0))
    t = np.linspace(-8, 8, 200001)
    ref = np.trapezoid((1 - np.exp(-t**2 / 2)) ** 2 * np.exp(-t**2 / 2), t)
    assert abs(got - ref) < 1e-3, (got, ref)


def test_sigreg_directions_follow_seed_and_step() -> None:
    z = _gauss(64, 8, 1)
    a = L.sigreg(z, L.sigreg_key(0, 5), num_slices=16)
    b = L.sigreg(z, L.sigreg_key(0, 5), num_slices=16)
    c = L.sigreg(z, L.sigreg_key(0, 6), num_slices=16)
    assert float(a) == float(b) and float(a) != float(c)
    d = L.sigreg_directions(L.sigreg_key(0, 5), 8, 16)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(d), axis=0), 1.0, atol=1e-6)


def test_sigreg_weights_drop_rows() -> None:
    z = _gauss(64, 8, 2)
    key = L.sigreg_key(1, 1)
    w = np.ones(64, np.float32)
    w[40:] = 0
    full = L.sigreg(z[:40], key, num_slices=16)
    weighted = L.sigreg(z, key, num_slices=16, weights=jnp.asarray(w))
    np.testing.assert_allclose(float(full), float(weighted), rtol=1e-5)


def test_sigreg_identical_on_one_and_four_devices() -> None:
    code = textwrap.dedent("""
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import Mesh, PartitionSpec as P
        from confluence.textmodel.losses import sigreg, sigreg_key
        assert jax.device_count() == 4, jax.devices()
        z = jnp.asarray(np.random.default_rng(0).normal(size=(64, 3, 16)).astype(np.float32) * 1.3)
        key = sigreg_key(7, 11)
        one = float(sigreg(z, key, num_slices=64))
        mesh = Mesh(np.array(jax.devices()), ("data",))
        f = jax.shard_map(lambda x: sigreg(x, key, num_slices=64, axis_name="data"), mesh=mesh,
                          in_specs=P("data"), out_specs=P(), check_vma=False)
        four = float(jax.jit(f)(z))
        print(one, four)
        assert abs(one - four) <= 1e-5 * max(1.0, abs(one)), (one, four)
    """)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu",
               PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def _ident(x):
    return x


def test_seq_rec_loss_hand_made() -> None:
    # two samples, 2 global + 1 local view, D = 2; identity "final norm" to check the arithmetic
    pre = jnp.asarray([[[1.0, 0.0], [3.0, 0.0], [0.0, 2.0]], [[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]])
    # sample 0 center (2, 0): MSE (mean over D) per view = [1/2, 1/2, (4 + 4) / 2]; sample 1: all 0
    assert float(L.seq_rec_loss(pre, 2, _ident, "mse")) == pytest.approx((0.5 + 0.5 + 4 + 0 + 0 + 0) / 6)
    # cosine: sample 0 views 0, 1 aligned with the center (0), view 2 orthogonal (1)
    assert float(L.seq_rec_loss(pre, 2, _ident, "cosine")) == pytest.approx(1 / 6, abs=1e-6)
    # with the real RMSNorm the center is normalized after averaging the pre-norm vectors
    norm = RMSNorm(2)
    center = np.array([2.0, 0.0]) / np.sqrt(2.0)
    views = np.array([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0]])
    views = views / np.sqrt((views**2).mean(-1, keepdims=True))
    exp0 = ((views - center) ** 2).mean(-1)
    got = float(L.seq_rec_loss(pre[:1], 2, norm, "mse"))
    assert got == pytest.approx(exp0.mean(), rel=1e-4)


def test_span_rec_loss_hand_made() -> None:
    # one view, L = 4, D = 1 (identity norms): spans {0,1} and {3}
    span_id = jnp.asarray([[0, 0, -1, 1]])
    target = jnp.asarray([[[1.0], [3.0], [9.0], [5.0]]])
    pred = jnp.asarray([[[2.0], [2.0], [0.0], [4.0]]])
    # span means: target (2, 5), pred (2, 4): MSE (0, 1) -> 0.5
    assert float(L.span_rec_loss(target, pred, span_id, _ident, _ident, 2)) == pytest.approx(0.5)
    # token-wise: span 0 tokens (1, 1) -> 1; span 1 -> 1; mean 1
    assert float(L.span_rec_loss(target, pred, span_id, _ident, _ident, 2, tokenwise=True)) == pytest.approx(1.0)
    # a view without spans does not count
    span2 = jnp.concatenate([span_id, -jnp.ones((1, 4), jnp.int32)])
    t2, p2 = jnp.concatenate([target, target]), jnp.concatenate([pred, target])
    assert float(L.span_rec_loss(t2, p2, span2, _ident, _ident, 2)) == pytest.approx(0.5)


def test_cross_entropy_losses_hand_made() -> None:
    logits = jnp.log(jnp.asarray([[[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]]]))
    targets = jnp.asarray([[0, 1]])
    both = L.decoder_loss(logits, targets, jnp.asarray([[True, True]]))
    assert float(both) == pytest.approx((-np.log(0.7) - np.log(0.1)) / 2, rel=1e-5)
    first = L.decoder_loss(logits, targets, jnp.asarray([[True, False]]))
    assert float(first) == pytest.approx(-np.log(0.7), rel=1e-5)
    m = L.encoder_mlm_loss(logits, targets, jnp.asarray([[True, True]]))
    assert float(m["top1"]) == pytest.approx(0.5) and float(m["top5"]) == pytest.approx(1.0)
    assert float(m["loss"]) == pytest.approx(float(both), rel=1e-6)


def test_total_loss_normalizes_and_skips() -> None:
    w = L.LossWeights(seq=2.0, span=0.0, decoder=1.0, mlm=1.0)
    assert w.fractions() == {"seq": 0.5, "decoder": 0.25, "mlm": 0.25}
    parts = {"seq": jnp.asarray(1.0), "decoder": jnp.asarray(2.0), "mlm": jnp.asarray(4.0)}
    assert float(L.total_loss(parts, w)) == pytest.approx(0.5 + 0.5 + 1.0)
    assert float(L.lejepa_mix(jnp.asarray(2.0), jnp.asarray(10.0), 0.25)) == pytest.approx(4.0)
    with pytest.raises(ConfluenceError, match="positive"):
        L.LossWeights(0, 0, 0, 0).fractions()
    with pytest.raises(ConfluenceError, match="not computed"):
        L.total_loss({"seq": jnp.asarray(1.0)}, w)


def _batch(cfg, seed=0):
    rng = np.random.default_rng(seed)
    B, Lq = 4, cfg.model.max_seq_len
    tok = np.zeros((B, Lq), np.int32)
    for i, n in enumerate([Lq, 10, 7, 12]):
        tok[i, :n] = rng.integers(5, cfg.model.vocab_size, n)
    return {k: jnp.asarray(v) for k, v in host_batch(tok, make_views(tok, 0, cfg.views, seed)).items()}


@pytest.mark.parametrize("weights,mask_token", [((1, 0, 0, 0), False), ((0, 1, 0, 0), False),
                                                ((0, 0, 1, 0), False), ((1, 1, 1, 1), True)])
def test_compute_losses_skips_zero_weights(weights, mask_token) -> None:
    cfg = load_text_config("text-tiny", 40, 16, {"model": {"mask_token_input": mask_token},
                                                  "weights": dict(zip(("seq", "span", "decoder", "mlm"), weights, strict=True))})
    model = TextTransformer(cfg.model, jax.random.PRNGKey(0))
    total, m = compute_losses(model, _batch(cfg), cfg, pad_id=0, mask_id=4, bos_id=2, eos_id=3,
                              sigreg_key=L.sigreg_key(0, 0), key=None)
    present = {k for k, w in zip(("seq", "span", "decoder", "mlm"), weights, strict=True) if w}
    assert ("seq_rec" in m) == ("seq" in present)
    assert ("span_rec" in m) == ("span" in present)
    assert ("decoder" in m) == ("decoder" in present)
    assert ("mlm_top1" in m) == ("mlm" in present)
    expect = sum(m[k + "_lejepa" if k in ("seq", "span") else k] for k in present) / len(present)
    assert float(total) == pytest.approx(float(expect), rel=1e-5)
    assert np.isfinite(float(total))


def test_config_rejects_losses_without_their_module() -> None:
    with pytest.raises(ConfluenceError, match="'weights.span'.*predictor"):
        load_text_config("text-tiny", 40, 16, {"model": {"predictor_n_layers": 0, "decoder_n_layers": 0}})
    with pytest.raises(ConfluenceError, match="decoder_n_layers"):
        load_text_config("text-tiny", 40, 16, {"model": {"decoder_n_layers": 0}})
    with pytest.raises(ConfluenceError, match="'weights.mlm'.*mask_token_input"):
        load_text_config("text-tiny", 40, 16, {"weights": {"mlm": 1.0}})
    with pytest.raises(ConfluenceError, match="'weights.seq'.*at least one"):
        load_text_config("text-tiny", 40, 16, {"weights": {"seq": 0, "span": 0, "decoder": 0}})
    with pytest.raises(ConfluenceError, match=r"neither a recipe \(text-base, text-smoke, text-tiny\)"):
        load_text_config("small", 40, 16)  # a relational recipe is not a text recipe
