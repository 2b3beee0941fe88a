"""Optimizer of seed 000: Muon for the 2-D core matrices, AdamW for the rest, one synchronized schedule,
global-norm clipping before both.

Muon here follows the seed literally: `M <- beta M + (1 - beta) G; W <- W - lr * NS5(M)` with beta = 0.95 and five
quintic Newton-Schulz steps (coefficients 3.4445, -4.7750, 2.0315 after Frobenius normalisation). optax's
`contrib.muon` differs in ways that change the update: Nesterov momentum by default, bias correction of the
moment, and AdamW on non-matrix leaves inside the same transform; so the small transform below is used instead.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

MUON, ADAMW_DECAY, ADAMW_NO_DECAY = "muon", "adamw_decay", "adamw_no_decay"

# Leaf names of the 2-D core matrices (attention projections, SDPA gates, SwiGLU) inside `blocks`.
CORE_MATRICES = frozenset({"w_q", "w_k", "w_v", "w_o", "w_gate", "w_up", "w_down"})
# AdamW leaves that get weight decay: weights of encoders / heads and the learned embeddings.
DECAYED = frozenset({"weight", "boolean_encoder", "identifier_emb", "null_emb", "mask_emb"})


class OptimConfig(NamedTuple):
    lr_muon: float = 0.02
    lr_adamw: float = 3e-4
    muon_beta: float = 0.95
    ns_steps: int = 5
    adam_b1: float = 0.9
    adam_b2: float = 0.95
    adam_eps: float = 1e-8
    weight_decay: float = 0.1
    clip_norm: float = 1.0
    warmup_steps: int = 2000
    total_steps: int = 100_000
    final_lr_fraction: float = 0.1


def lr_multiplier(t: jax.Array | int, warmup: int, total: int, final: float = 0.1) -> jax.Array:
    """warmup(t) * decay(t) with t the 1-based index of the update: linear warmup to 1 at t = warmup, then cosine
    from 1 to `final` at t = total (held at `final` after). The decay factor is 1 during warmup."""
    t = jnp.asarray(t, jnp.float32)
    warm = jnp.minimum(1.0, t / max(warmup, 1))
    span = max(total - warmup, 1)
    progress = jnp.clip((t - warmup) / span, 0.0, 1.0)
    decay = final + (1.0 - final) * 0.5 * (1.0 + jnp.cos(math.pi * progress))
    return warm * decay


def make_schedule(peak: float, cfg: OptimConfig) -> optax.Schedule:
    """optax schedule (its argument is the 0-based update count) for one optimizer's peak learning rate."""
    return lambda count: peak * lr_multiplier(count + 1, cfg.warmup_steps, cfg.total_steps, cfg.final_lr_fraction)


def newton_schulz5(g: jax.Array, steps: int = 5, eps: float = 1e-7) -> jax.Array:
    """Approximate orthogonalisation U V^T of a 2-D matrix by quintic Newton-Schulz iterations (FP32)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.astype(jnp.float32)
    transposed = x.shape[0] > x.shape[1]
    if transposed:
        x = x.T
    x = x / (jnp.linalg.norm(x) + eps)
    for _ in range(steps):
        xxt = x @ x.T
        x = a * x + (b * xxt + c * xxt @ xxt) @ x
    return x.T if transposed else x


class MuonState(NamedTuple):
    momentum: optax.Updates


def scale_by_seed_muon(beta: float = 0.95, ns_steps: int = 5) -> optax.GradientTransformation:
    """M <- beta M + (1 - beta) G; update = NS5(M). No Nesterov, no bias correction, no shape scaling."""

    def init(params):
        return MuonState(jax.tree.map(lambda p: jnp.zeros_like(p, jnp.float32), params))

    def update(grads, state, params=None):
        del params
        mom = jax.tree.map(lambda m, g: beta * m + (1.0 - beta) * g.astype(jnp.float32), state.momentum, grads)
        upd = jax.tree.map(lambda m: newton_schulz5(m, ns_steps), mom)
        return upd, MuonState(mom)

    return optax.GradientTransformation(init, update)


def param_labels(params) -> object:
    """Pytree of labels (muon / adamw_decay / adamw_no_decay) with the structure of `params`."""

    def label(path, leaf) -> str:
        names = [getattr(k, "name", getattr(k, "key", None)) for k in path]
        names = [n for n in names if isinstance(n, str)]
        leaf_name = names[-1] if names else ""
        if "blocks" in names and leaf_name in CORE_MATRICES and leaf.ndim == 2:
            return MUON
        if leaf_name in DECAYED:
            return ADAMW_DECAY
        return ADAMW_NO_DECAY

    return jax.tree_util.tree_map_with_path(label, params)


def make_optimizer(params, cfg: OptimConfig) -> optax.GradientTransformation:
    """clip_by_global_norm -> {Muon on core matrices, AdamW (with / without decay) on the rest}."""
    muon = optax.chain(
        scale_by_seed_muon(cfg.muon_beta, cfg.ns_steps),
        optax.scale_by_learning_rate(make_schedule(cfg.lr_muon, cfg)),
    )

    def adamw(wd: float) -> optax.GradientTransformation:
        return optax.adamw(make_schedule(cfg.lr_adamw, cfg), b1=cfg.adam_b1, b2=cfg.adam_b2, eps=cfg.adam_eps,
                           weight_decay=wd)

    labels = param_labels(params)
    return optax.chain(
        optax.clip_by_global_norm(cfg.clip_norm),
        optax.multi_transform(
            {MUON: muon, ADAMW_DECAY: adamw(cfg.weight_decay), ADAMW_NO_DECAY: adamw(0.0)},
            lambda _: labels,  # a callable: the label tree is an (itself callable) eqx.Module
        ),
    )


def trainable(model) -> object:
    """The float array leaves of a model (what the optimizer updates)."""
    return eqx.filter(model, eqx.is_inexact_array)
