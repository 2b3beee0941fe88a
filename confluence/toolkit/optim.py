"""The optimizer both models train with: Muon for the 2-D core matrices, AdamW for the rest, one synchronized
schedule, global-norm clipping before both (seed 000, "Optimizer: Muon + AdamW").

Muon follows the seed literally: `M <- beta M + (1 - beta) G; W <- W - lr * NS5(M)` with beta = 0.95 and five
quintic Newton-Schulz steps (coefficients 3.4445, -4.7750, 2.0315 after Frobenius normalisation), FP32. Options
beyond the seed, off by default: Nesterov momentum (`muon_nesterov`, the text model's choice) and decoupled
weight decay on the Muon matrices (`muon_weight_decay`). optax's `contrib.muon` is not used: it adds Nesterov
momentum and bias correction to the seed's update by default and carries AdamW inside the same transform.

Which parameter gets which rule is the model's business: it passes a tree of labels (`MUON`, `ADAMW_DECAY`,
`ADAMW_NO_DECAY`), usually made with `label_by_path`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from confluence.errors import ConfigError
from confluence.toolkit.config import one_of, positive

MUON, ADAMW_DECAY, ADAMW_NO_DECAY = "muon", "adamw_decay", "adamw_no_decay"
SCHEDULES = ("cosine", "wsd")


@dataclass(frozen=True)
class OptimConfig:
    """Optimizer and learning-rate schedule (section `optim` of a run's tree).

    The schedule spans `total_steps`, or the run's length when that is None (so changing the number of steps of a
    run rescales it); the warmup is the larger of `warmup_steps` and `warmup_fraction` of the span. `"cosine"` (seed
    000) decays from the warmup's end to the span's; `"wsd"` (warmup, stable, decay) holds the peak rate and
    decays linearly over the span's last `cooldown_fraction`, so a run can decide late where it ends: one that
    stops improving cools down from there (`cooled_down`) instead of stopping at its peak rate."""

    lr_muon: float = 0.02  # peak rate of Muon (the blocks' 2-D matrices)
    lr_adamw: float = 3e-4  # peak rate of AdamW (encoders, heads, embeddings, norms)
    muon_beta: float = 0.95  # Muon's momentum
    muon_nesterov: bool = False  # Nesterov momentum in Muon (the seed has none; the text model's option)
    ns_steps: int = 5  # Newton-Schulz iterations orthogonalising each Muon update
    adam_b1: float = 0.9  # AdamW's first-moment decay
    adam_b2: float = 0.95  # AdamW's second-moment decay
    adam_eps: float = 1e-8  # AdamW's epsilon
    weight_decay: float = 0.1  # AdamW's, on the parameters labelled ADAMW_DECAY
    muon_weight_decay: float = 0.0  # decoupled decay of the Muon matrices (the seed has none)
    clip_norm: float = 1.0  # global gradient-norm clip
    warmup_steps: int = 2000  # linear warmup, at least this many steps
    warmup_fraction: float = 0.0  # ... or this fraction of the schedule's span, whichever is longer
    total_steps: int | None = None  # None: the run's number of steps
    final_lr_fraction: float = 0.1  # the decay ends at this fraction of the peak rate
    # "cosine" (seed 000) or "wsd": the peak held, then a linear decay (a stalled run decays from there)
    schedule: Literal["cosine", "wsd"] = "cosine"
    cooldown_fraction: float = 0.2  # "wsd": the decay's share of the span
    decay_start: int | None = None  # "wsd": the decay's first step (None: from cooldown_fraction)

    def __post_init__(self) -> None:
        positive(self, "lr_muon", "lr_adamw", "ns_steps", "clip_norm", "adam_eps")
        one_of("schedule", self.schedule, SCHEDULES)
        if not 0.0 < self.cooldown_fraction < 1.0:
            raise ConfigError("cooldown_fraction", f"must be in (0, 1), got {self.cooldown_fraction}")
        if self.decay_start is not None and self.decay_start < 0:
            raise ConfigError("decay_start", f"must be >= 0 (or unset), got {self.decay_start}")
        for name in ("muon_beta", "adam_b1", "adam_b2", "final_lr_fraction", "warmup_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(name, f"must be in [0, 1], got {getattr(self, name)}")
        if self.weight_decay < 0 or self.muon_weight_decay < 0:
            raise ConfigError("weight_decay" if self.weight_decay < 0 else "muon_weight_decay", "must be >= 0")
        if self.warmup_steps < 0:
            raise ConfigError("warmup_steps", f"must be >= 0, got {self.warmup_steps}")
        if self.total_steps is not None and self.total_steps < 1:
            raise ConfigError("total_steps", f"must be >= 1 (or unset: the run's length), got {self.total_steps}")

    def for_run(self, run_steps: int) -> OptimConfig:
        """This config with the schedule resolved for a run of `run_steps` steps: `total_steps` set, the warmup in
        `warmup_steps` (at most the span) and `warmup_fraction` 0."""
        total = int(self.total_steps if self.total_steps is not None else max(run_steps, 1))
        warmup = min(max(self.warmup_steps, int(self.warmup_fraction * total + 1e-9)), total)
        start = self.decay_start
        if self.schedule == "wsd" and start is None:
            start = max(total - max(int(round(self.cooldown_fraction * total)), 1), warmup)
        return replace(self, total_steps=total, warmup_steps=warmup, warmup_fraction=0.0, decay_start=start)

    def cooled_down(self, at: int) -> OptimConfig:
        """This resolved `"wsd"` schedule decaying from step `at` instead, over `cooldown_fraction` of the
        lengthened span (`at` / (1 - fraction) steps in all), its warmup kept: the schedule of a run that stops
        improving at `at`. Steps up to `at` see the same rates as before."""
        if self.schedule != "wsd" or self.total_steps is None:
            raise ValueError("cooled_down needs a resolved \"wsd\" schedule (OptimConfig.for_run)")
        extra = max(int(round(at * self.cooldown_fraction / (1.0 - self.cooldown_fraction))), 1)
        return replace(self, total_steps=at + extra, decay_start=at)

    def multiplier(self, t: jax.Array | int) -> jax.Array:
        """The rate's multiplier at 1-based update `t` of this resolved schedule (warmup x decay)."""
        if self.total_steps is None:
            raise ValueError("multiplier needs a resolved OptimConfig (OptimConfig.for_run)")
        if self.schedule == "wsd":
            return wsd_multiplier(t, self.warmup_steps, self.decay_start or 0, self.total_steps,
                                  self.final_lr_fraction)
        return lr_multiplier(t, self.warmup_steps, self.total_steps, self.final_lr_fraction)


