"""Optimizer split (which parameters Muon updates), the seed's Muon update, AdamW decay, schedule values."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from confluence.errors import ConfigError
from confluence.toolkit.optim import (
    ADAMW_DECAY,
    ADAMW_NO_DECAY,
    MUON,
    OptimConfig,
    lr_multiplier,
    make_optimizer,
    make_schedule,
    newton_schulz5,
    newton_schulz5_batched,
    scale_by_muon,
    trainable,
)
from confluence.training.step import param_labels
from tests.fixtures.model import tiny_model


def _labelled():
    params = trainable(tiny_model())
    labels = param_labels(params)
    flat = jax.tree_util.tree_flatten_with_path(labels)[0]
    return params, labels, {jax.tree_util.keystr(p): lab for p, lab in flat}


def test_muon_updates_exactly_the_core_matrices():
    _, _, by_path = _labelled()
    muon = sorted(p for p, lab in by_path.items() if lab == MUON)
    expected = sorted(f".blocks[0].{sub}.{w}" for sub in ("attn_out", "attn_in", "attn_col")
                      for w in ("w_q", "w_k", "w_v", "w_o", "w_gate")) + sorted(
        f".blocks[0].ffn.{w}.weight" for w in ("w_gate", "w_up", "w_down"))
    assert muon == sorted(expected)
    assert by_path[".encoder.column_name_encoder.weight"] == ADAMW_DECAY
    assert by_path[".encoder.categorical_encoder.weight"] == ADAMW_DECAY
    assert by_path[".encoder.null_emb"] == ADAMW_DECAY and by_path[".encoder.boolean_encoder"] == ADAMW_DECAY
    assert by_path[".heads.categorical_decoder.weight"] == ADAMW_DECAY
    for p in (".encoder.column_name_encoder.bias", ".heads.null_head.bias", ".blocks[0].norm_out.gamma",
              ".final_norm.gamma", ".h0_norm.gamma", ".blocks[0].attn_in.temperature"):
        assert by_path[p] == ADAMW_NO_DECAY, p


def _np_ns5(g, steps=5):
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.astype(np.float64)
    tr = x.shape[0] > x.shape[1]
    x = x.T if tr else x
    x = x / (np.linalg.norm(x) + 1e-7)
    for _ in range(steps):
        xxt = x @ x.T
        x = a * x + (b * xxt + c * xxt @ xxt) @ x
    return x.T if tr else x


def test_seed_muon_update_matches_hand_computation():
    rng = np.random.default_rng(0)
    g1, g2 = (rng.standard_normal((12, 6)).astype(np.float32) for _ in range(2))
    tx = scale_by_muon(beta=0.95, ns_steps=5)
    st = tx.init({"w": jnp.zeros((12, 6))})
    u1, st = tx.update({"w": jnp.asarray(g1)}, st)
    u2, st = tx.update({"w": jnp.asarray(g2)}, st)
    m1 = 0.05 * g1
    m2 = 0.95 * m1 + 0.05 * g2  # plain EMA, no bias correction, no Nesterov
    np.testing.assert_allclose(np.asarray(st.momentum["w"]), m2, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(u1["w"]), _np_ns5(m1), rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(np.asarray(u2["w"]), _np_ns5(m2), rtol=1e-3, atol=1e-4)
    sv = np.linalg.svd(np.asarray(newton_schulz5(jnp.asarray(g1))), compute_uv=False)
    assert 0.5 < sv.min() and sv.max() < 1.5  # approximately orthogonal


def test_split_optimizer_decay_and_untouched_groups():
    params, labels, by_path = _labelled()
    cfg = OptimConfig(lr_muon=0.02, lr_adamw=1e-2, warmup_steps=1, total_steps=10)
    opt = make_optimizer(labels, cfg)
    state = opt.init(params)
    zeros = jax.tree.map(jnp.zeros_like, params)
    upd, state = opt.update(zeros, state, params)
    new = optax.apply_updates(params, upd)
    lr = 1e-2 * float(lr_multiplier(1, 1, 10))
    # Zero gradient: AdamW-with-decay leaves shrink by lr * wd; no-decay and Muon leaves do not move.
    w0 = np.asarray(params.encoder.text_encoder.weight)
    np.testing.assert_allclose(np.asarray(new.encoder.text_encoder.weight), w0 * (1 - lr * 0.1), rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(new.encoder.text_encoder.bias), np.asarray(params.encoder.text_encoder.bias))
    np.testing.assert_array_equal(np.asarray(new.blocks[0].attn_out.w_q), np.asarray(params.blocks[0].attn_out.w_q))
    np.testing.assert_array_equal(np.asarray(new.blocks[0].attn_out.temperature),
                                  np.asarray(params.blocks[0].attn_out.temperature))
    # A gradient on a core matrix moves it by lr_muon * NS5(0.05 * g): Muon, not Adam.
    g = jax.tree.map(jnp.zeros_like, params)
    gq = np.random.default_rng(1).standard_normal(params.blocks[0].attn_out.w_q.shape).astype(np.float32) * 1e-3
    g = jax.tree_util.tree_map_with_path(
        lambda p, x: jnp.asarray(gq) if jax.tree_util.keystr(p) == ".blocks[0].attn_out.w_q" else x, g)
    state = opt.init(params)
    upd, _ = opt.update(g, state, params)
    lr_m = 0.02 * float(lr_multiplier(1, 1, 10))
    np.testing.assert_allclose(np.asarray(upd.blocks[0].attn_out.w_q), -lr_m * _np_ns5(0.05 * gq), rtol=2e-3,
                               atol=1e-6)


def test_schedule_values():
    w, total = 10, 110
    assert float(lr_multiplier(1, w, total)) == pytest.approx(0.1)
    assert float(lr_multiplier(5, w, total)) == pytest.approx(0.5)
    assert float(lr_multiplier(10, w, total)) == pytest.approx(1.0)
    assert float(lr_multiplier(60, w, total)) == pytest.approx(0.1 + 0.9 * 0.5)  # half-way through the cosine
    t = 35
    assert float(lr_multiplier(t, w, total)) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 25 / 100)),
                                                              rel=1e-6)
    assert float(lr_multiplier(110, w, total)) == pytest.approx(0.1)
    assert float(lr_multiplier(500, w, total)) == pytest.approx(0.1)  # held at 10 % after the end


def test_wsd_holds_the_peak_then_decays_linearly_and_a_cooldown_keeps_the_past():
    cfg = OptimConfig(schedule="wsd", warmup_steps=10, cooldown_fraction=0.2).for_run(110)
    assert (cfg.total_steps, cfg.warmup_steps, cfg.decay_start) == (110, 10, 88)
    assert float(cfg.multiplier(5)) == pytest.approx(0.5)
    assert float(cfg.multiplier(10)) == float(cfg.multiplier(88)) == pytest.approx(1.0)  # held at the peak
    assert float(cfg.multiplier(99)) == pytest.approx(1.0 - 0.9 * 11 / 22)  # half-way down the linear decay
    assert float(cfg.multiplier(110)) == float(cfg.multiplier(500)) == pytest.approx(0.1)
    cool = cfg.cooled_down(40)  # a run that stops improving at step 40 decays from there over a fifth of 50 steps
    assert (cool.total_steps, cool.decay_start, cool.warmup_steps) == (50, 40, 10)
    assert [float(cool.multiplier(t)) for t in range(1, 41)] == [float(cfg.multiplier(t)) for t in range(1, 41)]
    assert float(cool.multiplier(45)) == pytest.approx(0.55) and float(cool.multiplier(50)) == pytest.approx(0.1)
    assert cool.for_run(110) == cool  # resolved once: a later for_run (a resume) keeps it
    # the optimizer follows the same schedule: its first update's size is the multiplier's
    assert float(make_schedule(2.0, cool)(44)) == pytest.approx(2.0 * 0.55)
    with pytest.raises(ValueError, match="wsd"):
        OptimConfig().for_run(100).cooled_down(50)
    with pytest.raises(ConfigError, match="schedule"):
        OptimConfig(schedule="linear")
    with pytest.raises(ConfigError, match="cooldown_fraction"):
        OptimConfig(cooldown_fraction=1.0)


def test_nesterov_muon_looks_one_step_ahead():
    """`muon_nesterov` (the text model's choice): NS5(beta M_t + (1 - beta) G_t) with M_t the updated momentum."""
    rng = np.random.default_rng(3)
    g1, g2 = (rng.standard_normal((5, 9)).astype(np.float32) for _ in range(2))
    tx = scale_by_muon(beta=0.9, ns_steps=5, nesterov=True)
    st = tx.init({"w": jnp.zeros((5, 9))})
    _, st = tx.update({"w": jnp.asarray(g1)}, st)
    u2, st = tx.update({"w": jnp.asarray(g2)}, st)
    m2 = 0.9 * (0.1 * g1) + 0.1 * g2
    np.testing.assert_allclose(np.asarray(st.momentum["w"]), m2, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(u2["w"]), _np_ns5(0.9 * m2 + 0.1 * g2), rtol=1e-3, atol=1e-4)


def test_muon_weight_decay_is_decoupled_and_off_by_default():
    params = {"w": jnp.ones((4, 4))}
    labels = {"w": MUON}
    zeros = {"w": jnp.zeros((4, 4))}
    plain = OptimConfig(warmup_steps=1, total_steps=10)
    upd, _ = make_optimizer(labels, plain).update(zeros, make_optimizer(labels, plain).init(params), params)
    np.testing.assert_array_equal(np.asarray(upd["w"]), 0.0)  # the seed: no decay on Muon matrices
    decayed = OptimConfig(warmup_steps=1, total_steps=10, muon_weight_decay=0.5)
    opt = make_optimizer(labels, decayed)
    upd, _ = opt.update(zeros, opt.init(params), params)
    lr = 0.02 * float(lr_multiplier(1, 1, 10))
    np.testing.assert_allclose(np.asarray(upd["w"]), -lr * 0.5, rtol=1e-5)


def test_an_unresolved_schedule_is_refused():
    with pytest.raises(ValueError, match="for_run"):
        make_optimizer({"w": MUON}, OptimConfig())


def test_batched_newton_schulz_equals_the_per_matrix_update():
    # same-shaped matrices (and their transposes) are stacked and iterated together; a lone shape on its own
    rng = np.random.default_rng(7)
    shapes = [(16, 48), (16, 48), (48, 16), (32, 32), (8, 24), (16, 48)]
    mats = [jnp.asarray(rng.normal(size=s), jnp.float32) for s in shapes]
    batched = newton_schulz5_batched(mats)
    for m, got in zip(mats, batched, strict=True):
        want = np.asarray(newton_schulz5(m))
        assert got.shape == m.shape
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


def test_muon_update_is_the_per_matrix_newton_schulz_of_the_momentum():
    rng = np.random.default_rng(3)
    params = {"a": jnp.zeros((16, 48)), "b": jnp.zeros((48, 16)), "c": jnp.zeros((16, 48))}
    grads = {k: jnp.asarray(rng.normal(size=v.shape), jnp.float32) for k, v in params.items()}
    tx = scale_by_muon(beta=0.95)
    updates, _ = tx.update(grads, tx.init(params), params)
    for k, g in grads.items():
        want = np.asarray(newton_schulz5(0.05 * g))
        np.testing.assert_allclose(np.asarray(updates[k]), want, rtol=1e-5, atol=1e-6)