def lr_multiplier(t: jax.Array | int, warmup: int, total: int, final: float = 0.1) -> jax.Array:
    """warmup(t) * decay(t) with t the 1-based index of the update: linear warmup to 1 at t = warmup, then cosine
    from 1 to `final` at t = total (held at `final` after). The decay factor is 1 during warmup."""
    t = jnp.asarray(t, jnp.float32)
    warm = jnp.minimum(1.0, t / max(warmup, 1))
    span = max(total - warmup, 1)
    progress = jnp.clip((t - warmup) / span, 0.0, 1.0)
    decay = final + (1.0 - final) * 0.5 * (1.0 + jnp.cos(math.pi * progress))
    return warm * decay


def wsd_multiplier(t: jax.Array | int, warmup: int, start: int, total: int, final: float = 0.1) -> jax.Array:
    """warmup(t) * decay(t) of the "wsd" schedule: linear warmup to 1 at t = warmup, 1 until t = start, then a
    linear decay to `final` at t = total (held at `final` after)."""
    t = jnp.asarray(t, jnp.float32)
    warm = jnp.minimum(1.0, t / max(warmup, 1))
    progress = jnp.clip((t - start) / max(total - start, 1), 0.0, 1.0)
    return warm * (1.0 - (1.0 - final) * progress)


def make_schedule(peak: float, cfg: OptimConfig) -> optax.Schedule:
    """optax schedule (its argument is the 0-based update count) for one peak learning rate; `cfg` resolved by
    `OptimConfig.for_run`."""
    if cfg.total_steps is None:
        raise ValueError("make_schedule needs a resolved OptimConfig (OptimConfig.for_run)")
    return lambda count: peak * cfg.multiplier(count + 1)


def newton_schulz5(g: jax.Array, steps: int = 5, eps: float = 1e-7) -> jax.Array:
    """Approximate orthogonalisation U V^T of a 2-D matrix by quintic Newton-Schulz iterations (FP32)."""
    return newton_schulz5_batched([g], steps, eps)[0]


def _ns5_wide(x: jax.Array, steps: int, eps: float) -> jax.Array:
    """Newton-Schulz on `[..., m, n]` with m <= n, each trailing matrix normalised by its own Frobenius norm."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = x / (jnp.sqrt(jnp.sum(x * x, axis=(-2, -1), keepdims=True)) + eps)
    for _ in range(steps):
        xxt = x @ jnp.swapaxes(x, -1, -2)
        x = a * x + (b * xxt + c * xxt @ xxt) @ x
    return x


def newton_schulz5_batched(mats: list[jax.Array], steps: int = 5, eps: float = 1e-7) -> list[jax.Array]:
    """`newton_schulz5` of every matrix of `mats`, same-shaped ones (after putting the longer side last) stacked
    and iterated together: one batched matmul per step and shape instead of one per matrix (seed 000 names no
    order, and each matrix is still normalised and iterated on its own)."""
    out: list[jax.Array | None] = [None] * len(mats)
    groups: dict[tuple[int, int], list[int]] = {}
    for i, m in enumerate(mats):
        groups.setdefault((min(m.shape), max(m.shape)), []).append(i)
    for idx in groups.values():
        wide = [mats[i].astype(jnp.float32) for i in idx]
        wide = [m.T if m.shape[0] > m.shape[1] else m for m in wide]
        res = _ns5_wide(jnp.stack(wide), steps, eps)
        for j, i in enumerate(idx):
            out[i] = res[j].T if mats[i].shape[0] > mats[i].shape[1] else res[j]
    return out


class MuonState(NamedTuple):
    momentum: optax.Updates


def scale_by_muon(beta: float = 0.95, ns_steps: int = 5, nesterov: bool = False) -> optax.GradientTransformation:
    """M <- beta M + (1 - beta) G; update = NS5(M), or NS5(beta M + (1 - beta) G) with `nesterov`. No bias
    correction (NS5 normalises its input, so it would change nothing) and no shape scaling."""

    def init(params):
        return MuonState(jax.tree.map(lambda p: jnp.zeros_like(p, jnp.float32), params))

    def update(grads, state, params=None):
        del params
        mom = jax.tree.map(lambda m, g: beta * m + (1.0 - beta) * g.astype(jnp.float32), state.momentum, grads)
        if nesterov:
            look = jax.tree.map(lambda m, g: beta * m + (1.0 - beta) * g.astype(jnp.float32), mom, grads)
        else:
            look = mom
        leaves, treedef = jax.tree.flatten(look)
        return jax.tree.unflatten(treedef, newton_schulz5_batched(leaves, ns_steps)), MuonState(mom)

    return optax.GradientTransformation(init, update)


def label_by_path(params, rule: Callable[[list[str], jax.Array], str]) -> object:
    """A tree of optimizer labels shaped like `params`: `rule(names along the leaf's path, leaf)`."""

    def label(path, leaf) -> str:
        names = [getattr(k, "name", getattr(k, "key", None)) for k in path]
        return rule([n for n in names if isinstance(n, str)], leaf)

    return jax.tree_util.tree_map_with_path(label, params)


def make_optimizer(labels, cfg: OptimConfig) -> optax.GradientTransformation:
    """clip_by_global_norm -> {Muon (+ decoupled decay) on MUON leaves, AdamW with / without decay on the rest};
    `labels` from `label_by_path`, `cfg` resolved by `OptimConfig.for_run`."""
    muon_parts = [scale_by_muon(cfg.muon_beta, cfg.ns_steps, cfg.muon_nesterov)]
    if cfg.muon_weight_decay > 0:
        muon_parts.append(optax.add_decayed_weights(cfg.muon_weight_decay))
    muon = optax.chain(*muon_parts, optax.scale_by_learning_rate(make_schedule(cfg.lr_muon, cfg)))

    def adamw(wd: float) -> optax.GradientTransformation:
        return optax.adamw(make_schedule(cfg.lr_adamw, cfg), b1=cfg.adam_b1, b2=cfg.adam_b2, eps=cfg.adam_eps,
                           weight_decay=wd)

    return optax.chain(
        optax.clip_by_global_norm(cfg.clip_norm),
        optax.multi_transform(
            {MUON: muon, ADAMW_DECAY: adamw(cfg.weight_decay), ADAMW_NO_DECAY: adamw(0.0)},
            lambda _: labels,  # a callable: the label tree may itself be a (callable) eqx.Module
        ),
    )


def trainable(model) -> object:
    """The float array leaves of a model (what the optimizer updates)."""
    return eqx.filter(model, eqx.is_inexact_array)
